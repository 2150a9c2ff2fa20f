from __future__ import annotations

import libcst as cst

from speedfix.engine.findings import Applicability, LossCheck, Severity
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import same_quotes, value_replaced
from speedfix.model.amp import weights_in_sixteen_bit
from speedfix.model.arguments import argparse_option, find_argument, known_value, string_value
from speedfix.model.context import FileContext
from speedfix.model.deepspeed_config import DEEPSPEED_INITIALIZE, plugin_sixteen_bit
from speedfix.model.flow import default_truth, in_no_run
from speedfix.model.frameworks import (ACCELERATOR, SET_ELSEWHERE, accelerator_on_gpu, launched_in_fp32,
                                      launched_mixed_precision, process_info_only)
from speedfix.model.index import CallSite
from speedfix.model.loaded_config import spread_parameter
from speedfix.model.networks import may_train
from speedfix.rules._impact import Estimate, Finding, Impact, by_message, small_model
from speedfix.syntax.names import dotted_name

# Why fp16 where bf16 fits is medium, not high: fp16 already runs on the tensor cores.
_FP16_REASON = "fp16 already runs on the tensor cores; bf16 saves the loss scaling"



# The calls through which an Accelerator trains: what it prepares, the backward it scales, the
# steps it accumulates or autocasts.
_TRAINING_METHODS = ("prepare", "prepare_model", "prepare_optimizer", "backward", "accumulate", "autocast")
class AccelerateNoMixedPrecision(Rule):
    """
    ## What it does
    Finds Accelerate's `Accelerator(mixed_precision="no")` on a GPU: the model trains in fp32.
    `mixed_precision="fp16"` is reported at lower severity (bf16 needs no loss scaling).

    `Accelerator()` without `mixed_precision` (or with `None`, an argparse default of None, also
    of a parser another file of the project defines: `args = parse_args()` imported from it)
    takes the setting from `accelerate launch --mixed_precision`, the config file it is given,
    or the user's `accelerate config`, and else trains in fp32. So the project's launch commands
    are read (shell scripts and README commands that run the script, and the Accelerate YAML
    their `--config_file` names): when every one of them sets a precision, that one counts
    (`--mixed_precision="no"` in each: fp32 for certain, a warning); when one runs the script
    without (or there is none), the default run is fp32 and is reported as an info note (of
    medium impact where there is none: a machine-wide `accelerate config` may still set it; not where the
    `DeepSpeedPlugin(hf_ds_config=...)` it is given names a config that enables bf16 or fp16),
    also beside commands whose config file is not in the project (`accelerate config
    --config_file config.yaml` writes it on the user's machine). An
    `Accelerator` is GPU code unless `cpu=True`; `accelerator.device` is where it puts the model.
    A value handed in as a parameter is its default when no call passes it, and the entry of a
    config file spread into the function's one call (`main(**OmegaConf.load(args.config))`,
    reported at that file's line).
    A script that puts the model in 16-bit itself (`from_pretrained(..., dtype=torch.bfloat16)`,
    4-bit weights computed in bf16, `.half()`) does not train in fp32 whatever Accelerate is
    told, and is not reported for "no" or a missing setting. Nor is an `Accelerator` made only to
    read a fact of the process (`device_map = {"": Accelerator().process_index}`), one on a
    path no run takes (under a `--use_int4` flag that is off by default), or one in a file that
    does not train: no training loop of its own or of another file it calls, no backward pass, no
    optimizer (an inference, evaluation or demo script), nor one that prepares, steps and
    autocasts nothing in a file whose DeepSpeed engines train (`deepspeed.initialize`; EAGLE's
    Accelerator only gathers metrics).

    ## Why is this bad?
    In fp32 matmuls and convolutions run at a fraction of the tensor cores' speed. With
    `mixed_precision="bf16"` Accelerate runs the forward pass under bf16 autocast and keeps fp32
    weights; unlike fp16, bf16 has fp32's exponent range and needs no GradScaler, which checks
    every gradient for inf and syncs with the CPU each step.

    ## Example
    ```python
    accelerator = Accelerator(mixed_precision="no")
    ```

    ## Use instead
    ```python
    accelerator = Accelerator(mixed_precision="bf16")
    ```

    ## Fix safety
    Unsafe: bf16 changes the numbers (8 mantissa bits), and Accelerate raises `ValueError` for
    bf16 on a GPU without bf16 support (before Ampere: use "fp16" there). A value set outside the
    call (a constant, an argparse default) is reported without a fix.

    ## Impact
    High: mixed precision is one of the largest single gains in training speed and memory. Medium for
    a small model (under 10M parameters, counted from the layers it builds, or given by width
    options of 256 or less), as in SF202, and for fp16 where bf16 fits: fp16 already runs on the
    tensor cores, bf16 only saves the loss scaling (as SF207, SF901 and SF902 rate it).

    ## Measured effect
    Mixed precision gives "up to 3x" on Volta and newer GPUs (PyTorch's tuning guide); Hugging
    Face lists it among the changes that improve training speed.
    Sources: https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html,
    https://huggingface.co/docs/accelerate/usage_guides/low_precision_training
    """

    impact = "high"
    code = "SF904"
    name = "accelerate-no-mixed-precision"
    summary = 'Accelerate\'s `Accelerator(mixed_precision="no")` on a GPU'
    severity = Severity.WARNING
    requires = (b"Accelerator",)
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.NUMERICS
    fix_title = 'Train in bf16 mixed precision (`mixed_precision="bf16"`)'
    effect = "bf16 autocast on tensor cores: up to 3x per the PyTorch tuning guide."

    VALID = [
        Valid(  # EAGLE: DeepSpeed's engine trains; the Accelerator only gathers metrics
            """
            import deepspeed
            from accelerate import Accelerator

            accelerator = Accelerator(mixed_precision="fp16")
            engine, optimizer, loader, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
            for batch in loader:
                loss = engine(batch)
                engine.backward(loss)
                engine.step()
            print(accelerator.gather_for_metrics(loss))
            """
        ),
        Valid(  # an Accelerator made for its process index (a device map) on a flag that is off: the Trainer trains
            """
            import argparse
            from accelerate import Accelerator
            from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

            parser = argparse.ArgumentParser()
            parser.add_argument("--use_int4", action="store_true", default=False)
            args = parser.parse_args()
            kwargs = {}
            if args.use_int4:
                kwargs["device_map"] = {"": Accelerator().process_index}
            model = AutoModelForCausalLM.from_pretrained("gpt2", **kwargs)
            Trainer(model=model, args=TrainingArguments("out", bf16=True)).train()
            device_map = {"": Accelerator().process_index}
            """
        ),
        Valid(
            """
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator(mixed_precision="bf16")
            cpu_only = Accelerator(cpu=True, mixed_precision="no")
            """
        ),
        Valid(  # a QLoRA run: the base loaded in bf16 (4-bit weights computed in bf16)
            """
            import torch
            from accelerate import Accelerator
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig
            accelerator = Accelerator(gradient_accumulation_steps=8)
            quantized = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)
            model = AutoModelForCausalLM.from_pretrained(args.base, quantization_config=quantized,
                                                         dtype=torch.bfloat16)
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            for batch in loader:
                with accelerator.accumulate(model):
                    accelerator.backward(model(**batch).loss)
                    optimizer.step()
                    optimizer.zero_grad()
            """
        ),
        Valid(  # an inference script: nothing trains, whatever the precision
            """
            import torch
            from accelerate import Accelerator

            @torch.no_grad()
            def main():
                accelerator = Accelerator(mixed_precision="no")
                model = accelerator.prepare(load_model())
                for batch in loader:
                    save(model(batch))

            main()
            """
        ),
    ]
    INVALID = [
        Invalid(  # mixed precision behind a constructor default that is off (`amp = False`)
            """
            from accelerate import Accelerator

            class Trainer:
                def __init__(self, model, *, amp=False, mixed_precision_type="fp16"):
                    self.accelerator = Accelerator(mixed_precision=mixed_precision_type if amp else "no")

                def step(self, loss):
                    self.accelerator.backward(loss)
            """,
        ),
        Invalid(
            """
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator(mixed_precision='no', gradient_accumulation_steps=2)
            optimizer = torch.optim.AdamW(model.parameters())
            """,
            fixed="""
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator(mixed_precision='bf16', gradient_accumulation_steps=2)
            optimizer = torch.optim.AdamW(model.parameters())
            """,
        ),
        Invalid(  # left to the launch command, and the project shows none that sets it: an info note
            """
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator()
            accelerator.backward(loss)
            """
        ),
        Invalid(  # Accelerate's own examples: the command line may choose, its default is None
            """
            import argparse
            import torch
            from accelerate import Accelerator
            parser = argparse.ArgumentParser()
            parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16"])
            parser.add_argument("--cpu", action="store_true")
            args = parser.parse_args()
            accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
            accelerator.backward(loss)
            """
        ),
        Invalid(  # a parameter's default that the call leaves: fp16 (Tune-A-Video's `main()`), no fix
            """
            from accelerate import Accelerator

            def main(output_dir, mixed_precision="fp16"):
                accelerator = Accelerator(mixed_precision=mixed_precision)
                accelerator.backward(loss)

            main("runs")
            """,
        ),
        Invalid(  # an argparse default: reported, no fix
            """
            import argparse
            import accelerate
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--mixed-precision", default="fp16")
            args = parser.parse_args()
            accelerator = accelerate.Accelerator(mixed_precision=args.mixed_precision)
            accelerator.backward(loss)
            """,
        ),
    ]

    def finish(self) -> None:
        if not may_train(self.ctx):
            return  # an inference, evaluation or demo script makes an Accelerator too
        engines = bool(self.ctx.calls_to(DEEPSPEED_INITIALIZE))
        for site in self.ctx.calls_to(*ACCELERATOR):
            if accelerator_on_gpu(self.ctx, site) and not process_info_only(site) \
                    and not in_no_run(self.ctx, site.statement, site.stack) \
                    and not (engines and not self._drives_training(site)):
                self._check(site)

    def _drives_training(self, site: CallSite) -> bool:
        """Does the Accelerator built at ``site`` (and bound to a name) prepare, step or autocast
        anything? EAGLE's `main_deepspeed.py` keeps one only to gather metrics while DeepSpeed's
        engines train; an Accelerator this cannot tell of counts as training."""
        statement = site.statement
        small = statement.body[0] if statement is not None and len(statement.body) == 1 else None
        if not isinstance(small, cst.Assign) or small.value is not site.node or len(small.targets) != 1:
            return True
        name = dotted_name(small.targets[0].target)
        return name is None or any(isinstance(call.node.func, cst.Attribute) and dotted_name(call.node.func.value) == name
                                   for method in _TRAINING_METHODS for call in self.ctx.method_calls(method))

    def _check(self, site: CallSite) -> None:
        precision = find_argument(self.ctx, site, "mixed_precision")
        node = precision.node
        if isinstance(node, cst.IfExp):  # lucidrains' `mixed_precision_type if amp else "no"`, `amp=False`
            chosen = default_truth(self.ctx, node.test, site.stack)
            node = None if chosen is None else (node.body if chosen else node.orelse)
        value = string_value(self.ctx, node, site.stack)
        original = precision.arg
        if precision.missing or _is_none(self.ctx, precision.node, site):
            self._check_launched(site, original)
            return
        if value is None and isinstance(node, cst.Name):
            self._check_spread(site, node.value)
            return
        if value not in ("no", "fp16") or original is None or value == "no" and weights_in_sixteen_bit(self.ctx):
            return
        fix = None
        if isinstance(original.value, cst.SimpleString):
            bf16 = same_quotes(original.value, "bf16")
            fix = [value_replaced(site.node, original, bf16)]
        fp16 = value == "fp16"
        self.report(
            original,
            '`mixed_precision="fp16"` scales the loss and checks every gradient for inf each step; "bf16" needs neither'
            if fp16 else '`Accelerator(mixed_precision="no")` trains in fp32',
            severity=Severity.INFO if fp16 else Severity.WARNING,
            fix_ops=fix,
            no_fix_reason=SET_ELSEWHERE,
        )

    def _check_spread(self, site: CallSite, name: str) -> None:
        """`Accelerator(mixed_precision=mixed_precision)` in `main(...)`, which the script calls as
        `main(**OmegaConf.load(args.config))`: the config file's line decides."""
        setting = spread_parameter(self.ctx, name, site.stack)
        if setting is None or setting.value not in ("no", "fp16") \
                or setting.value == "no" and weights_in_sixteen_bit(self.ctx):
            return
        fp16 = setting.value == "fp16"
        self.report_at(
            setting.at,
            f'`{name}: fp16` ({name} of `Accelerator`) scales the loss and checks every gradient for inf each step; '
            'bf16 needs neither' if fp16 else f'`{name}: "no"` makes `Accelerator` train in fp32',
            severity=Severity.INFO if fp16 else Severity.WARNING,
            no_fix_reason="set `bf16` in the config file (on Ampere and newer GPUs)",
        )

    def impact_here(self, finding: Finding) -> Estimate | None:
        return by_message(finding, (
            ('`mixed_precision="fp16"`', Impact.MEDIUM, _FP16_REASON),  # in the call
            (": fp16` (", Impact.MEDIUM, _FP16_REASON),  # in a config file spread into the function
            (_NO_LAUNCH_SETS_IT, Impact.MEDIUM, "no launch command of the project shows how it is run: a machine-wide "
                                                "`accelerate config` may well set the precision"),
        )) or small_model(self.ctx, Impact.MEDIUM)

    def _check_launched(self, site: CallSite, original: cst.Arg | None) -> None:
        """`Accelerator()`: the launch commands decide, and plain `python script.py` is fp32."""
        chosen = launched_mixed_precision(self.ctx)
        if "?" in chosen and None not in chosen or (chosen and all(value in ("bf16", "fp8") for value in chosen)):
            return  # (a command whose config cannot be read is no reason for silence beside one that sets nothing)
        if weights_in_sixteen_bit(self.ctx):
            return  # the model is loaded in 16-bit (or 4-bit computed in bf16): no launch trains in fp32
        if plugin_sixteen_bit(self.ctx):
            return  # the DeepSpeed plugin's config enables bf16 or fp16: the engine trains in it
        if chosen and all(value == "fp16" for value in chosen):
            message = ('every launch command runs `mixed_precision="fp16"`, which scales the loss and checks every '
                       'gradient for inf each step; "bf16" needs neither')
        else:
            if launched_in_fp32(self.ctx):
                shown = 'every launch command runs it with `--mixed_precision="no"`'
            elif "no" in chosen:
                shown = 'a launch command of the project runs it with `--mixed_precision="no"`'
            elif not any(chosen):
                shown = _NO_LAUNCH_SETS_IT
            else:
                shown = "a launch command of the project runs the script without it"
            message = ("`Accelerator()` leaves `mixed_precision` to `accelerate launch` or its config file, and "
                       f"{shown}: the default run trains in fp32")
        self.report(
            original or site.node,
            message,
            severity=Severity.WARNING if launched_in_fp32(self.ctx) else Severity.INFO,
            no_fix_reason='a machine-wide `accelerate config` may set it: pass `mixed_precision="bf16"` to '
            "`Accelerator(...)` or `--mixed_precision bf16` to `accelerate launch` on Ampere and newer GPUs",
        )


_NO_LAUNCH_SETS_IT = "no launch command of the project sets it"


def _is_none(ctx: FileContext, node: cst.BaseExpression | None, site: CallSite) -> bool:
    """`mixed_precision=None`, or an argparse option whose default is None (given or left out)."""
    if node is None:
        return False
    if known_value(ctx, node, site.stack) is None:
        return True
    option = argparse_option(ctx, node)
    if option is None:
        return False
    keywords = {arg.keyword.value: arg.value for arg in option.node.args if arg.keyword is not None}
    default = keywords.get("default")
    return (default is None and "action" not in keywords) or (isinstance(default, cst.Name) and default.value == "None")

