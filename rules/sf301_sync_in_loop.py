from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import libcst as cst

from speedfix.context import FileContext, Stack, walk_expression
from speedfix.findings import Applicability, FixOp, LossCheck, Severity, Transform
from speedfix.names import dotted_name
from speedfix.patterns import BatchNames, is_cpu_device
from speedfix.rule import Invalid, Rule, Valid

_SYNC_METHODS = ("item", "cpu", "tolist")
_CONVERSIONS = ("float", "int", "bool")
# Tensor methods whose result is again a tensor on the same device (`.item()`, `.tolist()`,
# `.cpu()`, `.size()` and friends are not: their results are host values).
_TENSOR_METHODS = frozenset(
    """
    abs add argmax argmin bfloat16 bmm clamp clip clone contiguous cuda detach div double eq exp
    expand flatten float ge gt half le log log_softmax long lt matmul max mean min mm mul ne neg
    norm permute pow prod relu reshape sigmoid sign softmax sqrt square squeeze std sub sum t tanh
    transpose type_as unsqueeze var view view_as
    """.split()
)


@dataclass
class _Load:
    node: cst.Name
    stack: Stack


class SyncInLoop(Rule):
    """
    ## What it does
    Finds code in the training loop that makes the CPU wait for the GPU on every step:
    `t.item()`, `t.cpu()`, `t.tolist()`, `t.to("cpu")`, `float(t)`/`int(t)`/`bool(t)`, and
    `print(t)` or an f-string of a tensor `t`. Code under a periodic logging guard
    (`if step % log_every == 0:`) is not the hot path and is not reported.

    ## Why is this bad?
    CUDA runs asynchronously: the CPU queues kernels and moves on. Reading a value on the host
    forces the CPU to wait until every queued kernel has finished, so it cannot queue the next
    step while the GPU works, and the GPU then idles while the CPU catches up.

    ## Example
    ```python
    for step, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        running_loss += loss.item()
        if step % 100 == 99:
            print(f"loss {running_loss / 100:.3f}")
            running_loss = 0.0
    ```

    ## Use instead
    ```python
    for step, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        running_loss += loss.detach()
        if step % 100 == 99:
            print(f"loss {float(running_loss) / 100:.3f}")
            running_loss = 0.0
    ```

    ## Fix safety
    Unsafe, and only offered where it is mechanical: `total += t.item()` becomes
    `total += t.detach()` (the sum stays on the GPU), and every read of `total` outside the hot
    path becomes `float(total)`, so it syncs once at the existing logging point. The sum is then
    accumulated in float32 on the GPU instead of a Python float, so logged values can differ in the
    last digits. No fix when the value is needed every step (a progress bar, an early stop, a NaN
    guard, a list of per-step values): there the sync is the price of the feature, or the code needs
    restructuring by hand.

    ## Measured effect
    torchtune measured 40-50 ms of `cudaStreamSynchronize` per step from `loss.item()` and moved it
    under its logging interval; an honest A/B elsewhere found 4% in a microbenchmark and under 1% in
    real training, because a sync only costs what CPU/GPU overlap would have hidden. Measure it.
    Sources: https://github.com/meta-pytorch/torchtune/pull/522,
    https://github.com/lnccbrown/LANfactory/pull/120
    """

    code = "SF301"
    name = "sync-in-loop"
    summary = "CPU-GPU synchronisation (`.item()`, `.cpu()`, `print(t)`) on every training step"
    severity = Severity.WARNING
    requires = (b"backward", b"step(", b"training_step")
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.EXACT
    fix_title = "Accumulate on the device and read the value once, at the logging point"
    gpu_only = True
    effect = "The CPU queues the next step while the GPU works (0-50 ms/step)."

    VALID = [
        Valid(  # under the logging guard
            """
            import torch
            for step, (x, y) in enumerate(loader):
                x = x.cuda()
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
                if step % 100 == 0:
                    print(f"step {step} loss {loss.item():.4f}")
            """
        ),
        Valid(  # once per epoch, not per step
            """
            import torch
            for epoch in range(10):
                for x, y in loader:
                    loss = model(x.cuda()).sum()
                    loss.backward()
                    optimizer.step()
                print(epoch, loss.item())
            """
        ),
        Valid(  # CPU-only script: .item() costs nothing there
            """
            for x, y in loader:
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
                total += loss.item()
            """
        ),
        Valid(  # labels straight from the DataLoader are still on the CPU
            """
            import torch
            for x, y in train_loader:
                labels.extend(y.tolist())
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            device = "cuda"
            for epoch in range(3):
                running_loss = 0.0
                for i, (x, y) in enumerate(loader):
                    loss = criterion(model(x.to(device)), y.to(device))
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    running_loss += loss.item()
                    if i % 100 == 99:
                        print(f"[{epoch}, {i}] loss: {running_loss / 100:.3f}")
                        running_loss = 0.0
            """,
            fixed="""
            import torch
            device = "cuda"
            for epoch in range(3):
                running_loss = 0.0
                for i, (x, y) in enumerate(loader):
                    loss = criterion(model(x.to(device)), y.to(device))
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    running_loss += loss.detach()
                    if i % 100 == 99:
                        print(f"[{epoch}, {i}] loss: {float(running_loss) / 100:.3f}")
                        running_loss = 0.0
            """,
        ),
        Invalid(  # counts and sums read once per epoch; a comparison needs no detach
            """
            import torch

            def train_epoch(model, loader, optimizer):
                total, correct = 0.0, 0
                for x, y in loader:
                    x, y = x.cuda(), y.cuda()
                    out = model(x)
                    loss = torch.nn.functional.cross_entropy(out, y)
                    loss.backward()
                    optimizer.step()
                    total += loss.item() * x.size(0)
                    correct += (out.argmax(1) == y).sum().item()
                return total / len(loader.dataset), correct
            """,
            fixed="""
            import torch

            def train_epoch(model, loader, optimizer):
                total, correct = 0.0, 0
                for x, y in loader:
                    x, y = x.cuda(), y.cuda()
                    out = model(x)
                    loss = torch.nn.functional.cross_entropy(out, y)
                    loss.backward()
                    optimizer.step()
                    total += loss.detach() * x.size(0)
                    correct += (out.argmax(1) == y).sum()
                return float(total) / len(loader.dataset), float(correct)
            """,
            count=2,
        ),
        Invalid(  # summed over a meta-batch, read once per outer optimizer step
            """
            import torch
            for iteration in range(1000):
                optimizer.zero_grad()
                meta_error = 0.0
                for task in range(32):
                    error = adapt(learner, tasks.sample(), device="cuda")
                    error.backward()
                    meta_error += error.item()
                if rank == 0:
                    print("meta train error", meta_error / 32)
                optimizer.step()
            """,
            fixed="""
            import torch
            for iteration in range(1000):
                optimizer.zero_grad()
                meta_error = 0.0
                for task in range(32):
                    error = adapt(learner, tasks.sample(), device="cuda")
                    error.backward()
                    meta_error += error.detach()
                if rank == 0:
                    print("meta train error", float(meta_error) / 32)
                optimizer.step()
            """,
        ),
        Invalid(  # a float made by .item() is not a tensor; the .item() itself is the sync
            """
            import torch
            for k in range(100):
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
                lossf = loss.item()
                print(f"{k} loss: {lossf:.4f}")
            """,
        ),
        Invalid(  # needed every step (progress bar, per-batch predictions): no fix
            """
            import torch
            for x, y in pbar:
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
                pbar.set_postfix(loss=loss.item())
                preds.append(model(x.cuda()).argmax(1).cpu())
                print(loss)
            """,
            count=3,
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._loads: dict[str, list[_Load]] = {}
        self._not_loads: set[int] = set()
        self._fstring_names: list[tuple[cst.Name, Stack]] = []

    # ------------------------------------------------------------------ collection
    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._not_loads.add(id(node.attr))

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self._not_loads.add(id(node.keyword))

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        for name in _names_in(node.target):
            self._not_loads.add(id(name))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._not_loads.add(id(node.target))

    def visit_Param(self, node: cst.Param) -> None:
        self._not_loads.add(id(node.name))

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) not in self._not_loads:
            self._loads.setdefault(node.value, []).append(_Load(node, self.ctx.stack))

    def visit_FormattedStringExpression(self, node: cst.FormattedStringExpression) -> None:
        if isinstance(node.expression, cst.Name):
            self._fstring_names.append((node.expression, self.ctx.stack))

    # ------------------------------------------------------------------ decisions
    @cached_property
    def batches(self) -> BatchNames:
        return BatchNames(self.ctx)

    def finish(self) -> None:
        ctx = self.ctx
        for site in ctx.calls:
            if not ctx.is_hot(site.stack):
                continue
            func = site.node.func
            if isinstance(func, cst.Attribute):
                self._check_method(site.node, func, site.stack)
            elif isinstance(func, cst.Name) and ctx.qualname(func) is None:
                self._check_builtin(site.node, func.value, site.stack)
        for name, stack in self._fstring_names:
            if ctx.is_hot(stack) and self._is_tensor(name, stack):
                self.report(name, f"formatting tensor `{name.value}` in the training loop waits for the GPU every step",
                            no_fix_reason="the value is formatted every step")

    def _check_method(self, call: cst.Call, func: cst.Attribute, stack: Stack) -> None:
        method = func.attr.value
        receiver = func.value
        if method == "to":
            if call.args and call.args[0].keyword is None and is_cpu_device(self.ctx, call.args[0].value, stack):
                if not self.batches.is_host_batch(receiver, stack) and not _has_sync_before(receiver):
                    self.report(call, "`.to(\"cpu\")` in the training loop copies to the host and waits for the GPU every step",
                                no_fix_reason="the host copy is used every step")
            return
        if method not in _SYNC_METHODS or call.args:
            return
        if self.batches.is_host_batch(receiver, stack) or _has_sync_before(receiver):
            return
        if method == "tolist" and not self._is_tensor_expr(receiver, stack):
            return
        label = dotted_name(receiver)
        what = f"`{label}.{method}()`" if label else f"`.{method}()`"
        message = f"{what} in the training loop makes the CPU wait for the GPU every step"
        if method == "item":
            self._report_item(call, func, stack, message)
        else:
            self.report(call, message, no_fix_reason="the host copy is used every step")

    def _check_builtin(self, call: cst.Call, name: str, stack: Stack) -> None:
        if name in _CONVERSIONS and len(call.args) == 1 and isinstance(call.args[0].value, cst.Name):
            arg = call.args[0].value
            if self._is_tensor(arg, stack):
                self.report(call, f"`{name}({arg.value})` of a tensor in the training loop waits for the GPU every step",
                            no_fix_reason="the value is needed every step")
        elif name == "print":
            for arg in call.args:
                if isinstance(arg.value, cst.Name) and self._is_tensor(arg.value, stack):
                    self.report(call, f"printing tensor `{arg.value.value}` in the training loop waits for the GPU every step",
                                no_fix_reason="the value is printed every step")
                    return

    # ------------------------------------------------------------------ the mechanical fix
    def _report_item(self, call: cst.Call, func: cst.Attribute, stack: Stack, message: str) -> None:
        site = self.ctx.site_of(call)
        statement = site.statement if site is not None else None
        augassign = statement.body[0] if statement is not None and len(statement.body) == 1 else None
        if not (
            isinstance(augassign, cst.AugAssign)
            and isinstance(augassign.operator, cst.AddAssign)
            and isinstance(augassign.target, cst.Name)
            and _only_arithmetic_around(augassign.value, call)
        ):
            self.report(call, message, no_fix_reason="the value is used every step, not only summed for logging")
            return
        total = augassign.target.value
        reads = self._reads_of(total, stack, exclude=augassign)
        if reads is None:
            self.report(call, message, no_fix_reason=f"`{total}` is read every step")
            return
        receiver = func.value
        keep = _needs_no_detach(receiver)

        def drop_item(node: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
            inner = node.func.value
            if keep:
                return inner
            return node.with_changes(func=node.func.with_changes(attr=cst.Name("detach")))

        ops: list[FixOp] = [Transform(call, drop_item)]
        ops += [Transform(read.node, _wrap_in_float) for read in reads]
        self.report(call, message, fix_ops=ops)

    def _reads_of(self, name: str, stack: Stack, exclude: cst.AugAssign) -> list[_Load] | None:
        """Reads of ``name`` in the same function, or None when one runs as often as the sum:
        hot and inside the loop that accumulates (a read in an enclosing loop, such as a
        meta-learning step summing over tasks, is once per outer step and fine)."""
        function = self.ctx.function_of(stack)
        accumulating_loop = self.ctx.nearest_loop(stack)
        reads = []
        for load in self._loads.get(name, ()):
            if self.ctx.function_of(load.stack) is not function or _inside(exclude, load.node):
                continue
            if self.ctx.is_hot(load.stack) and accumulating_loop in self.ctx.enclosing_loops(load.stack):
                return None
            reads.append(load)
        return reads

    # ------------------------------------------------------------------ tensors
    @cached_property
    def _tensor_names(self) -> dict[cst.CSTNode | None, set[str]]:
        """Per function: names that certainly hold tensors (backward receivers and the
        results of torch calls, model/criterion calls and tensor methods on those)."""
        ctx = self.ctx
        result: dict[cst.CSTNode | None, set[str]] = {}
        for site in ctx.method_calls("backward"):
            receiver = site.node.func.value  # type: ignore[attr-defined]
            if isinstance(receiver, cst.Name):
                result.setdefault(ctx.function_of(site.stack), set()).add(receiver.value)
        for _ in range(3):
            for target, assignments in ctx.assignments.items():
                for assignment in assignments:
                    names = result.setdefault(ctx.function_of(assignment.stack), set())
                    if target not in names and not assignment.unpacked and self._is_tensor_expr(assignment.value, assignment.stack, names):
                        names.add(target)
        return result

    def _is_tensor(self, name: cst.Name, stack: Stack) -> bool:
        if self.batches.is_host_batch(name, stack):
            return False
        return name.value in self._tensor_names.get(self.ctx.function_of(stack), set())

    def _is_tensor_expr(self, expr: cst.BaseExpression, stack: Stack, names: set[str] | None = None) -> bool:
        if names is None:
            names = self._tensor_names.get(self.ctx.function_of(stack), set())
        if isinstance(expr, cst.Name):
            return expr.value in names
        if isinstance(expr, cst.Call):
            qualified = self.ctx.qualname(expr.func)
            if qualified and qualified.startswith("torch.") and not qualified.startswith("torch.utils"):
                return True
            if isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _TENSOR_METHODS:
                return self._is_tensor_expr(expr.func.value, stack, names)
            return False
        if isinstance(expr, (cst.Subscript, cst.Attribute)):
            return self._is_tensor_expr(expr.value, stack, names)
        if isinstance(expr, cst.BinaryOperation):
            return self._is_tensor_expr(expr.left, stack, names) or self._is_tensor_expr(expr.right, stack, names)
        return False


def _names_in(target: cst.BaseExpression) -> list[cst.Name]:
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in _names_in(element.value)]
    return []


def _has_sync_before(expr: cst.BaseExpression) -> bool:
    """`x.cpu().numpy().tolist()`: only the first host copy in a chain is reported."""
    while True:
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
            if expr.func.attr.value in ("item", "cpu", "numpy", "tolist"):
                return True
            expr = expr.func.value
        elif isinstance(expr, (cst.Attribute, cst.Subscript)):
            expr = expr.value
        else:
            return False


def _only_arithmetic_around(value: cst.BaseExpression, call: cst.Call) -> bool:
    """`x.item()` or `x.item() * n`: replacing .item() keeps the expression meaningful."""
    if value is call:
        return True
    if isinstance(value, cst.BinaryOperation):
        return _only_arithmetic_around(value.left, call) or _only_arithmetic_around(value.right, call)
    return False


def _needs_no_detach(receiver: cst.BaseExpression) -> bool:
    """Comparisons (`(pred == y).sum()`) carry no gradient: dropping `.item()` is enough."""
    for node in walk_expression(receiver):
        if isinstance(node, cst.Comparison):
            return True
    return False


def _inside(outer: cst.CSTNode, node: cst.CSTNode) -> bool:
    return any(child is node for child in walk_expression(outer))


def _wrap_in_float(node: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(node, cst.BaseExpression)
    return cst.Call(func=cst.Name("float"), args=[cst.Arg(node.with_changes(lpar=[], rpar=[]))],
                    lpar=node.lpar, rpar=node.rpar)
