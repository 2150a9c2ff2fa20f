from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from speedfix.engine.findings import Applicability, FixOp, LossCheck, Severity, Transform
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import (
    append_args,
    arg_removed,
    keyword_arg,
    reference,
    same_quotes,
    string_literal,
    value_replaced,
)
from speedfix.fixes.entry import setting_at_entry_point
from speedfix.model.arguments import find_argument, literal_bool, literal_int, string_value
from speedfix.model.frameworks import HF_TRAINING_ARGUMENTS, SET_ELSEWHERE, hf_args_on_gpu
from speedfix.model.index import CallSite
from speedfix.model.patterns import matmul_precision_chosen, worker_start_refusal
from speedfix.model.versions import v
from speedfix.rules._impact import Estimate, Finding, Impact, by_message

# Optimizer names whose update runs as several kernels per parameter group.
_UNFUSED = frozenset({"adamw_torch", "adamw_hf", "adamw_torch_foreach"})
_FUSED_DEFAULT_FROM = v("2.8")  # transformers picks "adamw_torch_fused" itself from torch 2.8 on
_FUSED_CPU_FROM = v("2.4")  # fused AdamW on the CPU too, so the fix cannot fail on a CPU run
_CHECKPOINTING = ("gradient_checkpointing", "activation_checkpointing")


class HfTrainingArguments(Rule):
    """
    ## What it does
    Finds Hugging Face `TrainingArguments` (and `Seq2SeqTrainingArguments`) that leave speed on
    the table on a GPU:

    - neither `bf16` nor `fp16`: the Trainer runs every step in fp32;
    - fp32 without TF32 (`tf32=True` or `torch.set_float32_matmul_precision`);
    - `fp16=True`, which needs loss scaling where bf16 would not (information only);
    - an unfused AdamW: `optim="adamw_torch"`, or no `optim` when targeting torch before 2.8
      (from 2.8 on transformers defaults to `"adamw_torch_fused"`);
    - `dataloader_num_workers` unset or 0, and `dataloader_pin_memory=False`;
    - `gradient_checkpointing=True` (or `model.gradient_checkpointing_enable()`), which trades
      speed for memory, and `gradient_accumulation_steps` with a micro-batch of 1 or 2
      (information only: neither makes training faster).

    `TrainingArguments` train on CUDA whenever it is there, so they are GPU code unless
    `use_cpu=True` (or the old `no_cuda=True`) says otherwise. Values speedfix cannot know
    (`bf16=args.bf16`, unresolved `**kwargs`) mean silence. `torch_compile` is left to you: with
    dynamic padding every new sequence length compiles again.

    ## Why is this bad?
    fp32 leaves the tensor cores mostly idle: `bf16=True` runs the forward and backward pass
    under bf16 autocast, with fp32 master weights and no loss scaling. fp32 matmuls that remain
    are several times faster with TF32. The fused AdamW does the whole update in one kernel per
    group of tensors. With no loader workers the main process collates every batch between two
    steps. Gradient checkpointing recomputes the forward pass during the backward pass (about
    20-30% slower, Hugging Face's table: "Improves training speed: No"); gradient accumulation
    runs the same number of forward and backward passes for the same data, only in smaller
    pieces, so a micro-batch of 1 leaves the GPU underused.

    ## Example
    ```python
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=16, optim="adamw_torch")
    ```

    ## Use instead
    ```python
    torch.set_float32_matmul_precision("high")
    args = TrainingArguments(
        output_dir="out", per_device_train_batch_size=16, optim="adamw_torch_fused",
        bf16=torch.cuda.is_bf16_supported(), dataloader_num_workers=min(8, os.cpu_count() or 1),
    )
    ```

    ## Fix safety
    Unsafe. bf16 and TF32 change the numbers. The fix writes `bf16=torch.cuda.is_bf16_supported()`,
    not `bf16=True`, and TF32 as `torch.set_float32_matmul_precision("high")` at the entry point,
    not `tf32=True`: the Trainer raises `ValueError` for `bf16=True` or `tf32=True` on a machine
    without a suitable GPU (a CPU run included). Before Ampere (V100, T4) bf16 is emulated and slow:
    use `fp16=True` there. The fused AdamW differs in the last bits. Loader workers re-import the
    script under spawn (refused without an `if __name__ == "__main__":` guard and in notebooks),
    each hold a copy of the dataset, and an `IterableDataset` that does not shard itself by worker
    yields every sample once per worker. Pinned memory is page-locked host RAM. A value set outside
    the call is reported without a fix.

    ## Impact
    High: fp32 training on a GPU and TF32 off are among the largest gaps. Medium for fp16
    instead of bf16, gradient checkpointing and a batch size left small; low for the unfused
    AdamW and unpinned loader memory.

    ## Measured effect
    Mixed precision and TF32: "up to 3x" training throughput; gradient checkpointing "slows
    training by approximately 20%"; the fused AdamW is transformers' default from torch 2.8 on
    (2-3 ms per iteration in litgpt).
    Sources: https://huggingface.co/docs/transformers/perf_train_gpu_one,
    https://github.com/Lightning-AI/litgpt/pull/857
    """

    impact = "high"
    code = "SF902"
    name = "hf-training-arguments"
    summary = "Hugging Face `TrainingArguments` on a GPU in fp32, without TF32, fused AdamW or loader workers"
    severity = Severity.WARNING
    requires = (b"TrainingArguments", b"gradient_checkpointing_enable")
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.NUMERICS
    fix_title = "Train in bf16 where the GPU has it (`bf16=torch.cuda.is_bf16_supported()`)"
    effect = "bf16 autocast and TF32 on tensor cores: up to 3x; fused AdamW; overlapped data loading."

    VALID = [
        Valid(  # tuned: bf16, TF32, fused AdamW, workers
            """
            from transformers import TrainingArguments

            def main():
                args = TrainingArguments(
                    output_dir="out",
                    bf16=True,
                    tf32=True,
                    optim="adamw_torch_fused",
                    dataloader_num_workers=4,
                )

            if __name__ == "__main__":
                main()
            """
        ),
        Valid(  # a CPU run; settings from the command line
            """
            import transformers

            def main(cli):
                a = transformers.TrainingArguments(output_dir="out", use_cpu=True, dataloader_num_workers=2)
                b = transformers.TrainingArguments(**cli)

            if __name__ == "__main__":
                main({})
            """
        ),
        Valid(  # torch 2.8 and newer: the fused AdamW is the default
            """
            import torch
            from transformers import TrainingArguments

            def main():
                torch.set_float32_matmul_precision("high")
                args = TrainingArguments(output_dir="out", bf16=True, dataloader_num_workers=4)

            if __name__ == "__main__":
                main()
            """,
            torch="2.8",
        ),
        Valid(  # a project's own TrainingArguments
            """
            from myproject.config import TrainingArguments
            args = TrainingArguments(output_dir="out")
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from transformers import Trainer, TrainingArguments

            def main():
                args = TrainingArguments(output_dir="out", dataloader_num_workers=4)
                Trainer(model=model, args=args, train_dataset=ds).train()

            if __name__ == "__main__":
                main()
            """,
            fixed="""
            import torch
            from transformers import Trainer, TrainingArguments

            def main():
                torch.set_float32_matmul_precision("high")
                args = TrainingArguments(
                    output_dir="out",
                    dataloader_num_workers=4,
                    bf16=torch.cuda.is_bf16_supported(),
                    optim="adamw_torch_fused",
                )
                Trainer(model=model, args=args, train_dataset=ds).train()

            if __name__ == "__main__":
                main()
            """,
            count=2,
        ),
        Invalid(  # explicit slow values; an `os` import is added for the worker count
            """
            from transformers import TrainingArguments

            def main():
                args = TrainingArguments(
                    output_dir="out",
                    fp16=True,
                    optim='adamw_torch',
                    dataloader_num_workers=0,
                    dataloader_pin_memory=False,
                )

            if __name__ == "__main__":
                main()
            """,
            fixed="""
            from transformers import TrainingArguments
            import os

            def main():
                args = TrainingArguments(
                    output_dir="out",
                    fp16=True,
                    optim='adamw_torch_fused',
                    dataloader_num_workers=min(8, os.cpu_count() or 1),
                )

            if __name__ == "__main__":
                main()
            """,
            count=4,
        ),
        Invalid(  # memory-for-speed trades, reported without a fix
            """
            from transformers import AutoModelForCausalLM, TrainingArguments

            model = AutoModelForCausalLM.from_config(config)
            model.gradient_checkpointing_enable()
            args = TrainingArguments(
                output_dir="out", use_cpu=True, gradient_checkpointing=True,
                per_device_train_batch_size=1, gradient_accumulation_steps=64, dataloader_num_workers=2,
            )
            """,
            count=3,
        ),
        Invalid(  # module level without a `__main__` guard: workers reported, not added
            """
            from transformers import TrainingArguments
            args = TrainingArguments(output_dir="out", use_cpu=True)
            """,
        ),
    ]

    def impact_here(self, finding: Finding) -> Estimate | None:
        return by_message(finding, (
            ("fp32", Impact.HIGH, "fp32 training"),
            ("`fp16=True`", Impact.MEDIUM, "fp16 already runs on the tensor cores; bf16 saves the loss scaling"),
            ("AdamW", Impact.LOW, "a fused optimizer step"),
            ("dataloader_pin_memory", Impact.LOW, "pinned memory for the Trainer's loader"),
            ("checkpointing", Impact.MEDIUM, "memory traded for a recomputed forward pass"),
            ("batch size", Impact.MEDIUM, "a larger batch, if it fits"),
        ))

    def finish(self) -> None:
        for site in self.ctx.calls_to(*HF_TRAINING_ARGUMENTS):
            self._check(site)
        self._check_checkpointing_calls()

    def _check(self, site: CallSite) -> None:
        defaults: list[_Default] = []
        fp32 = False
        if hf_args_on_gpu(self.ctx, site):
            fp32 = self._check_precision(site, defaults)
            if fp32:
                self._check_tf32(site)
            self._check_optimizer(site, defaults)
            self._check_pin_memory(site)
        self._check_workers(site, defaults)
        self._report_defaults(site, defaults, fp32)
        self._check_checkpointing(site)
        self._check_accumulation(site)

    def _report_defaults(self, site: CallSite, defaults: list[_Default], fp32: bool) -> None:
        """One finding for the settings left out (they all sit on the call), one fix adding them."""
        if not defaults:
            return
        ops: list[FixOp] = [op for default in defaults for op in default.ops]
        new_args = [default.arg for default in defaults if default.arg is not None]
        if new_args:
            indent = self.ctx.module.default_indent
            ops.insert(0, Transform(site.node, lambda call: append_args(call, *new_args, indent=indent)))
        refusals = [default.refusal for default in defaults if default.refusal]
        self.report(
            site.node,
            "`TrainingArguments` keep slow defaults: " + ", ".join(default.what for default in defaults),
            severity=Severity.WARNING if fp32 else Severity.INFO,
            fix_ops=ops if new_args else None,
            no_fix_reason="; ".join(refusals) or None,
            fix_title="Add " + ", ".join(f"`{a.keyword.value}`" for a in new_args if a.keyword) if new_args else None,
        )

    # ------------------------------------------------------------------ precision
    def _check_precision(self, site: CallSite, defaults: list[_Default]) -> bool:
        """Report fp32 (and fp16) training; True when the Trainer certainly trains in fp32."""
        bf16, fp16 = (find_argument(self.ctx, site, key) for key in ("bf16", "fp16"))
        flags = [None if arg.missing else literal_bool(self.ctx, arg.node, site.stack) for arg in (bf16, fp16)]
        unknowable = any(arg.arg is not None and flag is None for arg, flag in zip((bf16, fp16), flags))
        if bf16.unknown or fp16.unknown or unknowable:
            return False  # a value speedfix cannot know (`bf16=args.bf16`)
        if flags[1] and not flags[0]:
            self.report(
                fp16.arg or site.node,
                "`fp16=True` scales the loss and checks every gradient for inf each step; "
                "`bf16=True` needs neither on Ampere and newer GPUs",
                severity=Severity.INFO,
                no_fix_reason="only the GPU tells whether bf16 fits: "
                "swap `fp16=True` for `bf16=True` on A100/H100/RTX 30xx and newer",
            )
            return False
        if flags[0] or flags[1]:
            return False
        ops: list[FixOp] = []
        supported = cst.parse_expression(f"{reference(self.ctx, 'torch.cuda.is_bf16_supported', ops, site.stack)}()")
        original = bf16.arg
        if bf16.missing:
            defaults.append(_Default("fp32 (neither `bf16` nor `fp16`)", keyword_arg("bf16", supported), ops))
            return True
        fix = None
        if original is not None and isinstance(original.value, cst.Name) and original.value.value == "False":
            fix = [value_replaced(site.node, original, supported), *ops]
        self.report(original or site.node, "`TrainingArguments` train in fp32: `bf16=False` and no `fp16`",
                    fix_ops=fix, no_fix_reason=SET_ELSEWHERE)
        return True

    def _check_tf32(self, site: CallSite) -> None:
        ctx = self.ctx
        compiled = literal_bool(ctx, find_argument(ctx, site, "torch_compile").node, site.stack)
        if not find_argument(ctx, site, "tf32").missing or compiled or matmul_precision_chosen(ctx):
            return  # `torch_compile=True` makes the Trainer turn TF32 on itself
        high = string_literal(ctx, "high")
        ops, reason = setting_at_entry_point(ctx, "torch.set_float32_matmul_precision", lambda call: f"{call}({high})")
        self.report(
            site.statement or site.node,  # the precision finding sits on the call itself
            "fp32 matmuls run without TF32 tensor cores: neither `tf32=True` nor `torch.set_float32_matmul_precision`",
            severity=Severity.INFO,
            fix_ops=ops,
            no_fix_reason=reason,
            fix_title='Enable TF32 matmuls: `torch.set_float32_matmul_precision("high")` at the entry point',
        )

    # ------------------------------------------------------------------ optimizer and data
    def _check_optimizer(self, site: CallSite, defaults: list[_Default]) -> None:
        version = self.ctx.torch_version
        optim = find_argument(self.ctx, site, "optim")
        if version < _FUSED_CPU_FROM or optim.unknown:
            return
        if optim.missing:
            if version < _FUSED_DEFAULT_FROM:
                fused = cst.parse_expression(string_literal(self.ctx, "adamw_torch_fused"))
                defaults.append(_Default("the unfused AdamW before torch 2.8 (`optim`)", keyword_arg("optim", fused)))
            return
        name = string_value(self.ctx, optim.node, site.stack)
        if name not in _UNFUSED:
            return
        original = optim.arg
        fix = None
        if original is not None and isinstance(original.value, cst.SimpleString):
            fused = same_quotes(original.value, "adamw_torch_fused")
            fix = [value_replaced(site.node, original, fused)]
        self.report(
            original or site.node,
            f'`optim="{name}"` runs AdamW as several kernels per step; "adamw_torch_fused" runs one',
            severity=Severity.INFO,
            fix_ops=fix,
            no_fix_reason=SET_ELSEWHERE,
            fix_title='Use the fused AdamW (`optim="adamw_torch_fused"`)',
        )

    def _check_workers(self, site: CallSite, defaults: list[_Default]) -> None:
        ctx = self.ctx
        workers = find_argument(ctx, site, "dataloader_num_workers")
        if workers.unknown or (not workers.missing and literal_int(ctx, workers.node, site.stack) != 0):
            return
        original = workers.arg
        refusal = worker_start_refusal(ctx, site.stack)
        if refusal is None and not workers.missing and not isinstance(workers.node, cst.Integer):
            refusal = SET_ELSEWHERE
        ops: list[FixOp] = []
        count = cst.parse_expression(f"min(8, {reference(ctx, 'os.cpu_count', ops, site.stack)}() or 1)")
        what = "batches collated in the main process (`dataloader_num_workers`)"
        if original is None:
            defaults.append(_Default(what, None, [], refusal) if refusal else
                            _Default(what, keyword_arg("dataloader_num_workers", count), ops))
            return
        fix = None
        if refusal is None:
            fix = [value_replaced(site.node, original, count), *ops]
        self.report(
            original,
            "the Trainer's DataLoader collates every batch in the main process (`dataloader_num_workers=0`)",
            severity=Severity.INFO,
            fix_ops=fix,
            no_fix_reason=refusal,
            fix_title="Load batches in worker processes (`dataloader_num_workers` from the CPU count)",
        )

    def _check_pin_memory(self, site: CallSite) -> None:
        pin = find_argument(self.ctx, site, "dataloader_pin_memory")
        original = pin.arg
        if original is None or literal_bool(self.ctx, pin.node, site.stack) is not False:
            return
        self.report(
            original,
            "`dataloader_pin_memory=False`: batches are copied to the GPU from pageable memory",
            severity=Severity.INFO,
            fix_ops=[arg_removed(site.node, original)],
            fix_title="Pin the batches' memory (the default)",
        )

    # ------------------------------------------------------------------ memory-for-speed trades
    def _check_checkpointing(self, site: CallSite) -> None:
        for keyword in _CHECKPOINTING:
            flag = find_argument(self.ctx, site, keyword)
            if flag.arg is not None and literal_bool(self.ctx, flag.node, site.stack) is True:
                self._report_checkpointing(flag.arg, f"`{keyword}=True`")

    def _check_checkpointing_calls(self) -> None:
        if not any(target.startswith("transformers") for target in self.ctx.imports.bindings.values()):
            return
        for site in self.ctx.method_calls("gradient_checkpointing_enable"):
            self._report_checkpointing(site.node, "`gradient_checkpointing_enable()`")

    def _report_checkpointing(self, node: cst.CSTNode, what: str) -> None:
        self.report(
            node,
            f"{what} saves memory by recomputing the forward pass in the backward pass: about 20-30% slower per step",
            severity=Severity.INFO,
            no_fix_reason="keep it only if the batch does not fit without it",
        )

    def _check_accumulation(self, site: CallSite) -> None:
        ctx = self.ctx
        accumulation = find_argument(ctx, site, "gradient_accumulation_steps")
        steps = literal_int(ctx, accumulation.node, site.stack)
        batch = literal_int(ctx, find_argument(ctx, site, "per_device_train_batch_size").node, site.stack)
        if steps is None or steps <= 1 or batch is None or batch > 2:
            return
        self.report(
            accumulation.arg or site.node,
            f"a micro-batch of {batch} with {steps} accumulation steps: accumulation does not make training faster, "
            "a larger `per_device_train_batch_size` with fewer steps does",
            severity=Severity.INFO,
            no_fix_reason="the largest batch that fits depends on the GPU's memory",
        )


@dataclass(frozen=True)
class _Default:
    """A setting left at a slow default: what it is, the keyword the fix adds, the ops that
    argument needs (an import), or why it is not added."""

    what: str
    arg: cst.Arg | None
    ops: list[FixOp] = field(default_factory=list)
    refusal: str | None = None
