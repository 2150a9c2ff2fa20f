from __future__ import annotations

import libcst as cst

from speedfix.engine.findings import Severity
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.model.arguments import find_argument, string_value
from speedfix.model.index import CallSite
from speedfix.model.versions import v

_AUTOTUNE = ("max-autotune", "max-autotune-no-cudagraphs")
_FLEX_ATTENTION = "torch.nn.attention.flex_attention.flex_attention"
# Where a compile mode is chosen: the call, and the Hugging Face Trainer's argument.
_MODE_TAKERS = {
    "torch.compile": ("mode", None),  # keyword-only (a positional mode is SF502)
    "transformers.TrainingArguments": ("torch_compile_mode", None),
    "transformers.Seq2SeqTrainingArguments": ("torch_compile_mode", None),
}


class CompileMaxAutotune(Rule):
    """
    ## What it does
    Notes `torch.compile(model, mode="max-autotune")` (and `"max-autotune-no-cudagraphs"`,
    also as the Hugging Face Trainer's `torch_compile_mode`): an info note on what the mode
    costs, since guides recommend it as the fast setting without saying so.

    ## Why is this bad?
    It is not wrong, but it is not free. `max-autotune` benchmarks several kernel
    implementations for the matmuls and convolutions while it compiles and keeps the fastest,
    so the first compile takes much longer than in the default mode, and again for every new
    input shape (Inductor caches the choices on the machine, so a later run of the same script
    reuses them). `"max-autotune"` also captures CUDA graphs, which keep their inputs and outputs
    in memory and are recorded again for each new shape. A long run on fixed shapes earns that
    back; a short run, a notebook being iterated on or a model with changing shapes usually does
    not: start with the default mode and measure. Not for `torch.compile(flex_attention,
    mode="max-autotune-no-cudagraphs")`: PyTorch's FlexAttention examples (attention-gym) give
    that mode for its best kernels, whose block sizes it tunes, and some head sizes compile only
    with it (pytorch/pytorch#133254).

    ## Example
    ```python
    model = torch.compile(model, mode="max-autotune")
    ```

    ## Use instead
    ```python
    model = torch.compile(model)  # max-autotune for long, fixed-shape runs, once measured
    ```

    ## Fix safety
    No automatic fix: for long runs the mode is the right choice.

    ## Impact
    Low: minutes of compile time at each start, which matter for short or varied runs only.
    Nothing moves it.

    ## Measured effect
    The Hugging Face guide lists the mode as "longer compilation"; before torch 2.0 autotuning
    made one timm training benchmark compile in 360 s instead of 25 s (since shortened). Sources:
    https://huggingface.co/docs/transformers/torch_compile,
    https://github.com/pytorch/torchdynamo/issues/1807
    """

    impact = "low"
    code = "SF504"
    name = "compile-max-autotune"
    summary = '`mode="max-autotune"`: much longer compiles, worth it only for long fixed-shape runs'
    severity = Severity.INFO
    requires = (b"max-autotune",)
    min_torch = v("2.0")
    effect = "Shorter compiles: max-autotune benchmarks kernel choices while compiling (HF guide)."

    VALID = [
        Valid('import torch\nmodel = torch.compile(model, mode="reduce-overhead")\n'),
        Valid('import torch\nmodel = torch.compile(model)\n'),
        Valid(  # the mode FlexAttention's examples give for its kernel
            """
            import torch
            from torch.nn.attention.flex_attention import flex_attention
            flex_attention_compiled = torch.compile(flex_attention, dynamic=False, mode="max-autotune-no-cudagraphs")
            """
        ),
    ]
    INVALID = [
        Invalid('import torch\nmodel = torch.compile(model, mode="max-autotune")\n'),
        Invalid(
            """
            from transformers import TrainingArguments
            args = TrainingArguments(output_dir="out", torch_compile=True, torch_compile_mode="max-autotune")
            """
        ),
    ]

    def finish(self) -> None:
        for qualified, (keyword, position) in _MODE_TAKERS.items():
            for site in self.ctx.calls_to(qualified):
                self._check(site, keyword, position)

    def _check(self, site: CallSite, keyword: str, position: int | None) -> None:
        mode = find_argument(self.ctx, site, keyword, position)
        if mode.missing or mode.node is None or mode.arg is None:
            return
        value = string_value(self.ctx, mode.node, site.stack)
        if value not in _AUTOTUNE:
            return
        compiled = site.node.args[0].value if site.node.args and site.node.args[0].keyword is None else None
        if compiled is not None and self.ctx.qualname(compiled) == _FLEX_ATTENTION:
            return  # the mode FlexAttention's examples give for its kernel: autotuned block sizes
        node: cst.CSTNode = mode.arg
        self.report(node, f'`"{value}"` benchmarks kernel choices while it compiles: a much longer first compile, '
                    "and again for each new input shape (the choices are cached for later runs); it pays off in long "
                    "runs on fixed shapes, otherwise use the default mode")
