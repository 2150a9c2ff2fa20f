from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path
from typing import Callable

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
from speedfix.model import launch
from speedfix.model.context import FileContext
from speedfix.model.deepspeed_config import supplies_optimizer
from speedfix.model.flow import called_in_no_run, gates, in_no_run
from speedfix.model.frames import Stack
from speedfix.model.frameworks import HF_TRAINING_ARGUMENTS, SET_ELSEWHERE, TRL_CONFIGS
from speedfix.model.hf_args import (TRL_DEFAULTS, UNKNOWN, ParsedArguments, Setting, Source, arguments_only, call_setting,
                                    compared_false_in_every_run, parsed_arguments, trainer_never_trains)
from speedfix.model.index import CallSite
from speedfix.model.model_size import checkpoints_per_run, loads_quantized, size_in_name
from speedfix.model.scale import LARGE_MODEL_PARAMETERS, evaluation_script
from speedfix.model.patterns import matmul_precision_chosen, worker_start_refusal
from speedfix.model.project_files import Location
from speedfix.model.versions import pinned_below, v
from speedfix.syntax.nodes import code_of
from speedfix.model.workload import tokenized_ahead
from speedfix.rules._impact import Estimate, Finding, Impact, by_message, large_model

# Optimizer names whose update runs as several kernels per parameter group.
_UNFUSED = frozenset({"adamw_torch", "adamw_hf", "adamw_torch_foreach"})
_FUSED_DEFAULT_FROM = v("2.8")  # transformers picks "adamw_torch_fused" itself from torch 2.8 on ...
_HF_FUSED_DEFAULT_FROM = v("4.54")  # ... since transformers 4.54 (older ones default to an unfused AdamW)
_HF_FUSED_FROM = v("4.27")  # `optim="adamw_torch_fused"` came with transformers 4.27
_FUSED_FROM = v("2.0")  # torch's fused AdamW (CUDA only before 2.4)
_FUSED_CPU_FROM = v("2.4")
_FUSED_CUDA_ONLY = ("torch before 2.4 fuses AdamW on CUDA only: a CPU run would raise (pass `--optim adamw_torch_fused` "
                    "where the script runs on GPUs)")
_NO_HF_FUSED = "the transformers this project pins has no `adamw_torch_fused` (it came with 4.27): upgrade it first"
_FP16 = ("`fp16=True` scales the loss and checks every gradient for inf each step; "
         "`bf16=True` needs neither on Ampere and newer GPUs")
_FP16_REASON = "only the GPU tells whether bf16 fits: swap `fp16=True` for `bf16=True` on A100/H100/RTX 30xx and newer"
_HF_COMPILE_FROM = v("4.27")  # `TrainingArguments(torch_compile=...)` came with transformers 4.27
_HF_WORKERS_FROM = v("3.2")  # `dataloader_num_workers` came with transformers 3.2
_COMPILE_FROM = v("2.0")  # torch.compile  # fused AdamW on the CPU too, so the fix cannot fail on a CPU run
_CHECKPOINTING = ("gradient_checkpointing", "activation_checkpointing")
_COMPILE_REFUSAL = ("`torch_compile=True` is left to you: the first steps pay the compile, and per-batch padding "
                    "recompiles once before the sequence dimension goes dynamic (measure it with `speedfix bench`)")


class HfTrainingArguments(Rule):
    """
    ## What it does
    Finds Hugging Face `TrainingArguments` (`Seq2SeqTrainingArguments`, TRL's `SFTConfig`,
    `DPOConfig`, ...) that leave speed on the table on a GPU:

    - neither `bf16` nor `fp16`: the Trainer runs every step in fp32 (and, where nothing enables
      TF32 either, `tf32=True` or `torch.set_float32_matmul_precision`, the same finding says so:
      bf16 closes most of that one gap, TF32 speeds up the matmuls it leaves in fp32);
    - `fp16=True`, which needs loss scaling where bf16 would not (information only);
    - an unfused AdamW: `optim="adamw_torch"`, or no `optim` when targeting torch before 2.8 or
      when the project pins a transformers before 4.54 (transformers 4.54+ on torch 2.8+ defaults
      to `"adamw_torch_fused"`); from torch 2.0 on, as torch's fused AdamW runs on CUDA since 2.0
      (on the CPU since 2.4: below that the fix is left to you); not when the DeepSpeed config
      builds the optimizer (an `"optimizer"` section: DeepSpeed's own fused Adam) or offloads it to
      the CPU (DeepSpeed's CPU Adam steps it there);
    - `dataloader_num_workers` unset or 0 (not when the project pins a transformers before 3.2,
      which has no such option), and `dataloader_pin_memory=False`;
    - no `torch_compile` in a script that never compiles the model itself (information only;
      not when the project pins a transformers before 4.27, which has no such option, nor for a
      base model bitsandbytes loads in 4 or 8 bits: QLoRA's matmuls are its kernels);
    - `gradient_checkpointing=True` (or `model.gradient_checkpointing_enable()` in a file that
      trains, not an evaluation script, that runs by default or in one of the project's launch commands: `--gradient_checkpointing` on a path
      that command takes; the options of a dataclass an argument parser fills default to its
      fields; behind `if training_args.gradient_checkpointing:` of parsed `TrainingArguments`,
      only when a run turns the flag on, by its option or the JSON/YAML file it names; not in a
      helper of the file called only where no run goes, such as a k-bit loading path behind
      `if training_args.load_in_kbits in [4, 8]:` when every run loads 16-bit), which
      trades speed for memory (once per file: the flag and the call turn on one recompute), and
      `gradient_accumulation_steps` with a micro-batch of 1 or 2 (information only: neither
      makes training faster; neither for a model of a billion parameters or more, by its
      checkpoint's name or config, or by the `model_name_or_path` a launch command or its recipe
      gives (or the option a `from_pretrained(args.model)` reads: `--model meta-llama/Llama-2-7b-hf`,
      or its default), where both are what fits in memory; where the project's runs train models of both
      sizes, each run whose model's name says it is smaller is its own: alignment-handbook's
      SmolLM2-360M recipe beside zephyr-7b's; nor where a launch command names the model by a
      shell variable set elsewhere, `--model_name_or_path $MODEL_PATH`: its size is unknown).

    The same holds for the arguments `HfArgumentParser(...).parse_args_into_dataclasses()` or
    TRL's `TrlParser(...).parse_args_and_config()` fill from the command line. Their values come
    from the project's launch commands (`--bf16 True` in every shell script or README command
    that runs the script; TRL's `--config` YAML), else from the field defaults of the project's
    own subclass (`optim: str = field(default="adamw_torch")`, reported on that line), else
    from TRL's defaults (`gradient_checkpointing=True` since TRL 0.22; bf16 is TRL's choice),
    else from transformers'. A finding about a launch command's option points at its line.
    `parser.parse_json_file(args.train_args_file)` (or `parse_yaml_file`) takes every value from
    the file each run reads: the one each launch command names, else the option's default; a
    finding points at the file's line (the script's default file when it says the same as every
    run's), and a name the project holds no file for is left out of the runs.

    A script whose Trainers never train (an inference script: `trainer = Trainer(...)`, then only
    `trainer.evaluate()` or `trainer.predict(...)`, never `trainer.train()`, and the trainer never
    returned or handed on) is not reported.

    `TrainingArguments` train on CUDA whenever it is there, so they are GPU code unless
    `use_cpu=True` (or the old `no_cuda=True`) says otherwise. Values speedfix cannot know
    (`bf16=args.bf16`, unresolved `**kwargs`, launch commands that disagree) mean silence; where
    the launch commands disagree on `--fp16`, the fp16 advice goes to the first that sets it; where
    they disagree on `--bf16`, a note goes to the first that trains in fp32 on the GPU (QLoRA's
    `finetune.sh` beside its `--bf16` guanaco scripts), at its command line, unless it only tries
    the script out (a `debug.sh`, a command under a "smoke test" comment). An unfused `optim`,
    gradient checkpointing and accumulated micro-batches that the commands or their recipes set
    are reported per file that sets them (each recipe YAML, a README's commands once), also where
    the commands disagree.

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
    Unsafe, and only for a `TrainingArguments(...)` call or a field default of the script (a
    value set on a command line is reported with what to pass). bf16 and TF32 change the numbers. The fix writes `bf16=torch.cuda.is_bf16_supported()`,
    not `bf16=True`, and TF32 as `torch.set_float32_matmul_precision("high")` at the entry point,
    not `tf32=True`: the Trainer raises `ValueError` for `bf16=True` or `tf32=True` on a machine
    without a suitable GPU (a CPU run included). Before Ampere (V100, T4) bf16 is emulated and slow:
    use `fp16=True` there. The fused AdamW differs in the last bits. Loader workers re-import the
    script under spawn (refused without an `if __name__ == "__main__":` guard and in notebooks),
    each hold a copy of the dataset, and an `IterableDataset` that does not shard itself by worker
    yields every sample once per worker. Pinned memory is page-locked host RAM. A value set outside
    the call is reported without a fix. `torch_compile` is never added: the first steps pay the
    compile, and per-batch padding recompiles once before the sequence dimension goes dynamic.

    ## Impact
    High: fp32 training on a GPU and TF32 off are among the largest gaps (TF32 is weighed by the
    kind of network as in SF201: a Hugging Face transformer's matmuls gain). Medium for fp16
    instead of bf16, gradient checkpointing, a batch size left small and
    `dataloader_num_workers=0` (low for batches of token ids tokenized ahead); low for the unfused
    AdamW and unpinned loader memory. The settings a call leaves at their defaults are one
    finding, except that fp32 among them is a finding of its own (high) and the others (the
    optimizer, the loader workers, compile) another, "besides fp32": one finding carries one
    impact, and the precision is the largest gap. That second finding (the only one when bf16 or
    fp16 is chosen) is medium, low when each
    setting in it is small: the fused optimizer, pinned memory, or workers for batches of token
    ids tokenized ahead (a worker would only index and pad them, as SF101 says), and low for a
    model of a billion parameters or more (its checkpoint's name in the script, the field default
    of the arguments dataclass, or the launch commands): next to steps of seconds, a batch
    collated in the main process and a compile of large matmuls are worth little.

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
    requires = (b"TrainingArguments", b"gradient_checkpointing_enable", b"ArgumentParser", b"TrlParser", b"Config(")
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.NUMERICS
    fix_title = "Train in bf16 where the GPU has it (`bf16=torch.cuda.is_bf16_supported()`)"
    effect = "bf16 autocast and TF32 on tensor cores: up to 3x; fused AdamW; overlapped data loading."

    VALID = [
        Valid(  # an evaluation script: no backward pass, so nothing is recomputed
            """
            import torch
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained(args.model).cuda()
            model.gradient_checkpointing_enable()
            with torch.no_grad():
                for batch in loader:
                    perplexities.append(model(**batch).loss.exp())
            """
        ),
        Valid(  # the arguments only hold options for a loop of the script's own: no Trainer reads them
            """
            import torch
            from accelerate import Accelerator
            from transformers import HfArgumentParser, Seq2SeqTrainingArguments

            def main():
                (args,) = HfArgumentParser(Seq2SeqTrainingArguments).parse_args_into_dataclasses()
                accelerator = Accelerator(mixed_precision="bf16")
                optimizer = torch.optim.AdamW(student.parameters(), lr=args.learning_rate, fused=True)
                student, optimizer, loader = accelerator.prepare(student, optimizer, loader)
                for batch in loader:
                    loss = student(**batch).loss
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()

            if __name__ == "__main__":
                main()
            """
        ),
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
                    torch_compile=True,
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
                args = TrainingArguments(output_dir="out", bf16=True, dataloader_num_workers=4, torch_compile=True)

            if __name__ == "__main__":
                main()
            """,
            torch="2.8",
        ),
        Valid(  # QLoRA: a 4-bit base model, whose bitsandbytes matmuls the compiler cannot fuse through
            """
            import torch
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig, TrainingArguments

            def main():
                torch.set_float32_matmul_precision("high")
                quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)
                model = AutoModelForCausalLM.from_pretrained("huggyllama/llama-7b", quantization_config=quant)
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
            count=2,  # fp32 and TF32 in one finding, the fused AdamW
        ),
        Invalid(  # `bf16=False` written out: one finding with TF32, its fix sets both
            """
            import torch
            from transformers import Trainer, TrainingArguments

            if __name__ == "__main__":
                args = TrainingArguments("out", bf16=False, optim="adamw_torch_fused", dataloader_num_workers=4)
                Trainer(model=model, args=args, train_dataset=ds).train()
            """,
            fixed="""
            import torch
            from transformers import Trainer, TrainingArguments

            if __name__ == "__main__":
                torch.set_float32_matmul_precision("high")
                args = TrainingArguments(
                    "out",
                    bf16=torch.cuda.is_bf16_supported(),
                    optim="adamw_torch_fused",
                    dataloader_num_workers=4,
                )
                Trainer(model=model, args=args, train_dataset=ds).train()
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
            count=5,
        ),
        Invalid(  # torch 2.1 fuses AdamW on CUDA only: reported, the fix left to the user
            """
            from transformers import TrainingArguments

            def main():
                return TrainingArguments(output_dir="o", bf16=True, tf32=True, optim="adamw_torch",
                                         dataloader_num_workers=4, torch_compile=True)

            if __name__ == "__main__":
                main()
            """,
            torch="2.1",
        ),
        Invalid(  # memory-for-speed trades, reported without a fix; the enable call and the flag
            # turn on one recompute: one finding for both (on the flag)
            """
            from transformers import AutoModelForCausalLM, TrainingArguments

            model = AutoModelForCausalLM.from_config(config)
            model.gradient_checkpointing_enable()
            args = TrainingArguments(
                output_dir="out", use_cpu=True, gradient_checkpointing=True,
                per_device_train_batch_size=1, gradient_accumulation_steps=64, dataloader_num_workers=2,
            )
            """,
            count=2,
        ),
        Valid(  # checkpointing behind an option that is off by default
            """
            import argparse
            from transformers import AutoModelForCausalLM
            parser = argparse.ArgumentParser()
            parser.add_argument("--gradient_checkpointing", action="store_true")
            args = parser.parse_args()
            model = AutoModelForCausalLM.from_pretrained("gpt2")
            if args.gradient_checkpointing:
                model.gradient_checkpointing_enable()
            """
        ),
        Valid(  # an Accelerate loop that reads the flag of parsed TrainingArguments: off unless a run asks
            """
            import torch
            from accelerate import Accelerator
            from transformers import AutoModelForSeq2SeqLM, HfArgumentParser, Seq2SeqTrainingArguments
            (train_args,) = HfArgumentParser((Seq2SeqTrainingArguments,)).parse_args_into_dataclasses()
            accelerator = Accelerator(mixed_precision="bf16")
            model = AutoModelForSeq2SeqLM.from_pretrained("t5-small")
            if train_args.gradient_checkpointing:
                model.gradient_checkpointing_enable()
            optimizer = torch.optim.AdamW(model.parameters(), lr=train_args.learning_rate, fused=True)
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            for batch in loader:
                accelerator.backward(model(**batch).loss)
                optimizer.step()
                optimizer.zero_grad()
            """
        ),
        Invalid(  # a parser fills the project's subclass: its field default, and the defaults it keeps
            """
            from dataclasses import dataclass, field
            import transformers

            @dataclass
            class TrainingArguments(transformers.TrainingArguments):
                optim: str = field(default="adamw_torch")

            def train():
                parser = transformers.HfArgumentParser((TrainingArguments,))
                (training_args,) = parser.parse_args_into_dataclasses()

            if __name__ == "__main__":
                train()
            """,
            fixed="""
            from dataclasses import dataclass, field
            import transformers
            import torch

            @dataclass
            class TrainingArguments(transformers.TrainingArguments):
                optim: str = field(default="adamw_torch_fused")

            def train():
                parser = transformers.HfArgumentParser((TrainingArguments,))
                (training_args,) = parser.parse_args_into_dataclasses()

            if __name__ == "__main__":
                torch.set_float32_matmul_precision("high")
                train()
            """,
            count=3,
        ),
        Invalid(  # a subclass that keeps the name of the class it extends is still Trainer arguments
            """
            from dataclasses import dataclass, field
            from transformers import HfArgumentParser, TrainingArguments

            @dataclass
            class TrainingArguments(TrainingArguments):
                use_lora: bool = field(default=False)
                bf16: bool = field(default=True)

            def main():
                (training_args,) = HfArgumentParser((TrainingArguments,)).parse_args_into_dataclasses()
            """,
            count=1,
        ),
        Invalid(  # TRL's configs turn gradient checkpointing on; bf16 is TRL's choice
            """
            from trl import ScriptArguments, SFTConfig, TrlParser

            if __name__ == "__main__":
                parser = TrlParser((ScriptArguments, SFTConfig))
                script_args, training_args = parser.parse_args_and_config()
            """,
            count=2,
        ),
        Invalid(  # module level without a `__main__` guard: workers reported, not added
            """
            from transformers import TrainingArguments
            args = TrainingArguments(output_dir="out", use_cpu=True)
            """,
        ),
    ]

    def impact_here(self, finding: Finding) -> Estimate | None:
        _, beside, listed = finding.message.partition(_BESIDE_FP32_WORDS)
        if beside:
            return self._beside_fp32(listed)
        _, bundle, listed = finding.message.partition(_DEFAULTS_WORDS)
        if _NO_WORKERS in finding.message:  # written out, as much as left at its default
            return self._beside_fp32("`dataloader_num_workers`", fp32=False)
        if bundle and not any(precision in listed for precision in ("fp32", "`fp16=True`")):
            return self._beside_fp32(listed, fp32=False)  # the smaller settings, weighed together
        return by_message(finding, (
            ("fp32", Impact.HIGH, "fp32 training"),
            ("`fp16=True`", Impact.MEDIUM, "fp16 already runs on the tensor cores; bf16 saves the loss scaling"),
            ("AdamW", Impact.LOW, "a fused optimizer step"),
            ("dataloader_pin_memory", Impact.LOW, "pinned memory for the Trainer's loader"),
            ("checkpointing", Impact.MEDIUM, "memory traded for a recomputed forward pass"),
            ("micro-batch", Impact.MEDIUM, "a larger batch, if it fits"),
        )) or (self._beside_fp32(listed, fp32=False) if bundle else None)

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._checkpointing_reported = False  # the recompute advice, once per file

    def finish(self) -> None:
        ctx = self.ctx
        if arguments_only(ctx):  # no Trainer reads the settings: the script's own loop decides
            self._check_checkpointing_calls()
            return
        if trainer_never_trains(ctx):
            return  # an inference script's Trainer evaluates or predicts: no training step to speed up
        built = ctx.calls_to(*HF_TRAINING_ARGUMENTS, *TRL_CONFIGS)
        for site in built:
            if len(built) > 1 and in_no_run(ctx, site.statement, site.stack):
                continue  # one of the script's alternatives that no run takes (whisper-finetune's `if
                # args.train_strategy == "epoch":` with every README command passing `steps`); a
                # script's only TrainingArguments are its settings whatever guards them
            self._check(_Arguments.of_call(ctx, site))
        for parsed in parsed_arguments(ctx):
            self._check(_Arguments.of_parser(parsed))
        self._check_checkpointing_calls()

    def _check(self, args: _Arguments) -> None:
        defaults: list[_Default] = []
        fp32 = False
        if args.on_gpu():
            fp32 = self._check_precision(args, defaults, self._tf32_off(args))
            self._check_optimizer(args, defaults)
            self._check_pin_memory(args)
        self._check_workers(args, defaults)
        if args.on_gpu():
            self._check_compile(args, defaults)
        self._report_defaults(args, defaults, fp32)
        self._check_checkpointing(args)
        if not self._large_model:  # a billion parameters or more: a micro-batch of 1 or 2 is what fits
            self._check_accumulation(args)

    def _report_defaults(self, args: _Arguments, defaults: list[_Default], fp32: bool) -> None:
        """One finding for fp32 training, another for the smaller settings left out (they all sit
        on the call; each finding's fix adds its own): the precision is the largest gap, and the
        report ranks it above a fused optimizer or loader workers."""
        precision = [default for default in defaults if default.what.startswith(_FP32)]
        rest = [default for default in defaults if default not in precision]
        if precision and rest:
            self._report_bundle(args, precision, Severity.WARNING)
            self._report_bundle(args, rest, Severity.INFO, beside_fp32=True)
        elif defaults:
            self._report_bundle(args, defaults, Severity.WARNING if fp32 else Severity.INFO)

    def _beside_fp32(self, listed: str, fp32: bool = True) -> Estimate:
        """The settings left at their defaults beside fp32 (or beside a 16-bit precision already
        chosen): worth less than the precision, so at most medium (compile, loader workers); low
        when each is small (the fused optimizer, workers that would only index and pad token ids
        tokenized ahead)."""
        beside = "beside fp32" if fp32 else "beside the precision"
        large = large_model(self.ctx, Impact.LOW)
        if large is not None:  # a step of seconds: a compile of its large matmuls, a batch collated, little
            return Estimate(Impact.LOW, f"the smaller settings {beside}: {large.reason}")
        tokens = tokenized_ahead(self.ctx)
        parts = [part for part in _PARTS.split(listed) if part]
        idle_workers = [part for part in parts if tokens is not None and "dataloader_num_workers" in part]
        if all("AdamW" in part or part in idle_workers for part in parts):
            said = f" ({tokens}: workers would only index and pad them)" if idle_workers else ""
            return Estimate(Impact.LOW, f"the smaller settings {beside}{said}")
        return Estimate(Impact.MEDIUM, f"the smaller settings {beside}, worth less than the precision")

    def _report_bundle(self, args: _Arguments, defaults: list[_Default], severity: Severity,
                       beside_fp32: bool = False) -> None:
        listed = ", ".join(default.what for default in defaults)
        if beside_fp32:
            listed = _BESIDE_FP32_WORDS + listed
        if args.site is None:  # filled from the command line (or a file): say what to pass
            options = " ".join(default.option for default in defaults if default.option)
            where = "where the script is launched" if args.parsed is None or args.parsed.files is None \
                else "(as JSON keys) in the file the script parses"
            advice = f"pass `{options}` {where}, or give the fields those defaults in a subclass" if options else None
            alone = [op for default in defaults for op in default.alone]  # TF32 at the entry point
            if alone:
                also = ", ".join(default.also for default in defaults if default.also)
                self.report(args.anchor, f"{args.shown} {_DEFAULTS_WORDS}{listed}", severity=severity, fix_ops=alone,
                            fix_title=f"Enable {also}" + (f"; {advice}" if advice else ""))
                return
            self.report(args.anchor, f"{args.shown} {_DEFAULTS_WORDS}{listed}", severity=severity, no_fix_reason=advice)
            return
        ops: list[FixOp] = [op for default in defaults for op in (*default.ops, *default.alone)]
        new_args = [default.arg for default in defaults if default.arg is not None]
        site = args.site
        if new_args:
            indent = self.ctx.module.default_indent
            ops.insert(0, Transform(site.node, lambda call: append_args(call, *new_args, indent=indent)))
        refusals = [default.refusal for default in defaults if default.refusal]
        self.report(
            site.node,
            f"{args.shown} {_DEFAULTS_WORDS}{listed}",
            severity=severity,
            fix_ops=ops if new_args else None,
            no_fix_reason="; ".join(refusals) or None,
            fix_title="Add " + ", ".join([*(f"`{a.keyword.value}`" for a in new_args if a.keyword),
                                          *(default.also for default in defaults if default.also)])
            if new_args else None,
        )

    def _at(self, args: _Arguments, setting: Setting, message: str, *, severity: Severity | None = None,
            fix_ops: list[FixOp] | None = None, fix_title: str | None = None, no_fix_reason: str | None = None) -> None:
        """Report a setting where it is written: the call's argument, the field of the project's
        subclass, the launch command's option; the call or the parser's class when left out."""
        if setting.source is Source.LAUNCH and setting.where is not None:
            place = "a launch command" if args.parsed is None or args.parsed.files is None else "the file the script parses"
            self.report_at(setting.where, message, severity=severity,
                           no_fix_reason=f"the option is set in {place}: speedfix rewrites Python only")
            return
        # a framework's default sits on the statement (the call itself holds the defaults finding)
        node = setting.arg or setting.node or (args.statement if setting.source is Source.FRAMEWORK else args.anchor)
        self.report(node, message, severity=severity, fix_ops=fix_ops, fix_title=fix_title,
                    no_fix_reason=no_fix_reason or (SET_ELSEWHERE if setting.source is Source.CALL else None))

    # ------------------------------------------------------------------ precision
    def _check_precision(self, args: _Arguments, defaults: list[_Default], tf32: _Tf32 | None) -> bool:
        """Report fp32 (and fp16) training; True when the Trainer certainly trains in fp32.
        ``tf32``: TF32 is off too, said in the same finding (bf16 is the larger part of one gap:
        what TF32 adds is for the matmuls bf16 leaves in fp32), whose fix enables both."""
        bf16, fp16 = args.setting("bf16"), args.setting("fp16")
        if fp16.unknown and fp16.source is Source.LAUNCH and args.parsed is not None:
            self._check_fp16_runs(args, args.parsed)  # the launch commands disagree: each run's own
            return False
        if bf16.unknown and bf16.source is Source.LAUNCH and args.parsed is not None and not fp16.unknown \
                and fp16.value is not True:
            self._check_fp32_runs(args, args.parsed)  # the launch commands disagree: the fp32 ones
            return False
        if fp16.unknown or (bf16.unknown and not (args.trl and fp16.value is True)):
            return False  # a value speedfix cannot know (`bf16=args.bf16`), or TRL's own choice
        on = [setting.value is True for setting in (bf16, fp16)]
        if on[1] and not (on[0] and not bf16.unknown):
            self._at(args, fp16, _FP16, severity=Severity.INFO, no_fix_reason=_FP16_REASON)
            return False
        if any(on) or any(s.value not in (None, False) for s in (bf16, fp16)):
            return False
        if bf16.missing:
            ops: list[FixOp] = []
            supported = cst.parse_expression(f"{reference(self.ctx, 'torch.cuda.is_bf16_supported', ops, args.stack)}()")
            fixed_tf32 = tf32 is not None and bool(tf32.ops)  # else passed on the command line too
            defaults.append(_Default(f"{_FP32} (neither `bf16` nor `fp16`){_TF32_WORDS if tf32 else ''}",
                                     keyword_arg("bf16", supported), ops, alone=tf32.ops if tf32 else [],
                                     option="--bf16 True --tf32 True" if tf32 and not fixed_tf32 else "--bf16 True",
                                     also=tf32.title if fixed_tf32 else None))
            return True
        fix = None
        original = bf16.arg
        if args.site is not None and original is not None and isinstance(original.value, cst.Name) \
                and original.value.value == "False":
            ops = []
            supported = cst.parse_expression(f"{reference(self.ctx, 'torch.cuda.is_bf16_supported', ops, args.stack)}()")
            fix = [value_replaced(args.site.node, original, supported), *ops, *(tf32.ops if tf32 else [])]
        self._at(args, bf16, f"{args.shown} train in fp32: `bf16=False` and no `fp16`{_TF32_WORDS if tf32 else ''}",
                 fix_ops=fix)
        return True

    def _check_fp16_runs(self, args: _Arguments, parsed: ParsedArguments) -> None:
        """Launch commands that disagree on `--fp16` (the DeepSpeed full fine-tune sets it, the
        P-tuning scripts leave it out): the fp16 advice for the runs that set it, on the first;
        not for a run whose comment names bf16 (its author chose fp16 knowingly: a GPTQ model)."""
        runs = [fp16 for command, fp16, bf16 in zip(launch.launches(self.ctx), parsed.per_launch("fp16"), parsed.per_launch("bf16"))
                if fp16 is not None and fp16.value is True and (bf16 is None or bf16.value is False)
                and "bf16" not in launch.comment_above(self.ctx, command)]  # "use --fp16 instead of --bf16 (autogptq)"
        if runs and runs[0].where is not None:
            more = _more_commands(len(runs))
            self._at(args, runs[0], f"{_FP16}{more}", severity=Severity.INFO, no_fix_reason=_FP16_REASON)

    def _check_fp32_runs(self, args: _Arguments, parsed: ParsedArguments) -> None:
        """Launch commands that disagree on `--bf16` (QLoRA's guanaco scripts set it, its README
        command and `finetune.sh` leave it out): a note on the first run that trains in fp32 on
        the GPU, at its command line; not a run that tries the script out (`scripts/debug.sh`)."""
        project = self.ctx.project
        commands = launch.launches(self.ctx)
        if project is None or parsed.files is not None or len(commands) != len(parsed.per_launch("bf16")):
            return
        runs = [command for command, bf16, fp16 in zip(commands, parsed.per_run("bf16"), parsed.per_run("fp16"))
                if bf16.value is not True and fp16.value is not True and not bf16.unknown and not fp16.unknown
                and not any(launch.truth(command.options.get(key)) for key in _CPU_OPTIONS)
                and not _TRIAL_RUN.search(f"{command.file.name} {launch.comment_above(self.ctx, command)}")]
        if not runs:
            return
        command = runs[0]
        text = (project.text(command.file) or "").splitlines()
        line = text[command.line - 1] if 0 < command.line <= len(text) else ""
        where = Location(command.file, command.line, 1, command.line, len(line) + 1, line)
        more = _more_commands(len(runs))
        self.report_at(where, f"this launch command gives {args.shown} neither `--bf16` nor `--fp16`, unlike others of "
                       f"the project: it trains in {_FP32}{more}", severity=Severity.INFO,
                       no_fix_reason="the option is set in a launch command: pass `--bf16 True` on Ampere and newer GPUs")

    def _tf32_off(self, args: _Arguments) -> _Tf32 | None:
        """TF32 left off (neither `tf32=True` nor `torch.set_float32_matmul_precision`), and the
        ops that turn it on at the entry point (none where there is no entry point to put them)."""
        ctx = self.ctx
        if not args.setting("tf32").missing or args.setting("torch_compile").value is True \
                or matmul_precision_chosen(ctx):
            return None  # `torch_compile=True` makes the Trainer turn TF32 on itself
        high = string_literal(ctx, "high")
        ops, _ = setting_at_entry_point(ctx, "torch.set_float32_matmul_precision", lambda call: f"{call}({high})")
        return _Tf32(ops or [])

    # ------------------------------------------------------------------ optimizer, data, compile
    def _check_optimizer(self, args: _Arguments, defaults: list[_Default]) -> None:
        version = self.ctx.torch_version
        optim = args.setting("optim")
        if version < _FUSED_FROM or supplies_optimizer(self.ctx):
            return  # (DeepSpeed's config builds its own fused Adam, whatever `optim` says)
        if optim.unknown or optim.source is Source.LAUNCH:  # each recipe or launch file that sets it
            for _, run, more in self._slow_runs(args, "optim", lambda given, _: given.value in _UNFUSED):
                self._at(args, run, f'`optim="{run.value}"` runs AdamW as several kernels per step; "adamw_torch_fused" '
                         f"runs one{more}", severity=Severity.INFO)
            return
        project = self.ctx.project
        old_hf = project is not None and pinned_below(project, "transformers", _HF_FUSED_DEFAULT_FROM)
        no_fused = project is not None and pinned_below(project, "transformers", _HF_FUSED_FROM)
        refusal = _NO_HF_FUSED if no_fused else _FUSED_CUDA_ONLY if version < _FUSED_CPU_FROM else None
        if optim.missing:
            if no_fused:
                defaults.append(_Default("the unfused AdamW of transformers before 4.27, which has no "
                                         "`adamw_torch_fused` (`optim`)", None, refusal=refusal))
            elif version < _FUSED_DEFAULT_FROM or old_hf:
                what = ("the unfused AdamW before torch 2.8 (`optim`)" if version < _FUSED_DEFAULT_FROM
                        else "the unfused AdamW of transformers before 4.54 (`optim`)")
                fused = cst.parse_expression(string_literal(self.ctx, "adamw_torch_fused"))
                defaults.append(_Default(what, None if refusal else keyword_arg("optim", fused), refusal=refusal,
                                         option="--optim adamw_torch_fused"))
            return
        name = optim.value
        if name not in _UNFUSED:
            return
        fix = None
        written = optim.node if optim.source in (Source.CALL, Source.FIELD) else None
        if isinstance(written, cst.SimpleString) and refusal is None:
            fused = same_quotes(written, "adamw_torch_fused")
            fix = [Transform(written, lambda _node: fused)]
        self._at(
            args, optim,
            f'`optim="{name}"` runs AdamW as several kernels per step; "adamw_torch_fused" runs one',
            severity=Severity.INFO,
            fix_ops=fix,
            fix_title='Use the fused AdamW (`optim="adamw_torch_fused"`)',
            no_fix_reason=refusal if written is not None else None,
        )

    def _check_workers(self, args: _Arguments, defaults: list[_Default]) -> None:
        ctx = self.ctx
        workers = args.setting("dataloader_num_workers")
        if workers.unknown or (not workers.missing and workers.value != 0):
            return
        if ctx.project is not None and pinned_below(ctx.project, "transformers", _HF_WORKERS_FROM):
            return  # no such option there
        what = "batches collated in the main process (`dataloader_num_workers`)"
        option = "--dataloader_num_workers 4"
        refusal = worker_start_refusal(ctx, args.stack)
        if args.site is None or workers.source is not Source.CALL and not workers.missing:
            if workers.missing:
                defaults.append(_Default(what, None, option=option))
            else:
                self._at(args, workers, f"the Trainer's DataLoader collates every batch in the main process ({_NO_WORKERS})",
                         severity=Severity.INFO)
            return
        original = workers.arg
        if refusal is None and original is not None and not isinstance(original.value, cst.Integer):
            refusal = SET_ELSEWHERE
        ops: list[FixOp] = []
        count = cst.parse_expression(f"min(8, {reference(ctx, 'os.cpu_count', ops, args.stack)}() or 1)")
        if original is None:
            defaults.append(_Default(what, None, [], refusal) if refusal else
                            _Default(what, keyword_arg("dataloader_num_workers", count), ops))
            return
        fix = None
        if refusal is None:
            fix = [value_replaced(args.site.node, original, count), *ops]
        self.report(
            original,
            f"the Trainer's DataLoader collates every batch in the main process ({_NO_WORKERS})",
            severity=Severity.INFO,
            fix_ops=fix,
            no_fix_reason=refusal,
            fix_title="Load batches in worker processes (`dataloader_num_workers` from the CPU count)",
        )

    def _check_pin_memory(self, args: _Arguments) -> None:
        pin = args.setting("dataloader_pin_memory")
        if pin.value is not False:
            return
        fix = [arg_removed(args.site.node, pin.arg)] if args.site is not None and pin.arg is not None else None
        self._at(
            args, pin,
            "`dataloader_pin_memory=False`: batches are copied to the GPU from pageable memory",
            severity=Severity.INFO,
            fix_ops=fix,
            fix_title="Pin the batches' memory (the default)",
        )

    def _check_compile(self, args: _Arguments, defaults: list[_Default]) -> None:
        compiled = args.setting("torch_compile")
        if compiled.value not in (None, False) or _compiles(self.ctx) or self.ctx.torch_version < _COMPILE_FROM:
            return
        if self.ctx.project is not None and pinned_below(self.ctx.project, "transformers", _HF_COMPILE_FROM):
            return  # the pinned transformers has no `torch_compile` option
        if loads_quantized(self.ctx):
            return  # bitsandbytes' 4- and 8-bit matmuls: nothing for the compiler to fuse through
        if compiled.missing:
            defaults.append(_Default("an uncompiled model (`torch_compile`)", None, refusal=_COMPILE_REFUSAL,
                                     option="--torch_compile True"))
            return
        self._at(args, compiled, f"{args.shown} do not compile the model (`torch_compile=False`): `torch.compile` "
                 "fuses its kernels", severity=Severity.INFO, no_fix_reason=_COMPILE_REFUSAL)

    # ------------------------------------------------------------------ memory-for-speed trades
    def _check_checkpointing(self, args: _Arguments) -> None:
        for keyword in _CHECKPOINTING:
            flag = args.setting(keyword)
            if self._large_model_run or flag.unknown:
                # a billion parameters or more: recomputing is what lets the batch fit (zephyr-7b's
                # recipes); each recipe or command that sets it for a smaller model is its own run
                for _, run, more in self._slow_runs(args, keyword, lambda given, index: given.value is True
                                                    and self._not_large_run(args, index)):
                    self._at(args, run, _checkpointing_message(f"`{keyword}=True`") + more, severity=Severity.INFO,
                             no_fix_reason="keep it only if the batch does not fit without it")
                    self._checkpointing_reported = True
                continue
            if flag.value is not True:
                continue
            what = f"`{keyword}=True`"
            if flag.source is Source.FRAMEWORK:
                what = f"`{args.name}` turns `{keyword}` on by default (TRL 0.22 and newer), which"
            self._at(args, flag, _checkpointing_message(what), severity=Severity.INFO,
                     no_fix_reason="keep it only if the batch does not fit without it")
            self._checkpointing_reported = True

    @cached_property
    def _large_model(self) -> bool:
        """Does the script train a model of a billion parameters or more (its checkpoint's name
        or config says so)? A micro-batch of 1 or 2 is then what fits in memory (LongLoRA's 7B
        on 8k tokens: each micro-batch already fills the GPU), not a slow default."""
        return large_model(self.ctx, Impact.LOW) is not None

    @cached_property
    def _large_model_run(self) -> bool:
        """Does the script, or one of the project's launch commands (`--model_name_or_path`, also
        from the recipe YAML a command hands it: zephyr-7b's `mistralai/Mistral-7B-v0.1`), train a
        model of a billion parameters or more? Recomputing activations is then what lets its batch
        fit, not a slow default."""
        names = [given[0] for given in launch.per_command(self.ctx, "model_name_or_path", "model-name-or-path") if given]
        names += [given.value for parsed in parsed_arguments(self.ctx)  # TRL's `--config recipe.yaml` too
                  for given in parsed.per_launch("model_name_or_path") if given is not None]
        names += checkpoints_per_run(self.ctx)  # `from_pretrained(args.model)` with `--model ...-7b-hf`
        return self._large_model or any(
            isinstance(name, str) and (size_in_name(name) or 0) >= LARGE_MODEL_PARAMETERS for name in names)

    def _check_checkpointing_calls(self) -> None:
        ctx = self.ctx
        if not any(target.startswith("transformers") for target in ctx.imports.bindings.values()) or evaluation_script(ctx):
            return  # (an evaluation script recomputes nothing: no backward pass)
        for site in ctx.method_calls("gradient_checkpointing_enable"):
            if self._checkpointing_reported or self._large_model_run:
                return  # the Trainer's flag turns on the same recompute (the same advice twice), or it is what fits
            if in_no_run(ctx, site.statement, site.stack):
                continue  # behind options that are off by default (`if args.gradient_checkpointing:`) and that
                # no launch command of the project turns on
            if self._flag_off_in_every_run(site) or called_in_no_run(ctx, site.stack,
                                                                     partial(compared_false_in_every_run, ctx)):
                continue  # (or in a helper that runs only for options no run passes: a k-bit loading path)
            self.report(site.node, _checkpointing_message("`gradient_checkpointing_enable()`"), severity=Severity.INFO,
                        no_fix_reason="keep it only if the batch does not fit without it")
            self._checkpointing_reported = True

    def _flag_off_in_every_run(self, site: CallSite) -> bool:
        """`if training_args.gradient_checkpointing: model.gradient_checkpointing_enable()` where
        `training_args` is parsed `TrainingArguments` and every run leaves the flag off: its
        launch command's option or JSON/YAML file says false, or it keeps the default (False)."""
        keys = {test.attr.value for test, wanted in gates(self.ctx, site.statement)
                if wanted and isinstance(test, cst.Attribute) and test.attr.value in _CHECKPOINTING}
        return bool(keys) and any(
            all(setting.value in (False, None) for setting in parsed.per_run(key))
            for parsed in parsed_arguments(self.ctx) for key in keys)

    def _check_accumulation(self, args: _Arguments) -> None:
        accumulation = args.setting("gradient_accumulation_steps")
        if self._large_model_run or accumulation.unknown or args.setting("per_device_train_batch_size").unknown:
            self._check_accumulation_runs(args)
            return
        steps, batch = accumulation.value, args.setting("per_device_train_batch_size").value
        if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 1:
            return
        named = launch.option(self.ctx, "model_name_or_path", "model-name-or-path")
        if named.state is not launch.State.MISSING and not named.known:
            return  # `--model_name_or_path $MODEL_PATH`: a model the scan cannot size may need micro-batches of 1
        if not isinstance(batch, int) or isinstance(batch, bool) or batch > 2:
            return
        self._at(
            args, accumulation,
            f"a micro-batch of {batch} with {steps} accumulation steps: accumulation does not make training faster, "
            "a larger `per_device_train_batch_size` with fewer steps does",
            severity=Severity.INFO,
            no_fix_reason="the largest batch that fits depends on the GPU's memory",
        )


    def _check_accumulation_runs(self, args: _Arguments) -> None:
        """Launch commands that disagree on the micro-batch or the accumulation, or that train a
        model of a billion parameters in one of their runs (one recipe per model size): each run
        of a smaller model that accumulates micro-batches of 1 or 2, at its recipe or command."""
        batches = args.parsed.per_run("per_device_train_batch_size") if args.parsed is not None else []

        def slow(given: Setting, index: int) -> bool:
            batch = batches[index].value if index < len(batches) else None
            return _count(given.value) > 1 and 0 < _count(batch) <= 2 and self._not_large_run(args, index)

        for index, run, more in self._slow_runs(args, "gradient_accumulation_steps", slow):
            self._at(args, run, f"a micro-batch of {batches[index].value} with {run.value} accumulation steps: accumulation does not "
                     f"make training faster, a larger `per_device_train_batch_size` with fewer steps does{more}",
                     severity=Severity.INFO, no_fix_reason="the largest batch that fits depends on the GPU's memory")

    def _slow_runs(self, args: _Arguments, key: str, slow: Callable[[Setting, int], bool]) -> list[tuple[int, Setting, str]]:
        """Per file that the launch commands take ``key`` from (a recipe, a README, a script's
        docstring), the first place that sets it for a run to what ``slow(setting, index of the
        command)`` says is slow, with the index of that command and ` (and 2 more launch
        commands)` when more of the file's commands do: each run's own, where the commands disagree."""
        if args.parsed is None:
            return []
        places: dict[Path, list[tuple[int, Setting]]] = {}
        for index, given in enumerate(args.parsed.per_launch(key)):
            if given is not None and given.where is not None and not given.unknown and slow(given, index):
                found = places.setdefault(given.where.path, [])
                if all(other.where.line != given.where.line for _, other in found):  # type: ignore[union-attr]
                    found.append((index, given))
        return [(*found[0], _more_commands(len(found))) for found in places.values()]

    def _not_large_run(self, args: _Arguments, index: int) -> bool:
        """May launch command ``index`` train a model smaller than a billion parameters? Where a
        run of the project trains a larger one, only a run whose model's name says so
        (`HuggingFaceTB/SmolLM2-360M`, from its option or its recipe)."""
        if not self._large_model_run:
            return True
        names = args.parsed.per_launch("model_name_or_path") if args.parsed is not None else []
        given = names[index] if index < len(names) else None
        size = size_in_name(given.value) if given is not None and isinstance(given.value, str) else None
        return size is not None and size < LARGE_MODEL_PARAMETERS


def _count(value: object) -> int:
    """A positive int setting, else 0 (unknown, missing, not a number)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _checkpointing_message(what: str) -> str:
    return f"{what} saves memory by recomputing the forward pass in the backward pass: about 20-30% slower per step"


def _compiles(ctx: FileContext) -> bool:
    """Does the file compile a model itself (`torch.compile(model)`, `model.compile()`)?"""
    return bool(ctx.calls_to("torch.compile")) or any(True for _ in ctx.method_calls("compile"))


@dataclass(frozen=True)
class _Arguments:
    """One `TrainingArguments`: a call of the script (``site``), or a class a parser fills."""

    ctx: FileContext
    site: CallSite | None
    parsed: ParsedArguments | None
    name: str  # the class as the script names it

    @classmethod
    def of_call(cls, ctx: FileContext, site: CallSite) -> _Arguments:
        return cls(ctx, site, None, (ctx.call_qualname(site) or "TrainingArguments").rsplit(".", 1)[-1])

    @classmethod
    def of_parser(cls, parsed: ParsedArguments) -> _Arguments:
        return cls(parsed.ctx, None, parsed, code_of(parsed.reference))

    @property
    def trl(self) -> bool:
        if self.parsed is not None:
            return self.parsed.trl
        return self.site is not None and self.ctx.call_qualname(self.site) in TRL_CONFIGS

    @property
    def shown(self) -> str:
        if self.parsed is None:
            return f"`{self.name}`" if self.trl else "`TrainingArguments`"
        parser = "TRL's parser" if self.parsed.trl or "Trl" in code_of(self.parsed.parse.node) else "`HfArgumentParser`"
        source = "a file" if self.parsed.files is not None else "the command line"
        return f"the `{self.name}` that {parser} fills from {source}"

    @property
    def anchor(self) -> cst.CSTNode:
        return self.site.node if self.site is not None else self.parsed.reference  # type: ignore[union-attr]

    @property
    def stack(self) -> Stack:
        return self.site.stack if self.site is not None else self.parsed.parse.stack  # type: ignore[union-attr]

    @property
    def statement(self) -> cst.CSTNode:
        """The statement of the call (or of the parse call): where the findings that are not
        about one argument go."""
        site = self.site if self.site is not None else self.parsed.parse  # type: ignore[union-attr]
        return site.statement or site.node

    def setting(self, key: str) -> Setting:
        if self.parsed is not None:
            return self.parsed.setting(key)
        assert self.site is not None
        found = call_setting(self.ctx, self.site, key)
        if found.missing and self.trl and key in TRL_DEFAULTS:
            return Setting(TRL_DEFAULTS[key], Source.FRAMEWORK)
        if found.missing and self.trl and key == "bf16":
            return Setting(UNKNOWN, Source.FRAMEWORK)
        return found

    def on_gpu(self) -> bool:
        """`TrainingArguments` train on CUDA when it is there, unless told `use_cpu`/`no_cuda`."""
        return all(self.setting(key).value in (None, False) for key in ("use_cpu", "no_cuda"))


_FP32 = "fp32"  # how the precision left at its default is named in a finding
_TF32_WORDS = ", and nothing enables TF32 for the matmuls left in fp32"
def _more_commands(runs: int) -> str:
    """` (and 2 more launch commands)` after the first of ``runs`` commands, or nothing."""
    return f" (and {runs - 1} more launch command{'s' if runs > 2 else ''})" if runs > 1 else ""


_CPU_OPTIONS = ("no_cuda", "use_cpu")  # a `TrainingArguments` run on the CPU
_TRIAL_RUN = re.compile(r"debug|smoke|dry.?run|(?<![a-z])test", re.IGNORECASE)  # a run that tries the script out
# The finding of the other settings a call leaves at their defaults, when fp32 has its own.
_BESIDE_FP32_WORDS = "besides fp32, "
_NO_WORKERS = "`dataloader_num_workers=0`"
_DEFAULTS_WORDS = "keep slow defaults: "  # the finding of the settings a call leaves at their defaults
_PARTS = re.compile(r",\s(?![^(]*\))")  # the listed settings: commas outside parentheses


@dataclass(frozen=True)
class _Default:
    """A setting left at a slow default: what it is, the keyword the fix adds, the ops that
    argument needs (an import), or why it is not added; the command-line option that sets it."""

    what: str
    arg: cst.Arg | None
    ops: list[FixOp] = field(default_factory=list)
    refusal: str | None = None
    option: str | None = None
    alone: list[FixOp] = field(default_factory=list)  # ops that do not need `arg` (TF32 at the entry point)
    also: str | None = None  # what ``alone`` does, for the fix's title


@dataclass(frozen=True)
class _Tf32:
    """TF32 left off beside fp32: the ops that turn it on (empty: no entry point for them)."""

    ops: list[FixOp]
    title: str = 'TF32 matmuls (`torch.set_float32_matmul_precision("high")` at the entry point)'
