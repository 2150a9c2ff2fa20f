from __future__ import annotations

from functools import cached_property

import libcst as cst

from speedfix.engine.findings import Applicability, LossCheck, Severity, Transform
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import append_args, keyword_arg, remove_arg
from speedfix.model.arguments import find_argument, literal_bool
from speedfix.model.deepspeed_config import DEEPSPEED_INITIALIZE
from speedfix.model.flow import false_in_every_run
from speedfix.model.frameworks import accelerate_runs_deepspeed
from speedfix.model.index import CallSite
from speedfix.model.networks import returns_torch_optimizer
from speedfix.model.patterns import NN_MODULE, OPTIMIZER_PREFIX
from speedfix.model.versions import v
from speedfix.syntax.comments import own_lines
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import code_of

_ZEROING_METHODS = ("zero_", "detach_", "requires_grad_")


class ZeroGradNotNone(Rule):
    """
    ## What it does
    Finds gradients that are zero-filled instead of freed: `optimizer.zero_grad(set_to_none=False)`,
    `model.zero_grad(set_to_none=False)`, and hand-written loops such as
    `for p in model.parameters(): p.grad.zero_()` (also over a list of parameters, as a project's
    `zero_grad(model_params)` helper loops: without a fix, there is no module to call
    `zero_grad()` on). For a target torch older than 2.0 it also
    reports a bare `zero_grad()`, whose default was still `set_to_none=False`, on what the
    file shows is a torch optimizer or module (also an optimizer a factory of the file returns:
    `opt = self.make_optimizer()` returning `torch.optim.RMSprop(...)`). A value the user
    chooses (`set_to_none=args.set_grads_to_none`, a `store_true` option, also one a parser in
    another file of the project defines) is reported when it is False in the default run and no
    launch command of the project turns it on; the option is left as it is (no fix).

    ## Why is this bad?
    Zero-filling runs a memset kernel per parameter every step and keeps the gradient memory
    allocated between steps. Setting `.grad` to `None` costs nothing, and the next backward
    writes the gradient instead of adding to zeros. It has been the default since PyTorch 2.0,
    so a bare `zero_grad()` is already right: the Performance Tuning Guide's advice to loop over
    parameters is obsolete.

    Not reported when the file relies on a gradient tensor existing (it adds into `.grad`, e.g.
    `p.grad += g` in a parameter server): there `set_to_none=False` is load-bearing, which is why
    TorchFix's TOR402 is noisy. Only torch optimizers and models are considered, never a
    project's own `zero_grad`, nor an optimizer DeepSpeed wraps (`deepspeed.initialize`, or
    `accelerator.prepare` with a DeepSpeed plugin or a launch config of `distributed_type:
    DEEPSPEED`): its engine clears the gradients itself.

    ## Example
    ```python
    optimizer.zero_grad(set_to_none=False)
    for p in model.parameters():
        if p.grad is not None:
            p.grad.zero_()
    ```

    ## Use instead
    ```python
    optimizer.zero_grad()
    model.zero_grad()
    ```

    ## Fix safety
    Unsafe: after the change `.grad` is `None` between `zero_grad()` and the next backward, so code
    that reads gradients there (logging grad norms, custom optimizers that expect a tensor) sees
    `None`; parameters that get no gradient in a step keep `None` instead of zeros, which
    optimizers treat as "skip" rather than "decay with a zero gradient" (a difference for
    momentum/weight decay on unused parameters).

    ## Impact
    Low: a memset per gradient per step, and the memory held between steps. Nothing moves it.

    ## Measured effect
    Small: "can modestly improve performance" per PyTorch's `zero_grad` docstring; the profiler's
    `GradNotSetToNonePattern` flags the memsets. The default changed in PyTorch 2.0.
    Sources: https://github.com/pytorch/pytorch/pull/92731, https://github.com/pytorch/pytorch/pull/44423
    """

    impact = "low"
    min_torch = v("1.7")  # `zero_grad(set_to_none=...)` came with torch 1.7: before, the fix would raise
    code = "SF402"
    name = "zero-grad-not-none"
    summary = "Gradients zero-filled (`set_to_none=False`, `p.grad.zero_()` loops) instead of freed"
    severity = Severity.INFO
    requires = (b"zero_grad", b".grad")
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.EXACT
    fix_title = "Let `zero_grad()` set gradients to None"
    effect = "Saves a memset per parameter per step (small)."

    VALID = [
        Valid(  # Accelerate with a DeepSpeed plugin: the prepared optimizer's zero_grad() does nothing
            """
            import torch
            from accelerate import Accelerator, DeepSpeedPlugin
            accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            for batch in loader:
                optimizer.zero_grad()
                accelerator.backward(model(**batch).loss)
                optimizer.step()
            """,
            torch="1.13",
        ),
        Valid(  # the engine's ZeRO optimizer frees the gradients itself
            """
            import deepspeed
            import torch
            base = torch.optim.Adam(net.parameters())
            engine, optimizer, _, _ = deepspeed.initialize(model=net, optimizer=base, config="ds.json")
            for batch in loader:
                optimizer.zero_grad()
                engine.backward(engine(batch))
                engine.step()
            """,
            torch="1.13",
        ),
        Valid(
            """
            import torch
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            optimizer.zero_grad()
            """
        ),
        Valid(  # the option is on unless the user turns it off (`store_false`)
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--keep_grad_tensors", dest="free_grads", action="store_false")
            args = parser.parse_args()
            optimizer = torch.optim.AdamW(model.parameters())
            optimizer.zero_grad(set_to_none=args.free_grads)
            """
        ),
        Valid(  # a project pinned to torch 1.6: `zero_grad` takes no `set_to_none` there
            """
            import torch
            optimizer = torch.optim.Adam(model.parameters())
            for batch in loader:
                model(batch).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
            """,
            torch="1.6",
        ),
        Valid(  # load-bearing: the next step adds into .grad
            """
            import torch
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            optimizer.zero_grad(set_to_none=False)
            for p, g in zip(model.parameters(), grads):
                p.grad += g
            """
        ),
        Valid(  # a project's own optimizer class
            """
            import torch
            from myproject.optim import ShardedOptimizer
            opt = ShardedOptimizer(params)
            opt.zero_grad(set_to_none=False)
            """
        ),
        Valid(  # the default before 2.0 was False, but the target is 2.4
            """
            import torch
            optimizer = torch.optim.Adam(model.parameters())
            optimizer.zero_grad()
            """,
            torch="2.4",
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            for x, y in loader:
                optimizer.zero_grad(set_to_none=False)
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            for x, y in loader:
                optimizer.zero_grad()
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # a manual zeroing loop becomes the module's zero_grad()
            """
            import torch
            for x, y in loader:
                for p in model.parameters():
                    if p.grad is not None:
                        p.grad.detach_()
                        p.grad.zero_()
                loss = model(x).sum()
                loss.backward()
                opt.step()
            """,
            fixed="""
            import torch
            for x, y in loader:
                model.zero_grad()
                loss = model(x).sum()
                loss.backward()
                opt.step()
            """,
        ),
        Invalid(  # a helper that zeroes a list of parameters (improved-diffusion's fp16_util.zero_grad)
            """
            import torch

            def zero_grad(model_params):
                for param in model_params:
                    if param.grad is not None:
                        param.grad.detach_()
                        param.grad.zero_()
            """
        ),
        Invalid(  # a `store_true` switch the default run leaves off: zero-filled, the option stays
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--free-grads", action="store_true")
            args = parser.parse_args()
            optimizer = torch.optim.AdamW(model.parameters())
            for batch in loader:
                optimizer.zero_grad(set_to_none=args.free_grads)
            """,
        ),
        Invalid(  # before torch 2.0 the default was set_to_none=False
            """
            import torch
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            optimizer.zero_grad()
            """,
            fixed="""
            import torch
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            optimizer.zero_grad(set_to_none=True)
            """,
            torch="1.13",
        ),
        Invalid(  # the optimizer comes from a method of the experiment class that builds a torch one
            """
            import torch

            class Experiment:
                def make_optimizer(self):
                    return torch.optim.RMSprop(self.net.parameters(), lr=1e-3)

                def train(self, loader):
                    opt = self.make_optimizer()
                    for x in loader:
                        opt.zero_grad()
                        self.net(x).mean().backward()
                        opt.step()
            """,
            fixed="""
            import torch

            class Experiment:
                def make_optimizer(self):
                    return torch.optim.RMSprop(self.net.parameters(), lr=1e-3)

                def train(self, loader):
                    opt = self.make_optimizer()
                    for x in loader:
                        opt.zero_grad(set_to_none=True)
                        self.net(x).mean().backward()
                        opt.step()
            """,
            torch="1.9",
        ),
    ]

    def finish(self) -> None:
        if self._grads_are_accumulated_into():
            return
        for site in self.ctx.method_calls("zero_grad"):
            self._check_call(site)
        for info in self.ctx.loops.values():
            if isinstance(info.node, cst.For):
                self._check_loop(info.node)

    def _check_call(self, site: CallSite) -> None:
        func = site.node.func
        assert isinstance(func, cst.Attribute)
        if not self._is_torch_object(func.value, site) or self._deepspeed_owned(func.value):
            return
        arg = find_argument(self.ctx, site, "set_to_none", 0)
        if arg.missing:
            if self.ctx.torch_version < v("2.0"):
                self.report(
                    site.node,
                    "`zero_grad()` fills gradients with zeros before torch 2.0; pass `set_to_none=True`",
                    fix_ops=[Transform(site.node, lambda call: append_args(call, keyword_arg("set_to_none", cst.Name("True")), indent=self.ctx.module.default_indent))],
                )
            return
        written = literal_bool(self.ctx, arg.node, site.stack) is False
        if not written and (arg.node is None or not false_in_every_run(self.ctx, arg.node, site.stack)):
            return
        target = arg.arg
        fix_ops = None
        if not written:  # an option off by default (`store_true`): the user's switch stays
            self.report(site.node, f"`zero_grad(set_to_none={code_of(arg.node)})` is False in the default run: it "
                        "fills every gradient with zeros instead of freeing it",
                        no_fix_reason="the value is an option: pass it (or `set_to_none=True`) to free the gradients")
            return
        if target is not None:
            fix_ops = [Transform(site.node, lambda call: remove_arg(call, _matching(call, target)))]
            if self.ctx.torch_version < v("2.0"):
                fix_ops = [Transform(site.node, lambda call: call.with_changes(args=[
                    a.with_changes(value=cst.Name("True")) if a.keyword and a.keyword.value == "set_to_none" else a
                    for a in call.args
                ]))]
        self.report(site.node, "`zero_grad(set_to_none=False)` fills every gradient with zeros instead of freeing it",
                    fix_ops=fix_ops, no_fix_reason="the value is set outside the call")

    def _is_torch_object(self, receiver: cst.BaseExpression, site: CallSite) -> bool:
        """A torch optimizer or nn.Module, as far as the file tells; never a project's own class."""
        made_by = self.ctx.constructor_of(receiver, site.stack)
        if made_by is not None:
            if made_by.startswith(OPTIMIZER_PREFIX) or made_by.startswith("torch.nn."):
                return True
            local = made_by.split(".")[-1]
            if local not in self.ctx.classes and returns_torch_optimizer(self.ctx, local):
                return True  # `model_optim = self._select_optimizer()`, a factory of the file
            return self.ctx.is_subclass_of(local, "torch.optim.Optimizer", "torch.optim.optimizer.Optimizer", *NN_MODULE)
        return self.ctx.is_optimizer_like(receiver, site.stack) or (dotted_name(receiver) or "").split(".")[-1] in (
            "model", "net", "module",
        )

    def _deepspeed_owned(self, receiver: cst.BaseExpression) -> bool:
        """An optimizer (or model) DeepSpeed wraps: returned by `deepspeed.initialize(...)`, or
        by `accelerator.prepare(...)` where Accelerate runs DeepSpeed. The engine zeroes the
        gradients itself (Accelerate's wrapper makes `zero_grad()` a no-op; ZeRO frees them)."""
        name = dotted_name(receiver)
        wrappers = [a.value for a in self.ctx.assignments.get(name or "", ()) if isinstance(a.value, cst.Call)]
        if any(self.ctx.qualname(call.func) == DEEPSPEED_INITIALIZE for call in wrappers):
            return True
        return any(isinstance(call.func, cst.Attribute) and call.func.attr.value == "prepare" for call in wrappers) \
            and self._accelerate_runs_deepspeed

    @cached_property
    def _accelerate_runs_deepspeed(self) -> bool:
        return accelerate_runs_deepspeed(self.ctx)  # reads the launch configs: once per file, not per call

    def _check_loop(self, loop: cst.For) -> None:
        """`for p in model.parameters(): [if p.grad is not None:] p.grad.zero_()`."""
        iterable = loop.iter
        if not isinstance(loop.target, cst.Name):
            return
        body = _zeroing_body(loop, loop.target.value)
        if body is None or not any(_zeroes(statement) for statement in body):
            return
        if not (isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Attribute)
                and iterable.func.attr.value == "parameters" and not iterable.args):
            # a list of parameters (improved-diffusion's `zero_grad(model_params)` helper): no
            # module to call `zero_grad()` on
            self.report(loop, "gradients are zeroed one parameter at a time instead of freed",
                        no_fix_reason=f"the loop is not over a module's parameters(): set `{loop.target.value}.grad "
                                      "= None` instead of zeroing it (or call the module's `zero_grad()`)")
            return
        module = iterable.func.value
        call = "zero_grad()" if self.ctx.torch_version >= v("2.0") else "zero_grad(set_to_none=True)"
        replacement = cst.parse_statement(f"{code_of(module)}.{call}")
        self.report(
            loop,
            "gradients are zeroed one parameter at a time instead of freed",
            # The loop's comments stay, above the call that replaces it.
            fix_ops=[Transform(loop, lambda node: replacement.with_changes(leading_lines=own_lines(node)))],
        )

    def _grads_are_accumulated_into(self) -> bool:
        """`p.grad += g`, `p.grad.add_(g)`, `p.grad.copy_(g)`: the code needs a grad tensor."""
        ctx = self.ctx
        for name, assignments in ctx.assignments.items():
            if name.endswith(".grad") and any(a.augmented for a in assignments):
                return True
        for method in ("add_", "copy_", "mul_", "div_"):
            for site in ctx.method_calls(method):
                receiver = dotted_name(site.node.func.value)  # type: ignore[attr-defined]
                if receiver and (receiver.endswith(".grad") or receiver.endswith(".grad.data")):
                    return True
        return False


def _matching(call: cst.Call, original: cst.Arg) -> cst.Arg:
    for arg in call.args:
        if arg is original or (arg.keyword is not None and original.keyword is not None
                               and arg.keyword.value == original.keyword.value):
            return arg
    return original


def _zeroes(statement: cst.BaseStatement) -> bool:
    """Does a statement of a zeroing body write zeros (`.zero_()`, `= zeros_like(...)`), not only
    detach the gradient?"""
    return any((isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and isinstance(small.value.func, cst.Attribute)
                and small.value.func.attr.value == "zero_") or isinstance(small, cst.Assign)
               for small in getattr(statement, "body", ()))


def _zeroing_body(loop: cst.For, param: str) -> list[cst.BaseStatement] | None:
    """The loop's statements if all they do is zero `<param>.grad` (optionally under a None check)."""
    statements = list(loop.body.body) if isinstance(loop.body, cst.IndentedBlock) else []
    if len(statements) == 1 and isinstance(statements[0], cst.If) and statements[0].orelse is None:
        statements = list(statements[0].body.body) if isinstance(statements[0].body, cst.IndentedBlock) else []
    if not statements or loop.orelse is not None:
        return None
    for statement in statements:
        if not isinstance(statement, cst.SimpleStatementLine):
            return None
        for small in statement.body:
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                func = small.value.func
                if isinstance(func, cst.Attribute) and func.attr.value in _ZEROING_METHODS:
                    if dotted_name(func.value) in (f"{param}.grad", f"{param}.grad.data"):
                        continue
            if isinstance(small, cst.Assign) and len(small.targets) == 1:
                if dotted_name(small.targets[0].target) == f"{param}.grad" and isinstance(small.value, cst.Call):
                    if (dotted_name(small.value.func) or "").endswith("zeros_like"):
                        continue
            return None
    return statements
