from __future__ import annotations

import libcst as cst

from speedfix.engine.findings import Applicability, FixOp, LossCheck, Severity, Transform
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import reference
from speedfix.model.flow import enclosing_statements, int_in_every_run
from speedfix.model.forward import backward_calls, read_names, statement_block, steps, wrap
from speedfix.model.frames import FrameKind
from speedfix.model.index import CallSite
from speedfix.model.networks import DISTRIBUTED_DATA_PARALLEL
from speedfix.project.steps import SYNC_SWITCHES
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import code_of, negated_code, target_names, walk_expression


class DdpAccumulationWithoutNoSync(Rule):
    """
    ## What it does
    Finds gradient accumulation on a `DistributedDataParallel` model that all-reduces the
    gradients on every micro-step: `loss.backward()` on every batch and `optimizer.step()` only
    under `if (i + 1) % accum == 0:` (or after an inner `for micro_step in range(accum):` loop),
    with no `model.no_sync()` and no `model.require_backward_grad_sync = ...` toggle (nanoGPT's
    way) anywhere in the script, nor in a function of another scanned file it calls (NVlabs'
    `with misc.ddp_sync(ddp, sync):` enters `no_sync()` itself). Not where the accumulation
    count is 1 in every run (`--accumulation_steps` with a default of 1 that no launch command
    of the project changes): then every micro-step is a step.

    ## Why is this bad?
    DDP starts an all-reduce of the gradients during every `backward()`. With accumulation only
    the sum over the micro-steps is used, at the optimizer step, so all but the last of those
    all-reduces move the gradients over the network for nothing: (N-1)/N of the gradient
    communication. `model.no_sync()` keeps the gradients local on the other micro-steps; the
    last backward then all-reduces the accumulated sum. DDP's documentation and PyTorch's tuning
    guide recommend exactly this.

    ## Example
    ```python
    model = DDP(model, device_ids=[rank])
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y) / accum
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    model = DDP(model, device_ids=[rank])
    for i, (x, y) in enumerate(loader):
        with (model.no_sync() if (i + 1) % accum != 0 else contextlib.nullcontext()):
            loss = criterion(model(x), y) / accum
            loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Fix safety
    Unsafe: the gradients are summed in another order (locally first, then across processes),
    so they can differ in the last bits. The forward pass goes inside `no_sync()` too (DDP
    prepares the reduction in the forward): the fix wraps the statements from the first use of
    the DDP model to the backward call. It is written where the accumulation condition
    is explicit: the step's `if` test (negated, when nothing between the forward pass and that
    `if` changes what it reads) or `range(N)` of the micro-step loop (`micro_step < N - 1`), and
    only when the model is wrapped in DDP on every path, in the function of the loop: `no_sync`
    does not exist on a model that is not wrapped (a single-GPU run of a script that wraps only
    `if args.distributed:`). Elsewhere the finding has no fix. The backward calls of one
    accumulation (an fp16 branch and a plain one) are one finding.

    ## Impact
    High: an all-reduce of every gradient on every micro-step instead of once per optimizer
    step. Nothing moves it.

    ## Measured effect
    (N-1)/N fewer gradient all-reduces; speechbrain measured 10-20% faster training with DDP and
    gradient accumulation, more across nodes.
    Sources: https://github.com/speechbrain/speechbrain/pull/1449,
    https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
    """

    impact = "high"
    code = "SF802"
    name = "ddp-accumulation-without-no-sync"
    summary = "DDP gradient accumulation that all-reduces on every micro-step (no `no_sync()`)"
    severity = Severity.WARNING
    requires = (b"DistributedDataParallel",)
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.NUMERICS
    fix_title = "Skip the all-reduce on non-final micro-steps with `model.no_sync()`"
    effect = "(N-1)/N fewer gradient all-reduces: 10-20% in speechbrain."

    VALID = [
        Valid(  # an accumulation count of 1 by default, and no launch command of the project changes it
            """
            import argparse
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            parser = argparse.ArgumentParser()
            parser.add_argument("--accumulation_steps", type=int, default=1)
            args = parser.parse_args()
            model = DDP(model)
            for step, (x, y) in enumerate(loader, start=1):
                loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda()) / args.accumulation_steps
                loss.backward()
                if step % args.accumulation_steps == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """
        ),
        Valid(  # nanoGPT's toggle
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            if ddp:
                model = DDP(model, device_ids=[ddp_local_rank])
            while True:
                for micro_step in range(gradient_accumulation_steps):
                    if ddp:
                        model.require_backward_grad_sync = (micro_step == gradient_accumulation_steps - 1)
                    with ctx:
                        logits, loss = model(X, Y)
                        loss = loss / gradient_accumulation_steps
                    scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            """
        ),
        Valid(  # `no_sync` chosen in a variable (yolov5-style)
            """
            import contextlib
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model)
            for i, (x, y) in enumerate(loader):
                sync_context = model.no_sync if (i + 1) % accum else contextlib.nullcontext
                with sync_context():
                    criterion(model(x), y).backward()
                if (i + 1) % accum == 0:
                    optimizer.step()
            """
        ),
        Valid(  # no accumulation: every backward is followed by a step
            """
            import torch
            model = torch.nn.parallel.DistributedDataParallel(model)
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP

            def train(rank, net, loader, accum_steps):
                model = DDP(net.to(rank), device_ids=[rank])
                optimizer = torch.optim.AdamW(model.parameters())
                for i, (x, y) in enumerate(loader):
                    output = model(x.to(rank))
                    loss = criterion(output, y.to(rank)) / accum_steps
                    loss.backward()
                    if (i + 1) % accum_steps == 0:
                        optimizer.step()
                        optimizer.zero_grad()
            """,
            fixed="""
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            import contextlib

            def train(rank, net, loader, accum_steps):
                model = DDP(net.to(rank), device_ids=[rank])
                optimizer = torch.optim.AdamW(model.parameters())
                for i, (x, y) in enumerate(loader):
                    with (model.no_sync() if (i + 1) % accum_steps != 0 else contextlib.nullcontext()):
                        output = model(x.to(rank))
                        loss = criterion(output, y.to(rank)) / accum_steps
                        loss.backward()
                    if (i + 1) % accum_steps == 0:
                        optimizer.step()
                        optimizer.zero_grad()
            """,
        ),
        Invalid(  # micro-steps in an inner loop, autocast and a GradScaler
            """
            import torch
            from contextlib import nullcontext
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(model, device_ids=[local_rank])
            for it in range(max_iters):
                for micro_step in range(grad_accum):
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        logits, loss = model(X, Y)
                        loss = loss / grad_accum
                    X, Y = get_batch("train")
                    scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
            """,
            fixed="""
            import torch
            from contextlib import nullcontext
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(model, device_ids=[local_rank])
            for it in range(max_iters):
                for micro_step in range(grad_accum):
                    with (model.no_sync() if micro_step < grad_accum - 1 else nullcontext()):
                        with torch.autocast("cuda", dtype=torch.bfloat16):
                            logits, loss = model(X, Y)
                            loss = loss / grad_accum
                        X, Y = get_batch("train")
                        scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
            """,
        ),
        Invalid(  # the forward pass in a helper that gets the DDP model (a DPO trainer)
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            import contextlib

            def train(args, model, loader, local_rank):
                ddp_model = DDP(model, device_ids=[local_rank])
                for step, batch in enumerate(loader):
                    loss = compute_dpo_loss(ddp_model, batch, beta=args.beta)
                    loss = loss / args.accum
                    loss.backward()
                    if (step + 1) % args.accum == 0:
                        optimizer.step()
                        optimizer.zero_grad()
            """,
            fixed="""
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            import contextlib

            def train(args, model, loader, local_rank):
                ddp_model = DDP(model, device_ids=[local_rank])
                for step, batch in enumerate(loader):
                    with (ddp_model.no_sync() if (step + 1) % args.accum != 0 else contextlib.nullcontext()):
                        loss = compute_dpo_loss(ddp_model, batch, beta=args.beta)
                        loss = loss / args.accum
                        loss.backward()
                    if (step + 1) % args.accum == 0:
                        optimizer.step()
                        optimizer.zero_grad()
            """,
        ),
        Invalid(  # DDP only when distributed: `no_sync` would not exist otherwise, no fix
            """
            import torch
            if args.distributed:
                model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
            for i, (x, y) in enumerate(loader):
                loss = criterion(model(x), y) / args.accum
                loss.backward()
                if (i + 1) % args.accum == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """,
        ),
        Invalid(  # the step counter changes after the backward: the condition cannot move, no fix
            """
            import torch
            model = torch.nn.parallel.DistributedDataParallel(model)
            step = 0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                step += 1
                if step % accum == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """,
        ),
        Invalid(  # apex's scaled loss or a plain backward, by an option: one accumulation, one finding
            """
            import torch
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.local_rank])
            for step, (x, y) in enumerate(loader):
                loss = criterion(model(x.cuda()), y.cuda()) / args.accum
                if args.fp16:
                    with amp.scale_loss(loss, optimizer) as scaled:
                        scaled.backward()
                else:
                    loss.backward()
                if (step + 1) % args.accum == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """,
        ),
    ]

    def __init__(self, ctx) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx)
        self._switched = False

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value in SYNC_SWITCHES:
            self._switched = True

    def finish(self) -> None:
        ctx = self.ctx
        wraps = ctx.calls_to(*DISTRIBUTED_DATA_PARALLEL)
        if not wraps or self._switched or self._switched_by_a_helper():
            return
        steps_ = [s for s in ctx.method_calls("step") if ctx.is_optimizer_like(s.node.func.value, s.stack)]  # type: ignore[attr-defined]
        # One finding per accumulation: the backward calls of an `if args.fp16: ... else: ...` (or
        # of two losses) that the same optimizer-step condition gates are one piece of advice.
        groups: dict[int, tuple[tuple[str, cst.CSTNode], list[CallSite]]] = {}
        for site in backward_calls(ctx):
            condition = self._accumulation(site, steps_)
            if condition is not None:
                groups.setdefault(id(condition[1]), (condition, []))[1].append(site)
        for condition, sites in groups.values():
            ops, reason = self._fixes(sites, condition, wraps)
            self.report(
                sites[0].node,
                "`backward()` all-reduces the gradients on every micro-step of gradient accumulation: "
                "only the last one before the optimizer step needs to (`model.no_sync()`)",
                fix_ops=ops,
                no_fix_reason=reason,
            )

    def _switched_by_a_helper(self) -> bool:
        """A function of another scanned file that the script calls switches the all-reduce
        (`with misc.ddp_sync(ddp, sync):`, which enters `module.no_sync()` when not syncing)."""
        return any((callee := self.ctx.project_callee(site)) is not None and callee.switches_sync
                   for site in self.ctx.calls)

    # ------------------------------------------------------------------ detection
    def _accumulation(self, backward: CallSite, step_sites: list[CallSite]) -> tuple[str, cst.CSTNode] | None:
        """("guard", the step's `if`) or ("loop", the micro-step loop) when ``backward`` runs on
        micro-steps that the optimizer step does not follow; None otherwise."""
        ctx = self.ctx
        loop = ctx.nearest_loop(backward.stack)
        if loop is None:
            return None
        same_loop = [s for s in step_sites if ctx.nearest_loop(s.stack) is loop]
        for site in same_loop:
            guard = _guard_between(site, loop)
            if guard is not None:
                if self._steps_every_time(guard, site):
                    return None  # `step % args.accumulation_steps == 0` with 1 in every run
                return "guard", guard
        if same_loop:
            return None  # a step on every iteration
        outer = ctx.nearest_loop(ctx.loops[loop].stack)
        if outer is not None and any(ctx.nearest_loop(s.stack) is outer for s in step_sites):
            return "loop", loop
        return None

    def _steps_every_time(self, guard: cst.If, site: CallSite) -> bool:
        """Is every modulo of the guard's test by a count that is 1 in every run?"""
        divisors = [node.right for node in walk_expression(guard.test)
                    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo)]
        return bool(divisors) and all(int_in_every_run(self.ctx, divisor, site.stack) == 1 for divisor in divisors)

    # ------------------------------------------------------------------ the fix
    def _fixes(self, sites: list[CallSite], condition: tuple[str, cst.CSTNode],
               wraps: list[CallSite]) -> tuple[list[FixOp] | None, str | None]:
        """The fix of every backward call of one accumulation (each in its own block), or why none."""
        ops: list[FixOp] = []
        blocks: set[int] = set()
        for site in sites:
            found, reason = self._fix(site, condition, wraps)
            if found is None:
                return None, reason
            block = found[0]
            if isinstance(block, Transform):
                if id(block.node) in blocks:
                    return None, "two backward calls of one accumulation share a block"
                blocks.add(id(block.node))
            ops.extend(op for op in found if op not in ops)  # one import for all of them
        return ops, None

    def _fix(self, backward: CallSite, condition: tuple[str, cst.CSTNode], wraps: list[CallSite]) -> tuple[list[FixOp] | None, str | None]:
        ctx = self.ctx
        model = self._wrapped_model(backward, wraps)
        if model is None:
            return None, "the model is not wrapped in DDP on every path of this function: `no_sync()` may not exist"
        found = statement_block(ctx, backward.statement)
        if found is None:
            return None, "the backward call is not a statement of its own"
        block, statements = found
        end = next(i for i, s in enumerate(statements) if s is backward.statement)
        # From the first use of the model (its forward pass must run under no_sync too) to the backward.
        start = next((i for i in range(end) if model in read_names(statements[i])), None)
        if start is None or len(backward.statement.body) != 1:  # type: ignore[union-attr]
            return None, f"`{model}`, the DDP model, is not used next to the backward call"
        if any(steps(statements[i]) for i in range(start, end)):
            return None, "an optimizer step sits between the forward pass and the backward call"
        kind, node = condition
        skip = self._skip_test(kind, node, statements, start)
        if skip is None:
            return None, "the accumulation condition cannot be evaluated before the forward pass"
        ops: list[FixOp] = []
        nullcontext = reference(ctx, "contextlib.nullcontext", ops, backward.stack)
        context = f"({model}.no_sync() if {skip} else {nullcontext}())"
        ops.insert(0, Transform(block, lambda updated: wrap(updated, [(start, end)], context)))
        return ops, None

    def _wrapped_model(self, backward: CallSite, wraps: list[CallSite]) -> str | None:
        """The name the DDP model is assigned to, when that happens unconditionally in the
        function (or class, for `self.model`) of the loop."""
        ctx = self.ctx
        for site in wraps:
            statement = site.statement
            small = statement.body[0] if statement is not None and len(statement.body) == 1 else None
            if not isinstance(small, cst.Assign) or len(small.targets) != 1 or small.value is not site.node:
                continue
            name = dotted_name(small.targets[0].target)
            if name is None or any(isinstance(s, (cst.If, cst.Try)) for s in enclosing_statements(ctx, statement)):
                continue
            if name.startswith("self.") and name.count(".") == 1:
                if self.ctx.class_of(site.stack) is not None and self.ctx.class_of(site.stack) is self.ctx.class_of(backward.stack):
                    return name
            elif "." not in name and ctx.function_of(site.stack) is ctx.function_of(backward.stack):
                return name
        return None

    def _skip_test(self, kind: str, node: cst.CSTNode, statements: list[cst.BaseStatement], start: int) -> str | None:
        """The condition, true on the micro-steps that skip the all-reduce, as code."""
        if kind == "loop":
            assert isinstance(node, cst.For)
            call = node.iter
            if not (isinstance(call, cst.Call) and dotted_name(call.func) == "range" and len(call.args) == 1):
                return None
            count, target = call.args[0].value, dotted_name(node.target)
            if target is None or not _pure(count):
                return None
            bound = code_of(count) if isinstance(count, (cst.Name, cst.Attribute, cst.Integer)) else f"({code_of(count)})"
            return f"{target} < {bound} - 1"
        assert isinstance(node, cst.If)
        index = next((i for i, s in enumerate(statements) if s is node), None)
        if index is None or index < start or not _pure(node.test):
            return None
        if read_names(node.test) & _assigned(statements[start:index]):
            return None
        return negated_code(node.test)


def _guard_between(site: CallSite, loop: cst.CSTNode) -> cst.If | None:
    """The periodic `if` (`(i + 1) % accum == 0`) around ``site`` inside ``loop``."""
    for frame in reversed(site.stack):
        if frame.node is loop:
            return None
        if frame.kind is FrameKind.GUARD:
            assert isinstance(frame.node, cst.If)
            return frame.node
    return None


def _pure(node: cst.CSTNode) -> bool:
    """Reads values only (`len()` aside): evaluating it earlier changes nothing."""
    return not any(
        isinstance(n, (cst.NamedExpr, cst.Await, cst.Yield)) or isinstance(n, cst.Call) and dotted_name(n.func) != "len"
        for n in walk_expression(node)
    )


def _assigned(statements: list[cst.BaseStatement]) -> set[str]:
    """Every name the statements (and anything nested in them) may assign."""
    names: set[str] = set()
    for statement in statements:
        for node in walk_expression(statement):
            if isinstance(node, cst.AssignTarget):
                names.update(target_names(node.target))
            elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
                names.update(target_names(node.target))
            elif isinstance(node, (cst.For, cst.CompFor)):
                names.update(target_names(node.target))
            elif isinstance(node, cst.NamedExpr):
                names.update(target_names(node.target))
    return names
