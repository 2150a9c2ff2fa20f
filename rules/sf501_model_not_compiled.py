from __future__ import annotations

import libcst as cst

from speedfix.blocks import enclosing_block
from speedfix.codegen import insert_before, reference, statement
from speedfix.context import CallSite, walk_expression
from speedfix.findings import Applicability, FixOp, LossCheck, Severity, Transform
from speedfix.names import dotted_name
from speedfix.patterns import OPTIMIZER_PREFIX
from speedfix.rule import Invalid, Rule, Valid
from speedfix.versions import v

_WRAPPERS = (
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.data_parallel.DataParallel",
)


class ModelNotCompiled(Rule):
    """
    ## What it does
    Finds a model that a CUDA script trains (its parameters go to a `torch.optim` optimizer) but
    never passes to `torch.compile`.

    ## Why is this bad?
    Eager PyTorch launches one kernel per operation and writes every intermediate to GPU memory.
    `torch.compile` captures the forward and backward graphs and fuses them into fewer, larger
    kernels (Triton on GPUs), which cuts memory traffic and launch overhead.

    ## Example
    ```python
    model = GPT(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    ```

    ## Use instead
    ```python
    model = GPT(config).to(device)
    model.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    ```

    ## Fix safety
    Unsafe: the first steps pay the compile time (seconds to minutes), code that compile cannot
    trace causes graph breaks, changing input shapes trigger recompiles (after 8 the function falls
    back to eager), fused kernels change numerics slightly, and Windows support is limited.

    Where the statement goes, and why: right after the model is built and moved to its device
    (and before a DDP wrapper), before the optimizer is created from it. For torch 2.2 and newer
    the fix is `model.compile()`, which compiles the module in place: `model` stays the same
    object, so `model.state_dict()` keys keep their names (no `_orig_mod.` prefix that breaks
    checkpoints) and the optimizer's parameters are the model's parameters. For 2.0 and 2.1 it is
    `model = torch.compile(model)`; the parameters are still shared, so the optimizer is right, but
    saved `state_dict` keys gain the `_orig_mod.` prefix, so the fix is refused when the file saves
    or loads a state dict. Scripts that already use `torch.compile` anywhere are left alone, as
    are `nn.DataParallel` models.

    ## Measured effect
    PyTorch 2.0 announcement: 43% average training speedup on an A100 over 163 open-source models
    (21% in fp32, 51% with AMP); nanoGPT: about 250 ms to 135 ms per iteration. It can also be
    slower (MMAction2 TSN: 0.50 to 0.61 s/iter): let `speedfix bench` decide.
    Sources: https://pytorch.org/get-started/pytorch-2.0/, https://github.com/karpathy/nanoGPT
    """

    code = "SF501"
    name = "model-not-compiled"
    summary = "Trained `nn.Module` never passed to `torch.compile` (CUDA)"
    severity = Severity.WARNING
    requires = (b"optim",)
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.NUMERICS
    fix_title = "Compile the model after it is built and moved to its device"
    gpu_only = True
    min_torch = v("2.0")
    effect = "Fused kernels: +43% mean training speed on A100 (PyTorch 2.0)."

    VALID = [
        Valid(
            """
            import torch
            model = Net().cuda()
            model = torch.compile(model)
            optimizer = torch.optim.AdamW(model.parameters())
            """
        ),
        Valid(  # Lightning's configure_optimizers: the Trainer owns the model
            """
            import torch
            import lightning as L
            class Model(L.LightningModule):
                def configure_optimizers(self):
                    return torch.optim.Adam(self.parameters(), lr=1e-3)
            trainer = L.Trainer(accelerator="cuda")
            """
        ),
        Valid(  # CPU-only scripts get no GPU advice
            """
            import torch
            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            """
        ),
        Valid(  # a project's own compile helper may well call torch.compile
            """
            import torch
            model = Net().cuda()
            model = compile_for_speed(model)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch import nn, optim

            def main():
                device = torch.device("cuda")
                model = Net().to(device)

                # optimizer and schedule
                optimizer = optim.Adam(model.parameters(), lr=1e-3)
            """,
            fixed="""
            import torch
            from torch import nn, optim

            def main():
                device = torch.device("cuda")
                model = Net().to(device)
                model.compile()

                # optimizer and schedule
                optimizer = optim.Adam(model.parameters(), lr=1e-3)
            """,
        ),
        Invalid(  # compile before the DDP wrapper; torch 2.1 rebinds the name with the file's alias
            """
            import torch as t
            from torch.nn.parallel import DistributedDataParallel as DDP

            def setup(rank):
                net = Net().cuda(rank)
                net = DDP(net, device_ids=[rank])
                opt = t.optim.SGD(net.parameters(), lr=0.1)
            """,
            fixed="""
            import torch as t
            from torch.nn.parallel import DistributedDataParallel as DDP

            def setup(rank):
                net = Net().cuda(rank)
                net = t.compile(net)
                net = DDP(net, device_ids=[rank])
                opt = t.optim.SGD(net.parameters(), lr=0.1)
            """,
            torch="2.1",
        ),
        Invalid(  # the DDP wrapper has another name: compile the module it wraps (pytorch/examples' ddp)
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP

            def demo(device_ids):
                model = ToyModel().cuda(device_ids[0])
                ddp_model = DDP(model, device_ids)
                optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.001)
            """,
            fixed="""
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP

            def demo(device_ids):
                model = ToyModel().cuda(device_ids[0])
                model.compile()
                ddp_model = DDP(model, device_ids)
                optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.001)
            """,
        ),
        Invalid(  # 2.0/2.1 would prefix checkpoint keys with `_orig_mod.`: no fix
            """
            import torch
            model = Net().cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            torch.save(model.state_dict(), "model.pt")
            """,
            torch="2.0",
        ),
    ]

    def finish(self) -> None:
        ctx = self.ctx
        if ctx.calls_to("torch.compile") or any(True for _ in ctx.method_calls("compile")):
            return
        if ctx.calls_to("torch.nn.DataParallel", "torch.nn.parallel.DataParallel"):
            return
        reported: set[str] = set()
        for site in ctx.calls:
            qualified = ctx.call_qualname(site)
            if not qualified or not qualified.startswith(OPTIMIZER_PREFIX) or qualified.startswith("torch.optim.lr_scheduler"):
                continue
            model = self._trained_module(site)
            if model is None or model in reported or self._passed_to_a_compile_helper(model):
                continue
            reported.add(model)
            self._report(site, model)

    def _trained_module(self, site: CallSite) -> str | None:
        """`X` in `Optimizer(X.parameters(), ...)` (also inside param groups)."""
        if not site.node.args:
            return None
        receivers = [
            dotted_name(node.func.value)
            for node in walk_expression(site.node.args[0].value)
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
            and node.func.attr.value in ("parameters", "named_parameters")
        ]
        roots = {r.split(".")[0] if not r.startswith("self.") else ".".join(r.split(".")[:2]) for r in receivers if r}
        if len(roots) != 1:
            return None
        root = roots.pop()
        return None if root == "self" else root

    def _passed_to_a_compile_helper(self, model: str) -> bool:
        for site in self.ctx.calls:
            if site.func and "compile" in site.func.lower():
                if any(dotted_name(arg.value) == model for arg in site.node.args):
                    return True
        return False

    def _report(self, site: CallSite, model: str) -> None:
        message = f"`{model}` is trained without `torch.compile`"
        anchor_statement = site.statement
        found = enclosing_block(self.ctx, anchor_statement) if anchor_statement is not None else None
        if found is None:
            self.report(site.node, message, no_fix_reason="the optimizer is not created in a plain statement")
            return
        statements = found
        index = next(i for i, s in enumerate(statements) if s is anchor_statement)
        in_place = self.ctx.torch_version >= v("2.2")
        if not in_place and self._touches_state_dict():
            self.report(site.node, message, no_fix_reason="with torch < 2.2 compiling renames state_dict keys (`_orig_mod.`)")
            return
        position, before, target = self._insertion_point(statements[:index], model)
        ops: list[FixOp] = []
        if in_place:
            new = statement(f"{target}.compile()")
        else:
            new = statement(f"{target} = {reference(self.ctx, 'torch.compile', ops, site.stack)}({target})")
        node = self._built_at(statements[:index], model) or site.node
        if position is None:
            ops.insert(0, insert_before(anchor_statement, new))
        elif before:
            ops.insert(0, insert_before(position, new))
        else:
            ops.insert(0, Transform(position, lambda updated: cst.FlattenSentinel([updated, new])))
        self.report(node, message, fix_ops=ops)

    def _insertion_point(
        self, earlier: list[cst.BaseStatement], model: str
    ) -> tuple[cst.BaseStatement | None, bool, str]:
        """(statement, insert before it?, name to compile).

        Before a DDP/DataParallel wrap (compiling the module it wraps, as nanoGPT does), else
        after the last statement that builds, moves or loads the model."""
        last = None
        for node in earlier:
            if not isinstance(node, cst.SimpleStatementLine) or len(node.body) != 1:
                continue
            small = node.body[0]
            if isinstance(small, cst.Assign) and any(dotted_name(t.target) == model for t in small.targets):
                value = small.value
                if isinstance(value, cst.Call) and self.ctx.qualname(value.func) in _WRAPPERS and value.args:
                    wrapped = dotted_name(value.args[0].value)
                    if wrapped:
                        return node, True, wrapped
                last = node
            elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                func = small.value.func
                if isinstance(func, cst.Attribute) and dotted_name(func.value) == model:
                    last = node
        return last, False, model

    def _built_at(self, earlier: list[cst.BaseStatement], model: str) -> cst.CSTNode | None:
        for node in reversed(earlier):
            if isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1:
                small = node.body[0]
                if isinstance(small, cst.Assign) and any(dotted_name(t.target) == model for t in small.targets):
                    value = small.value
                    if not (isinstance(value, cst.Call) and self.ctx.qualname(value.func) in _WRAPPERS):
                        return value
        return None

    def _touches_state_dict(self) -> bool:
        return any(True for _ in self.ctx.method_calls("state_dict")) or any(
            True for _ in self.ctx.method_calls("load_state_dict")
        )
