from __future__ import annotations

import libcst as cst

from speedfix.engine.findings import Applicability, Category, LossCheck, Severity, Transform
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import NO_SPACE
from speedfix.model.versions import v


class CompilePositionalMode(Rule):
    """
    ## What it does
    Finds `torch.compile(model, "max-autotune")`: a compile mode passed as the second positional
    argument.

    ## Why is this bad?
    Every parameter of `torch.compile` after the model is keyword-only
    (`torch.compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None,
    ...)`), so the call raises `TypeError` before training starts. PyTorch's own Performance
    Tuning Guide shows `torch.compile(m, "reduce-overhead")`.

    ## Example
    ```python
    model = torch.compile(model, "max-autotune")
    ```

    ## Use instead
    ```python
    model = torch.compile(model, mode="max-autotune")
    ```

    ## Fix safety
    Safe: it turns a call that raises into the call that was meant.

    ## Impact
    High: a correctness bug; `torch.compile` raises `TypeError`. Nothing moves it.

    ## Measured effect
    The script runs instead of crashing; the speed is then the compile mode's.
    Source: https://docs.pytorch.org/docs/stable/generated/torch.compile.html
    """

    impact = "high"
    code = "SF502"
    name = "compile-positional-mode"
    summary = "`torch.compile(m, \"mode\")`: the mode must be a keyword (TypeError)"
    severity = Severity.ERROR
    category = Category.CORRECTNESS
    requires = (b"compile",)
    fix_applicability = Applicability.SAFE
    loss_check = LossCheck.EXACT
    fix_title = "Pass the mode as `mode=`"
    min_torch = v("2.0")
    effect = "Turns a TypeError at start-up into the intended compile mode."

    VALID = [
        Valid('import torch\nmodel = torch.compile(model, mode="reduce-overhead")\n'),
        Valid('from mylib import compile\nmodel = compile(model, "fast")\n'),
    ]
    INVALID = [
        Invalid(
            'import torch as T\nmodel = T.compile(model, "max-autotune")\n',
            fixed='import torch as T\nmodel = T.compile(model, mode="max-autotune")\n',
        ),
    ]

    def finish(self) -> None:
        for site in self.ctx.calls_to("torch.compile"):
            args = site.node.args
            if len(args) < 2 or args[1].keyword is not None or args[1].star:
                continue
            if not isinstance(args[1].value, (cst.SimpleString, cst.ConcatenatedString)):
                continue
            self.report(
                args[1].value,
                "`torch.compile` takes the mode as a keyword: this call raises TypeError",
                fix_ops=[Transform(site.node, _mode_as_keyword)],
            )


def _mode_as_keyword(call: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(call, cst.Call)
    args = list(call.args)
    args[1] = args[1].with_changes(
        keyword=cst.Name("mode"), equal=cst.AssignEqual(whitespace_before=NO_SPACE, whitespace_after=NO_SPACE)
    )
    return call.with_changes(args=args)
