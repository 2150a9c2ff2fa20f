from __future__ import annotations

import libcst as cst

from speedfix.engine.findings import Applicability, LossCheck, Severity, Transform
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import append_args, keyword_arg
from speedfix.model.arguments import find_argument
from speedfix.model.index import CallSite
from speedfix.model.versions import v
from speedfix.rules._impact import Estimate, Finding, Impact, trains_adapters, trains_hub_model

_FUSABLE = (
    "torch.optim.Adam",
    "torch.optim.AdamW",
    "torch.optim.adam.Adam",
    "torch.optim.adamw.AdamW",
)
# Options that rule out, or explicitly choose, an implementation: the user decided.
_CHOSEN = ("fused", "foreach", "differentiable")


class OptimizerNotFused(Rule):
    """
    ## What it does
    Finds `torch.optim.Adam` / `AdamW` in a CUDA script created without `fused=` (and without an
    explicit `foreach=` or `differentiable=`). Never SGD.

    ## Why is this bad?
    The default multi-tensor (`foreach`) implementation still launches several kernels per
    parameter group and step; `fused=True` does the whole update in one kernel per group of
    tensors, reading and writing each parameter, gradient and state once.

    ## Example
    ```python
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    ```

    ## Use instead
    ```python
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    ```

    ## Fix safety
    Unsafe: every parameter must be a floating-point tensor on a supported device (CUDA, and the
    CPU since torch 2.4, which is why the rule targets 2.4 and newer), `fused` cannot be combined
    with `foreach` or `differentiable`, and results differ in the last bits. torch 2.0.0's fused
    AdamW gave worse losses under fp16 AMP (pytorch#96755). It can be slower on some GPUs
    (pytorch#121857, A40): benchmark it. SGD is never fused automatically: fused SGD corrupts
    momentum on GradScaler-skipped steps (LibreYOLO#771).

    ## Impact
    Low: the update is a small share of a step next to the forward and backward passes, and
    PyTorch already runs it as a few multi-tensor kernels (foreach). Medium for a Hugging Face
    transformer (`from_pretrained`, or a `transformers` model class) trained whole, whose many
    parameters make the update a larger share; a LoRA run updates its adapters only.

    ## Measured effect
    +1.5-2% MFU for Llama-8B in torchtitan; 2-3 ms per iteration in litgpt; Hugging Face made
    `adamw_torch_fused` its default optimizer for torch 2.8 and newer.
    Sources: https://github.com/pytorch/torchtitan/pull/355, https://github.com/Lightning-AI/litgpt/pull/857
    """

    impact = "low"
    code = "SF401"
    name = "optimizer-not-fused"
    summary = "Adam/AdamW on CUDA without `fused=True`"
    severity = Severity.INFO
    requires = (b"Adam",)
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.NUMERICS
    fix_title = "Use the fused implementation (`fused=True`)"
    gpu_only = True
    min_torch = v("2.4")
    effect = "One fused kernel per optimizer step: 2-3 ms/iteration in litgpt."

    VALID = [
        Valid(
            """
            import torch
            model = Net().cuda()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
            """
        ),
        Valid(  # an explicit foreach is a deliberate choice (and excludes fused)
            """
            import torch
            model = Net().cuda()
            opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
            """
        ),
        Valid(  # SGD is never fused automatically
            """
            import torch
            model = Net().cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            """
        ),
        Valid(  # unknown **kwargs may already choose
            """
            import torch
            model = Net().cuda()
            opt = torch.optim.AdamW(model.parameters(), **cfg.optim)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch import optim

            model = Net().cuda()
            optimizer = optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
            """,
            fixed="""
            import torch
            from torch import optim

            model = Net().cuda()
            optimizer = optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
            """,
        ),
    ]

    def impact_here(self, finding: Finding) -> Estimate | None:
        if trains_hub_model(self.ctx) and not trains_adapters(self.ctx):
            return Estimate(Impact.MEDIUM, "a Hugging Face transformer: many parameters to update every step")
        return None

    def finish(self) -> None:
        for site in self.ctx.calls_to(*_FUSABLE):
            if self._implementation_chosen(site):
                continue
            name = (self.ctx.call_qualname(site) or "").rsplit(".", 1)[-1]
            self.report(
                site.node,
                f"`{name}` runs its update as several kernels per step; `fused=True` does it in one",
                fix_ops=[Transform(site.node, lambda call: append_args(
                    call, keyword_arg("fused", cst.Name("True")), indent=self.ctx.module.default_indent
                ))],
            )

    def _implementation_chosen(self, site: CallSite) -> bool:
        return any(not find_argument(self.ctx, site, keyword).missing for keyword in _CHOSEN)
