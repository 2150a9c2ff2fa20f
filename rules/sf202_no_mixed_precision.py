from __future__ import annotations

import builtins
import re
from collections import defaultdict

import libcst as cst

from speedfix.blocks import statement_owner
from speedfix.codegen import reference, string_literal
from speedfix.context import CallSite, target_names, walk_expression
from speedfix.findings import Applicability, FixOp, LossCheck, Severity, Transform
from speedfix.names import dotted_name
from speedfix.patterns import uses_autocast
from speedfix.rule import Invalid, Rule, Valid
from speedfix.versions import v

# Calls that move or reshape a batch rather than run the model: a statement made only of these
# is data preparation and stays outside the autocast block.
_DATA_MOVES = frozenset({"to", "cuda", "pin_memory", "float", "long", "view", "reshape", "squeeze", "unsqueeze"})
_STEP_CALLS = frozenset({"backward", "step", "zero_grad"})
# Autocast raises on these ("unsafe to autocast"): the model has to move to the logits version first.
_BANNED_UNDER_AUTOCAST = ("torch.nn.BCELoss", "torch.nn.modules.loss.BCELoss", "torch.nn.functional.binary_cross_entropy")
# Autocast runs cuDNN RNNs in fp16 whatever dtype is asked for (its `_cudnn_rnn` wrapper
# reflattens the weights into an fp16 buffer; cuDNN had no bf16 RNNs before 9.13): without a
# GradScaler their gradients can underflow.
_CUDNN_RNNS = tuple(f"torch.nn.{kind}" for kind in ("LSTM", "GRU", "RNN")) + tuple(
    f"torch.nn.modules.rnn.{kind}" for kind in ("LSTM", "GRU", "RNN")
)
_LOSS_NAME = re.compile(r"loss|criterion", re.IGNORECASE)


class NoMixedPrecision(Rule):
    """
    ## What it does
    Finds CUDA training loops whose forward pass and loss run in fp32: no `torch.autocast`
    anywhere in the script and no 16-bit model or dtype (`model.half()`, `torch.bfloat16`,
    Lightning's `"bf16-mixed"`, FSDP mixed-precision policies).

    ## Why is this bad?
    Tensor cores run bf16 and fp16 matmuls and convolutions several times faster than fp32 (even
    with TF32), and half-width activations halve the memory traffic of every elementwise op.
    `torch.autocast` picks the precision per op: matmuls and convolutions in bf16, reductions,
    softmax and losses in fp32. bf16 keeps fp32's exponent range, so unlike fp16 it needs no
    `GradScaler`. The forward pass and the loss go inside the `with`; `backward()` and the
    optimizer step stay outside (the backward pass reuses the forward's precisions).

    ## Example
    ```python
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        output = model(x)
        loss = criterion(output, y)
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            output = model(x)
            loss = criterion(output, y)
        loss.backward()
        optimizer.step()
    ```

    ## Fix safety
    Unsafe: the numbers change. bf16 has 8 mantissa bits, so losses and gradients differ from
    fp32 at the third significant digit; most models train to the same accuracy, but custom ops
    or extensions that assume fp32 inputs, losses computed by hand with large sums, and models
    trained close to fp32's precision limit can degrade. bf16 needs an Ampere or newer GPU (A100,
    RTX 30xx, H100; `torch.cuda.is_bf16_supported()`): older GPUs need fp16 with a
    `torch.amp.GradScaler`, which this fix does not write. Mixed precision can also use more
    memory with small batches (the fp32 weights stay, bf16 copies are added). `BCELoss` and
    `binary_cross_entropy` raise under autocast ("unsafe to autocast"): a script using them gets
    no fix until it moves to `BCEWithLogitsLoss` on the logits. Autocast runs cuDNN LSTM, GRU
    and RNN layers in fp16 whatever dtype is asked for (PyTorch's `_cudnn_rnn` autocast wrapper;
    cuDNN had no bf16 RNNs before 9.13), which needs a `GradScaler`: scripts with those layers
    get no fix either. The fix wraps the
    statements from the model call to the loss that `backward()` uses, when they sit next to it
    in the same block; elsewhere the finding has no fix. Verify with `speedfix apply --verify`.

    ## Measured effect
    PyTorch's performance tuning guide: mixed precision gives "up to 3x overall speedup on Volta
    and newer GPU architectures"; Lightning's docs report up to 3x; the PyTorch 2.0 release
    measured larger `torch.compile` gains with AMP (51%) than in fp32 (21%).
    Sources: https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html,
    https://pytorch.org/get-started/pytorch-2.0/
    """

    code = "SF202"
    name = "no-mixed-precision"
    summary = "CUDA training loop whose forward pass runs in fp32 (no autocast)"
    severity = Severity.WARNING
    requires = (b"backward",)
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.NUMERICS
    fix_title = 'Run the forward pass and loss under `torch.autocast("cuda", dtype=torch.bfloat16)`'
    gpu_only = True
    min_torch = v("1.10")
    effect = "bf16 matmuls and convolutions on tensor cores: up to 3x per the PyTorch tuning guide."

    VALID = [
        Valid(  # already mixed precision
            """
            import torch
            model = Net().cuda()
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = criterion(model(x.cuda()), y.cuda())
                loss.backward()
                opt.step()
            """
        ),
        Valid(  # a context chosen at run time (nanoGPT) counts too
            """
            import torch
            from contextlib import nullcontext
            ctx = nullcontext() if device == "cpu" else torch.amp.autocast(device_type="cuda", dtype=torch.bfloat16)
            for step in range(1000):
                with ctx:
                    loss = model(x.cuda(), y.cuda())
                loss.backward()
                opt.step()
            """
        ),
        Valid(  # the model itself is converted to half precision
            """
            import torch
            model = Net().cuda().half()
            for x, y in loader:
                loss = criterion(model(x.cuda()), y.cuda())
                loss.backward()
                opt.step()
            """
        ),
        Valid(  # a CPU script: no GPU advice
            """
            import torch
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                opt.step()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn.functional as F

            model = Net().cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
                optimizer.zero_grad()
                # forward
                output = model(x)
                loss = F.cross_entropy(output, y)
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            import torch.nn.functional as F

            model = Net().cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
                optimizer.zero_grad()
                # forward
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    output = model(x)
                    loss = F.cross_entropy(output, y)
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # the step in a function, the file's own alias, a scaled loss for accumulation
            """
            import torch as T

            def train_step(net, batch, opt):
                inputs, labels = batch
                logits = net(inputs.to('cuda'))
                loss = T.nn.functional.cross_entropy(logits, labels.to('cuda'))
                loss = loss / 4
                loss.backward()
                opt.step()

            for batch in loader:
                train_step(net, batch, opt)
            """,
            fixed="""
            import torch as T

            def train_step(net, batch, opt):
                inputs, labels = batch
                with T.autocast('cuda', dtype=T.bfloat16):
                    logits = net(inputs.to('cuda'))
                    loss = T.nn.functional.cross_entropy(logits, labels.to('cuda'))
                    loss = loss / 4
                loss.backward()
                opt.step()

            for batch in loader:
                train_step(net, batch, opt)
            """,
        ),
        Invalid(  # two optimisers (a GAN): each forward gets its own block, in one finding
            """
            import torch
            opt_d = torch.optim.Adam(disc.parameters())
            opt_g = torch.optim.Adam(gen.parameters())
            for real in loader:
                real = real.cuda()
                fake = gen(noise())
                loss_d = disc(real).mean() - disc(fake.detach()).mean()
                loss_d.backward()
                opt_d.step()
                loss_g = -disc(fake).mean()
                loss_g.backward()
                opt_g.step()
            """,
            fixed="""
            import torch
            opt_d = torch.optim.Adam(disc.parameters())
            opt_g = torch.optim.Adam(gen.parameters())
            for real in loader:
                real = real.cuda()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    fake = gen(noise())
                    loss_d = disc(real).mean() - disc(fake.detach()).mean()
                loss_d.backward()
                opt_d.step()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss_g = -disc(fake).mean()
                loss_g.backward()
                opt_g.step()
            """,
        ),
        Invalid(  # BCELoss raises under autocast: reported, no fix
            """
            import torch
            criterion = torch.nn.BCELoss()
            for x, y in loader:
                output = disc(x.cuda())
                loss = criterion(output, y.cuda())
                loss.backward()
                opt.step()
            """,
        ),
        Invalid(  # a cuDNN LSTM would run in fp16 and need a GradScaler: no fix
            """
            import torch
            lstm = torch.nn.LSTM(8, 16, batch_first=True).cuda()
            for x, y in loader:
                output, _ = lstm(x.cuda())
                loss = criterion(output, y.cuda())
                loss.backward()
                opt.step()
            """,
        ),
        Invalid(  # only the loss is next to backward, the model call is in an if/else: no fix
            """
            import torch
            for x, y in loader:
                if stateful:
                    output, hidden = model(x.cuda(), hidden)
                else:
                    output = model(x.cuda())
                loss = criterion(output, y.cuda())
                loss.backward()
                opt.step()
            """,
        ),
        Invalid(  # the loss is computed in another block: reported, no fix
            """
            import torch
            for x, y in loader:
                if use_aux:
                    loss = model(x.cuda()).sum() + aux(x.cuda())
                else:
                    loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
            """,
        ),
    ]

    def finish(self) -> None:
        ctx = self.ctx
        scaler = any(name.endswith("GradScaler") for name in ctx.calls_by_qualname)
        if uses_autocast(ctx) or ctx.mentions_low_precision or scaler:
            return
        by_block: dict[int, list[tuple[CallSite, tuple[cst.CSTNode, list[cst.BaseStatement]] | None]]] = defaultdict(list)
        for site in ctx.method_calls("backward"):
            # `fabric.backward(loss)`, `accelerator.backward(loss)`: the framework owns the precision
            if site.node.args and site.node.args[0].keyword is None or not ctx.in_training_loop(site.stack):
                continue
            owner = statement_owner(ctx, site.statement) if site.statement is not None else None
            key = id(owner[0]) if owner is not None else id(site.node)
            by_block[key].append((site, owner))
        for sites in by_block.values():
            self._report_block([site for site, _ in sites], sites[0][1])

    # ------------------------------------------------------------------ the fix
    def _report_block(
        self,
        sites: list[CallSite],
        owner: tuple[cst.CSTNode, list[cst.BaseStatement]] | None,
    ) -> None:
        first = sites[0]
        receiver = dotted_name(first.node.func.value) if isinstance(first.node.func, cst.Attribute) else None
        message = f"`{receiver or 'loss'}.backward()` follows a forward pass in fp32: no mixed precision (autocast)"
        block = getattr(owner[0], "body", None) if owner is not None else None
        if owner is None or not isinstance(block, cst.IndentedBlock):
            self.report(first.node, message, no_fix_reason="the backward call is not a statement of its own")
            return
        if self.ctx.calls_to(*_BANNED_UNDER_AUTOCAST):
            self.report(first.node, message, no_fix_reason=_BCE_REASON)
            return
        if self.ctx.calls_to(*_CUDNN_RNNS):
            self.report(first.node, message, no_fix_reason=_RNN_REASON)
            return
        statements = owner[1]
        ranges = [self._forward_range(statements, site) for site in sites]
        if any(r is None for r in ranges):
            self.report(first.node, message, no_fix_reason="the model call and the loss are not next to the backward call")
            return
        ops: list[FixOp] = []
        context = (
            f"{reference(self.ctx, 'torch.autocast', ops, first.stack)}({string_literal(self.ctx, 'cuda')}, "
            f"dtype={reference(self.ctx, 'torch.bfloat16', ops, first.stack)})"
        )
        spans = [r for r in ranges if r is not None]
        ops.insert(0, Transform(block, lambda updated: _wrap(updated, spans, context)))
        self.report(first.node, message, fix_ops=ops, restructures=block)

    def _forward_range(self, statements: list[cst.BaseStatement], site: CallSite) -> tuple[int, int] | None:
        """(first, last) indices of the statements computing the loss that ``site`` differentiates."""
        index = next((i for i, s in enumerate(statements) if s is site.statement), None)
        func = site.node.func
        if index is None or not isinstance(func, cst.Attribute) or len(site.statement.body) != 1:
            return None
        loss = _loss_name(func.value)
        if loss is None:
            return None
        end = next((i for i in range(index - 1, -1, -1) if loss in _assigned(statements[i])), None)
        if end is None:
            return None
        needed = _read_names(statements[end])
        start = end
        for i in range(end - 1, -1, -1):
            candidate = statements[i]
            if not (_assigned(candidate) & needed) or not _computes(candidate):
                break
            needed |= _read_names(candidate)
            start = i
        while start <= end and not self._calls_model(statements[start]):
            start += 1
        if start > end or any(_steps(statements[i]) for i in range(start, end + 1)):
            return None
        return start, end

    def _calls_model(self, statement: cst.BaseStatement) -> bool:
        """Does ``statement`` call the model (a local object that is not the loss function)?"""
        for node in walk_expression(statement):
            if isinstance(node, cst.Call):
                name = dotted_name(node.func)
                if self._is_local_object(name) and not _LOSS_NAME.search(name or ""):
                    return True
        return False

    def _is_local_object(self, name: str | None) -> bool:
        """`model(x)`, `self.net(x)`: a call of an object (the model, a loss module), not of an
        import, a def, a class or a builtin."""
        if name is None:
            return False
        root = name.split(".")[0]
        if root == "self":
            return name.count(".") == 1
        if "." in name or self.ctx.imports.resolve(root) is not None:
            return False
        return root not in self.ctx.functions and root not in self.ctx.classes and not hasattr(builtins, root)


_BCE_REASON = (
    "`BCELoss`/`binary_cross_entropy` raise under autocast: "
    "use `BCEWithLogitsLoss` on the logits (drop the final sigmoid) first"
)


_RNN_REASON = (
    "autocast runs cuDNN LSTM/GRU/RNN layers in fp16 whatever dtype is asked for, "
    "which needs a GradScaler: no automatic fix"
)


def _wrap(block: cst.CSTNode, spans: list[tuple[int, int]], context: str) -> cst.CSTNode:
    # The fix restructures this block, so no other fix touches it in the same pass: the indices
    # computed from the analysed block still hold.
    assert isinstance(block, cst.IndentedBlock)
    body = list(block.body)
    for start, end in sorted(set(spans), reverse=True):
        moved = body[start : end + 1]
        head = moved[0]
        inner = [head.with_changes(leading_lines=[]), *moved[1:]]
        body[start : end + 1] = [
            cst.With(
                items=[cst.WithItem(cst.parse_expression(context))],
                body=cst.IndentedBlock(body=inner),
                leading_lines=head.leading_lines,
            )
        ]
    return block.with_changes(body=body)


def _loss_name(receiver: cst.BaseExpression) -> str | None:
    """`loss` in `loss.backward()` and `(loss / accum).backward()`."""
    if isinstance(receiver, cst.BinaryOperation):
        receiver = receiver.left
    return dotted_name(receiver)


def _assigned(statement: cst.BaseStatement) -> set[str]:
    if not isinstance(statement, cst.SimpleStatementLine):
        return set()
    names: set[str] = set()
    for small in statement.body:
        if isinstance(small, cst.Assign):
            for target in small.targets:
                names.update(target_names(target.target))
        elif isinstance(small, (cst.AugAssign, cst.AnnAssign)):
            names.update(target_names(small.target))
    return names


def _read_names(statement: cst.BaseStatement) -> set[str]:
    names: set[str] = set()
    for node in walk_expression(statement):
        if isinstance(node, (cst.Name, cst.Attribute)):
            name = dotted_name(node)
            if name:
                names.add(name)
    return names


def _computes(statement: cst.BaseStatement) -> bool:
    """Does the statement call anything besides moving or reshaping data?"""
    for node in walk_expression(statement):
        if isinstance(node, cst.Call):
            if not (isinstance(node.func, cst.Attribute) and node.func.attr.value in _DATA_MOVES):
                return True
    return False


def _steps(statement: cst.BaseStatement) -> bool:
    return any(
        isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in _STEP_CALLS
        for node in walk_expression(statement)
    )
