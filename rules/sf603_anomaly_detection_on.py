from __future__ import annotations

import libcst as cst

from speedfix.engine.findings import Applicability, FixOp, LossCheck, Severity, Transform
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import find_arg, remove_arg
from speedfix.fixes.removal import NOT_ALONE, call_removal
from speedfix.model.arguments import find_argument, literal_bool
from speedfix.model.index import CallSite

_SET = ("torch.autograd.set_detect_anomaly", "torch.autograd.anomaly_mode.set_detect_anomaly")
_CONTEXT = ("torch.autograd.detect_anomaly", "torch.autograd.anomaly_mode.detect_anomaly")
_TRAINERS = ("lightning.Trainer", "lightning.pytorch.Trainer", "pytorch_lightning.Trainer")


class AnomalyDetectionOn(Rule):
    """
    ## What it does
    Finds autograd anomaly detection left on in training code:
    `torch.autograd.set_detect_anomaly(True)`, `with torch.autograd.detect_anomaly():` and
    Lightning's `Trainer(detect_anomaly=True)`.

    ## Why is this bad?
    Anomaly mode records a Python traceback for every autograd node in the forward pass and
    checks every backward result for NaN, which syncs the GPU after each backward function. It
    is a debugging tool; PyTorch's Tuning Guide lists it under "Disable debugging APIs".

    ## Example
    ```python
    torch.autograd.set_detect_anomaly(True)
    trainer = L.Trainer(max_epochs=10, detect_anomaly=True)
    ```

    ## Use instead
    ```python
    trainer = L.Trainer(max_epochs=10)
    ```

    ## Fix safety
    Unsafe: some runs rely on it to stop at the first NaN with a traceback (Lightning calls it
    "meant for development only", Lightning#20708). The fix removes the call, unwraps the `with`
    block (its body stays, one level less indented) and drops the Trainer argument; values that are
    not a literal `True` (`set_detect_anomaly(args.debug)`) are not reported.

    ## Impact
    High: anomaly detection records a traceback for every operation and checks every backward's
    result, which makes training several times slower. Nothing moves it.

    ## Measured effect
    22 s against 52-57 s per epoch (about 2.4x) in an ignite report; 2.5x and 3x in Lightning
    issues.
    Sources: https://github.com/pytorch/ignite/pull/219, https://github.com/Lightning-AI/pytorch-lightning/issues/17359
    """

    impact = "high"
    code = "SF603"
    name = "anomaly-detection-on"
    summary = "Autograd anomaly detection left on (`set_detect_anomaly(True)`, `detect_anomaly()`)"
    severity = Severity.WARNING
    requires = (b"anomaly",)
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.EXACT
    fix_title = "Turn anomaly detection off"
    effect = "No traceback capture and NaN check per autograd node: 2.4-3x in reports."

    VALID = [
        Valid("import torch\ntorch.autograd.set_detect_anomaly(args.debug)\n"),
        Valid("import torch\ntorch.autograd.set_detect_anomaly(False)\n"),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import lightning as L

            torch.autograd.set_detect_anomaly(True)
            trainer = L.Trainer(max_epochs=10, detect_anomaly=True)
            """,
            fixed="""
            import torch
            import lightning as L

            trainer = L.Trainer(max_epochs=10)
            """,
            count=2,
        ),
        Invalid(
            """
            import torch
            for x, y in loader:
                with torch.autograd.detect_anomaly():
                    loss = model(x).sum()
                    loss.backward()
                opt.step()
            """,
            fixed="""
            import torch
            for x, y in loader:
                loss = model(x).sum()
                loss.backward()
                opt.step()
            """,
        ),
    ]

    def finish(self) -> None:
        ctx = self.ctx
        for site in ctx.calls_to(*_SET):
            mode = find_argument(ctx, site, "mode", 0)
            if literal_bool(ctx, mode.node, site.stack) is not True:
                continue
            self.report(site.node, "autograd anomaly detection is on: every backward step is checked and traced",
                        fix_ops=call_removal(ctx, site), no_fix_reason=NOT_ALONE)
        for info in ctx.withs:
            for item in info.node.items:
                call = item.item
                if isinstance(call, cst.Call) and ctx.qualname(call.func) in _CONTEXT:
                    self.report(call, "`detect_anomaly()` traces and checks every autograd step in this block",
                                fix_ops=self._unwrap(info.node), no_fix_reason="the `with` has other items")
        for site in ctx.calls_to(*_TRAINERS):
            self._check_trainer(site)

    def _unwrap(self, node: cst.With) -> list[FixOp] | None:
        if len(node.items) != 1 or not isinstance(node.body, cst.IndentedBlock) or node.asynchronous:
            return None

        def unwrap(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.With) and isinstance(updated.body, cst.IndentedBlock)
            statements = list(updated.body.body)
            statements[0] = statements[0].with_changes(
                leading_lines=[*updated.leading_lines, *statements[0].leading_lines]
            )
            return cst.FlattenSentinel(statements)

        return [Transform(node, unwrap)]

    def _check_trainer(self, site: CallSite) -> None:
        arg = find_argument(self.ctx, site, "detect_anomaly")
        if arg.arg is None or literal_bool(self.ctx, arg.node, site.stack) is not True:
            return
        original = arg.arg
        self.report(
            arg.arg,
            "`Trainer(detect_anomaly=True)` traces and checks every autograd step",
            fix_ops=[Transform(site.node, lambda call: remove_arg(call, find_arg(call, original) or original))],
        )
