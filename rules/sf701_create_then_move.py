from __future__ import annotations

import re

import libcst as cst

from speedfix.engine.findings import Applicability, LossCheck, Severity, replace
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import append_args, keyword_arg, string_literal
from speedfix.model.index import CallSite
from speedfix.model.patterns import is_dtype
from speedfix.syntax.names import dotted_name

_FACTORIES = frozenset(
    f"torch.{name}" for name in ("zeros", "ones", "empty", "full", "arange", "eye", "linspace", "logspace", "tensor")
)
# Same values on any device only for the factories above: CPU and CUDA random generators differ.
_RANDOM = frozenset(f"torch.{name}" for name in ("rand", "randn", "randint", "randperm", "normal"))
_KEEP_AS_IS = frozenset({"device", "requires_grad", "pin_memory", "out"})
_DEVICE_NAME = re.compile(r"device|^dev$|_dev$|gpu|rank", re.IGNORECASE)


class CreateThenMove(Rule):
    """
    ## What it does
    Finds tensors created on the CPU and moved straight to the GPU, `torch.zeros(...).cuda()`
    or `torch.ones(...).to(device)`, where it runs on every step: in the training loop, in a
    function it calls, or in a module's `forward`.

    ## Why is this bad?
    The tensor is allocated and filled on the CPU, then copied to the GPU: one extra allocation,
    one host-to-device copy and a synchronisation point per call, where `device=` makes it on the
    GPU directly. For `torch.tensor(data)` the data still has to travel, but the CPU tensor in
    between goes away.

    ## Example
    ```python
    def forward(self, x):
        h0 = torch.zeros(self.num_layers, x.size(0), self.hidden).to(x.device)
    ```

    ## Use instead
    ```python
    def forward(self, x):
        h0 = torch.zeros(self.num_layers, x.size(0), self.hidden, device=x.device)
    ```

    ## Fix safety
    Safe for the deterministic factories (`zeros`, `ones`, `empty`, `full`, `arange`, `eye`,
    `linspace`, `logspace`, `tensor`): the values are the same on any device. Random factories
    (`rand`, `randn`, `randint`, `randperm`, `normal`) are reported without a fix: the CUDA
    generator gives different numbers than the CPU one, so results would change. A factory that
    already names a device or asks for `requires_grad=True` (moving it makes a non-leaf copy,
    creating it on the device a leaf), and a move that also changes the dtype, are left alone.

    ## Impact
    Medium: the tensor is made on every step and copied from pageable memory, a blocking copy.
    Nothing moves it.

    ## Measured effect
    Small per call (one allocation and copy); it adds up in `forward` and per-step code. PyTorch's
    tuning guide: "create tensors directly on the target device"; the profiler's pattern matcher
    flags the same shape as `ExtraCUDACopyPattern`.
    Sources: https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html,
    https://github.com/pytorch/pytorch/blob/main/torch/profiler/_pattern_matcher.py
    """

    impact = "medium"
    code = "SF701"
    name = "create-then-move"
    summary = "Tensor created on the CPU and moved to the GPU (`torch.zeros(...).cuda()`)"
    severity = Severity.INFO
    requires = (b".to(", b".cuda(")
    fix_applicability = Applicability.SAFE
    loss_check = LossCheck.EXACT
    fix_title = "Create the tensor on the device: `device=`"
    gpu_only = True
    effect = "One allocation, host-to-device copy and sync less per call."

    VALID = [
        Valid(  # made on the device already
            """
            import torch
            class Net(torch.nn.Module):
                def forward(self, x):
                    h = torch.zeros(2, x.size(0), 8, device=x.device)
                    return self.rnn(x.cuda(), h)
            """
        ),
        Valid(  # a dtype conversion, not a move
            """
            import torch
            class Net(torch.nn.Module):
                def forward(self, x):
                    mask = torch.ones(4).to(torch.bool)
                    return x.cuda() * mask
            """
        ),
        Valid(  # `.cuda()` of a leaf that requires grad gives a non-leaf: not the same tensor on the device
            """
            import torch
            class Net(torch.nn.Module):
                def forward(self, x):
                    scale = torch.ones(1, requires_grad=True).cuda()
                    return x.cuda() * scale
            """
        ),
        Valid(  # once, at set-up: not worth a finding
            """
            import torch
            class_weights = torch.tensor([1.0, 2.0]).cuda()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            class Net(torch.nn.Module):
                def forward(self, x):
                    h0 = torch.zeros(self.layers, x.size(0), self.hidden).to(x.device)
                    c0 = torch.zeros(self.layers, x.size(0), self.hidden).cuda()
                    return self.lstm(x, (h0, c0))
            """,
            fixed="""
            import torch
            class Net(torch.nn.Module):
                def forward(self, x):
                    h0 = torch.zeros(self.layers, x.size(0), self.hidden, device=x.device)
                    c0 = torch.zeros(self.layers, x.size(0), self.hidden, device="cuda")
                    return self.lstm(x, (h0, c0))
            """,
            count=2,
        ),
        Invalid(  # in the training loop; labels for a GAN
            """
            import torch
            device = torch.device("cuda")
            for images, _ in loader:
                real = torch.ones(images.size(0), 1).to(device, non_blocking=True)
                loss = criterion(disc(images.to(device)), real)
                loss.backward()
                opt.step()
            """,
            fixed="""
            import torch
            device = torch.device("cuda")
            for images, _ in loader:
                real = torch.ones(images.size(0), 1, device=device)
                loss = criterion(disc(images.to(device)), real)
                loss.backward()
                opt.step()
            """,
        ),
        Invalid(  # random numbers differ between CPU and CUDA generators: no fix
            """
            import torch
            device = torch.device("cuda")
            for images, _ in loader:
                z = torch.randn(images.size(0), 64).to(device)
                loss = disc(gen(z)).mean()
                loss.backward()
                opt.step()
            """,
        ),
    ]

    def finish(self) -> None:
        ctx = self.ctx
        for site in ctx.method_calls("to"):
            self._check(site, "to")
        for site in ctx.method_calls("cuda"):
            self._check(site, "cuda")

    def _check(self, site: CallSite, method: str) -> None:
        ctx = self.ctx
        move = site.node
        factory = move.func.value if isinstance(move.func, cst.Attribute) else None
        if not isinstance(factory, cst.Call) or not self._runs_every_step(site):
            return
        qualified = ctx.qualname(factory.func)
        if qualified not in _FACTORIES and qualified not in _RANDOM:
            return
        # `device=` already chosen; `requires_grad=True` then `.cuda()` gives a non-leaf copy, which
        # creating it on the device would turn into a leaf that collects gradients.
        if any(arg.keyword is not None and arg.keyword.value in _KEEP_AS_IS for arg in factory.args):
            return
        device = self._target_device(move, method)
        if device is None:
            return
        name = qualified.rsplit(".", 1)[-1]
        message = f"`torch.{name}(...)` is made on the CPU and then copied to the GPU"
        if qualified in _RANDOM:
            self.report(move, message, no_fix_reason="random numbers from the CUDA generator differ from the CPU's")
            return
        indent = ctx.module.default_indent
        made_there = append_args(factory, keyword_arg("device", device), indent=indent)
        self.report(move, message, fix_ops=[replace(move, made_there)])

    def _target_device(self, move: cst.Call, method: str) -> cst.BaseExpression | None:
        """What `device=` should be, when the call only moves to a device (else None)."""
        positional = [arg for arg in move.args if arg.keyword is None and not arg.star]
        keywords = {arg.keyword.value for arg in move.args if arg.keyword is not None}
        if any(arg.star for arg in move.args) or keywords - {"non_blocking", "device"}:
            return None
        if "device" in keywords:
            return None if positional else next(a.value for a in move.args if a.keyword and a.keyword.value == "device")
        if method == "cuda":
            return cst.parse_expression(string_literal(self.ctx, "cuda")) if not positional else positional[0].value
        if len(positional) != 1:
            return None
        value = positional[0].value
        if is_dtype(self.ctx, value):
            return None
        if isinstance(value, cst.SimpleString) or (
            isinstance(value, cst.Call) and self.ctx.qualname(value.func) == "torch.device"
        ):
            return value
        name = dotted_name(value)
        return value if name and _DEVICE_NAME.search(name.rsplit(".", 1)[-1]) else None

    def _runs_every_step(self, site: CallSite) -> bool:
        """In the training loop (or a function it calls), or in a module's `forward`."""
        if self.ctx.in_training_loop(site.stack):
            return True
        function = self.ctx.function_of(site.stack)
        return isinstance(function, cst.FunctionDef) and function.name.value == "forward"
