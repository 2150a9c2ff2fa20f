from __future__ import annotations

import libcst as cst

from speedfix.engine.findings import Applicability, Category, LossCheck, Severity
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import insert_before, statement
from speedfix.model.index import CallSite
from speedfix.syntax.blocks import statement_owner
from speedfix.syntax.nodes import code_of, walk_expression

_CLIP = tuple(
    f"torch.nn.utils.{module}{name}"
    for module in ("", "clip_grad.")
    for name in ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_grad_value")
)


class ClipBeforeUnscale(Rule):
    """
    ## What it does
    Finds gradient clipping (`clip_grad_norm_`, `clip_grad_value_`) after
    `scaler.scale(loss).backward()` and before `scaler.step(optimizer)` without
    `scaler.unscale_(optimizer)` in between.

    ## Why is this bad?
    A `GradScaler` multiplies the loss, and so every gradient, by its scale factor (65536 at the
    start). Clipping those gradients compares the scaled norm with the threshold: the norm is
    almost always far above it, so every step is clipped to a tiny fraction of the intended
    update, and the clipping threshold no longer means what the script says. PyTorch's AMP
    examples ("Working with Unscaled Gradients") call `scaler.unscale_(optimizer)` first; the
    scaler then skips its own unscaling in `step`, so nothing is done twice.

    ## Example
    ```python
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    ```

    ## Use instead
    ```python
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    ```

    ## Fix safety
    Unsafe: it changes the training (to what the script meant). Updates get larger once the
    clipping stops shrinking them; a learning rate tuned around the bug may need retuning. The fix
    inserts `scaler.unscale_(optimizer)` with the optimizer that the following `scaler.step(...)`
    takes; without such a call in the same block there is no fix.

    ## Impact
    High: a correctness bug; the clipping threshold is compared with scaled gradients, so the
    gradients are clipped at the wrong norm. Nothing moves it.

    ## Measured effect
    A correctness rule, not a speed rule: it restores the clipping the script asks for. pytorch/
    examples' minGPT-DDP trainer clips scaled gradients this way; nanoGPT unscales first.
    Sources: https://pytorch.org/docs/stable/notes/amp_examples.html#working-with-unscaled-gradients,
    https://github.com/pytorch/examples/blob/main/distributed/minGPT-ddp/mingpt/trainer.py
    """

    impact = "high"
    code = "SF205"
    name = "clip-before-unscale"
    summary = "Gradient clipping of GradScaler-scaled gradients (no `scaler.unscale_` first)"
    severity = Severity.ERROR
    category = Category.CORRECTNESS
    requires = (b"clip_grad",)
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.NUMERICS
    fix_title = "Unscale the gradients first: `scaler.unscale_(optimizer)` before clipping"
    effect = "Correctness: clipping acts on the real gradients again."

    VALID = [
        Valid(  # unscaled first (nanoGPT)
            """
            import torch
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            """
        ),
        Valid(  # no scaler: nothing to unscale
            """
            import torch
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            """
        ),
        Valid(  # clipping after the step is a different (odd) thing
            """
            import torch
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            """
        ),
    ]
    INVALID = [
        Invalid(  # pytorch/examples minGPT-DDP
            """
            import torch

            def run_batch(self, loss):
                if self.use_amp:
                    self.scaler.scale(loss).backward()
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                else:
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
                    self.optimizer.step()
            """,
            fixed="""
            import torch

            def run_batch(self, loss):
                if self.use_amp:
                    self.scaler.scale(loss).backward()
                    self.scaler.unscale_(self.optimizer)
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                else:
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
                    self.optimizer.step()
            """,
        ),
        Invalid(  # optional clipping, imported by name; the comment stays above the new line
            """
            from torch.nn.utils import clip_grad_value_
            for x, y in loader:
                scaler.scale(model(x, y)).backward()
                # keep updates bounded
                if max_grad is not None:
                    clip_grad_value_(model.parameters(), max_grad)
                scaler.step(opt)
                scaler.update()
            """,
            fixed="""
            from torch.nn.utils import clip_grad_value_
            for x, y in loader:
                scaler.scale(model(x, y)).backward()
                # keep updates bounded
                scaler.unscale_(opt)
                if max_grad is not None:
                    clip_grad_value_(model.parameters(), max_grad)
                scaler.step(opt)
                scaler.update()
            """,
        ),
        Invalid(  # the step is elsewhere: reported, no fix
            """
            import torch
            scaler.scale(loss).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            finish_step(scaler, optimizer)
            """,
        ),
    ]

    def finish(self) -> None:
        clips = {site.node for site in self.ctx.calls_to(*_CLIP)}
        if not clips:
            return
        for site in self.ctx.method_calls("backward"):
            scaler = _scaler_of(site)
            if scaler is not None:
                self._check_after(site, scaler, clips)

    def _check_after(self, backward: CallSite, scaler: str, clips: set[cst.CSTNode]) -> None:
        owner = statement_owner(self.ctx, backward.statement) if backward.statement is not None else None
        if owner is None:
            return
        statements = owner[1]
        start = next(i for i, s in enumerate(statements) if s is backward.statement) + 1
        clipped: tuple[cst.BaseStatement, cst.Call] | None = None
        for node in statements[start:]:
            calls = [n for n in walk_expression(node) if isinstance(n, cst.Call)]
            if any(_method_of(call, scaler) in ("unscale_", "step") for call in calls) and clipped is None:
                return  # unscaled (or stepped) before any clipping
            if clipped is None:
                clip = next((call for call in calls if call in clips), None)
                if clip is not None:
                    clipped = (node, clip)
                continue
            step = next((call for call in calls if _method_of(call, scaler) == "step" and call.args), None)
            if step is not None:
                optimizer = code_of(step.args[0].value)
                new = statement(f"{scaler}.unscale_({optimizer})")
                self.report(clipped[1], _message(clipped[1]), fix_ops=[insert_before(clipped[0], new)])
                return
        if clipped is not None:
            self.report(clipped[1], _message(clipped[1]), no_fix_reason="no `scaler.step(optimizer)` follows in the same block")


def _scaler_of(site: CallSite) -> str | None:
    """`scaler` in `scaler.scale(loss).backward()`."""
    func = site.node.func
    if not isinstance(func, cst.Attribute) or not isinstance(func.value, cst.Call):
        return None
    inner = func.value.func
    if isinstance(inner, cst.Attribute) and inner.attr.value == "scale":
        return code_of(inner.value)
    return None


def _method_of(call: cst.Call, receiver: str) -> str | None:
    func = call.func
    if isinstance(func, cst.Attribute) and code_of(func.value) == receiver:
        return func.attr.value
    return None


def _message(clip: cst.Call) -> str:
    name = code_of(clip.func).rsplit(".", 1)[-1]
    return f"`{name}` clips the gradients while they are still multiplied by the GradScaler's scale"
