from __future__ import annotations

from speedfix.engine.findings import Severity
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.model.deepspeed_config import (MARKERS, DeepSpeedConfig, element, named_configs, offloaded,
                                             per_launch_command, section)
from speedfix.model.model_size import command_trains_adapters, estimated_parameters, trains_adapters

# A model this small fits with its gradients and Adam state (16 bytes a parameter: 5.6 GB) on
# any GPU that trains: moving that state to the CPU saves memory nobody needs.
_SMALL = 350_000_000
_LORA = "this is a LoRA run: the optimizer holds only the adapters' state, a few megabytes"


class DeepSpeedNeedlessOffload(Rule):
    """
    ## What it does
    Finds DeepSpeed ZeRO offloading (`"offload_optimizer": {"device": "cpu"}`, `"offload_param"`,
    the old `"cpu_offload": true`) in a run that has nothing worth moving off the GPU:

    - a LoRA run (`peft.get_peft_model`, `LoraConfig`, DeepSpeed-Chat's
      `convert_linear_layer_to_lora` on the default path): the optimizer holds the adapters'
      state only, so offloading the optimizer saves a few megabytes (parameter offload is left
      alone: the frozen base model may need it);
    - a model the code says is small (up to 350M parameters: a Hugging Face config with literal
      sizes, a checkpoint named `opt-125m` or `gpt2`): its weights, gradients and Adam state
      take at most 5.6 GB.

    It reads the same configs as SF905: a dict in the script, a JSON file the script names (also
    `"ds.json" if args.deepspeed else None`: the config of every run that uses DeepSpeed), or
    one the project's launch commands pass (`--deepspeed ds.json`); a JSON file's finding points
    at its `"device"` line. A file only some launch commands name (the full fine-tune's, beside
    the LoRA runs') is left alone: the script's default path says nothing about those runs;
    but a command whose own options make its run a LoRA run (`--use_lora --deepspeed
    ds_offload.json`, taking the script's `if training_args.use_lora: get_peft_model(...)`) has
    its file's optimizer offload reported.
    `"device": "auto"` is no offload (DeepSpeed drops "auto" values and keeps its default).

    ## Why is this bad?
    With the optimizer offloaded, every step copies the gradients to host memory, runs Adam on
    the CPU (DeepSpeedCPUAdam) and copies the updated weights back over PCIe; with parameters
    offloaded, every forward and backward pass fetches the weights from host memory too. That
    is what lets a model too big for the GPU train at all, at several times the step time; for a
    model that fits, it only adds the copies and the CPU's slower update.

    ## Example
    ```python
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    ds_config = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    ```

    ## Use instead
    ```python
    ds_config = {"zero_optimization": {"stage": 2}}
    ```

    ## Fix safety
    No fix: only the GPU's memory tells whether the run fits without offloading, and the config
    may be shared by bigger runs. Remove the offload section (or set `"device": "none"`) and
    check the peak memory of the first steps.

    ## Impact
    High: offloading adds host copies and a CPU optimizer update to every step, several times
    the step time for a model that fits on the GPU. Nothing moves it.

    ## Measured effect
    The Hugging Face DeepSpeed guide ranks the configurations by speed, fastest first: "Stage 0
    (DDP) > Stage 1 > Stage 2 > Stage 2 + offload > Stage 3 > Stage 3 + offload"; offloading is
    for models that do not fit otherwise (ZeRO-Offload trains models up to 10x bigger on one GPU).
    Sources: https://www.deepspeed.ai/tutorials/zero-offload/,
    https://huggingface.co/docs/transformers/deepspeed
    """

    impact = "high"
    code = "SF906"
    name = "deepspeed-needless-offload"
    summary = "DeepSpeed CPU offload in a LoRA run or for a model that fits on the GPU"
    severity = Severity.WARNING
    requires = MARKERS
    effect = "No host copies and CPU optimizer step per training step."

    VALID = [
        Valid(  # a 7B model: what offloading is for
            """
            import deepspeed
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf")
            config = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                            "offload_optimizer": {"device": "cpu"}}}
            deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
            """
        ),
        Valid(  # LoRA on a big model may need its frozen weights offloaded
            """
            import deepspeed
            from peft import LoraConfig, get_peft_model
            model = get_peft_model(base, LoraConfig(r=8))
            config = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}
            deepspeed.initialize(model=model, config=config)
            """
        ),
        Valid(  # "auto" is dropped by DeepSpeed: the device stays "none", nothing is offloaded
            """
            import deepspeed
            from peft import LoraConfig, get_peft_model
            model = get_peft_model(base, LoraConfig(r=8))
            config = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "auto"}}}
            deepspeed.initialize(model=model, config=config)
            """
        ),
        Valid(  # LoRA only behind an option that is off by default
            """
            import argparse
            import deepspeed
            from peft import LoraConfig, get_peft_model
            parser = argparse.ArgumentParser()
            parser.add_argument("--lora", action="store_true")
            args = parser.parse_args()
            if args.lora:
                model = get_peft_model(model, LoraConfig(r=8))
            config = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
            deepspeed.initialize(model=model, config=config)
            """
        ),
    ]
    INVALID = [
        Invalid(  # the config is passed only when DeepSpeed is asked for: every DeepSpeed run offloads
            """
            import argparse
            from peft import LoraConfig, get_peft_model
            from transformers import TrainingArguments
            parser = argparse.ArgumentParser()
            parser.add_argument("--use_deepspeed", action="store_true")
            args = parser.parse_args()
            model = get_peft_model(base, LoraConfig(r=16))
            zero = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
            training_args = TrainingArguments(output_dir="out", deepspeed=zero if args.use_deepspeed else None)
            """
        ),
        Invalid(  # a LoRA run offloading the adapters' optimizer state
            """
            import deepspeed
            from peft import LoraConfig, get_peft_model
            model = get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
            ds_config = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}}}
            deepspeed.initialize(model=model, config=ds_config)
            """
        ),
        Invalid(  # a ~16M-parameter model: both offloads are needless
            """
            import deepspeed
            from transformers import RobertaConfig, RobertaForMaskedLM
            config = RobertaConfig(vocab_size=50265, hidden_size=256, num_hidden_layers=6, intermediate_size=512)
            model = RobertaForMaskedLM(config)
            ds = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                        "offload_param": {"device": "cpu"}}}
            deepspeed.initialize(model=model, config=ds)
            """,
            count=2,
        ),
    ]

    def finish(self) -> None:
        # a file only some launch commands use may be the bigger runs' (`--train_type all`): the
        # script's default path (a LoRA run) says nothing about them
        configs = [config for config in named_configs(self.ctx) if config.values is not None and not config.some_runs]
        offloading = [(config, keys) for config in configs
                      for keys in offloaded(section(config.values or {}, "zero_optimization"))]
        reported: set[tuple[str | None, tuple[str, ...]]] = set()
        if offloading:
            adapters = trains_adapters(self.ctx)
            size = estimated_parameters(self.ctx)
            small = size is not None and size <= _SMALL
            for config, keys in offloading:
                optimizer = keys[0] in ("offload_optimizer", "cpu_offload")
                if small:
                    why = f"the model has about {size / 1e6:,.0f}M parameters: with its gradients and Adam state it fits on the GPU"
                elif adapters and optimizer:
                    why = _LORA
                else:
                    continue
                self._offload(config, keys, why)
                reported.add((config.file, keys))
        self._lora_commands(reported)

    def _lora_commands(self, reported: set[tuple[str | None, tuple[str, ...]]]) -> None:
        """The file a launch command passes whose own options make it a LoRA run (`--use_lora
        --deepspeed ds_zero3_offload.json`), also where other commands name other files."""
        for command, config in per_launch_command(self.ctx):
            if config is None or config.values is None or not command_trains_adapters(self.ctx, command):
                continue
            for keys in offloaded(section(config.values, "zero_optimization")):
                if keys[0] in ("offload_optimizer", "cpu_offload") and (config.file, keys) not in reported:
                    reported.add((config.file, keys))
                    self._offload(config, keys, _LORA)

    def _offload(self, config: DeepSpeedConfig, keys: tuple[str, ...], why: str) -> None:
        optimizer = keys[0] in ("offload_optimizer", "cpu_offload")
        what = "the optimizer state" if optimizer else "the parameters"
        self._report(config, keys, f"ZeRO offloads {what} to the {_device(config, keys)}, but {why}; each step "
                                   "pays the copies over PCIe" + (" and the CPU's Adam step" if optimizer else ""))

    def _report(self, config: DeepSpeedConfig, keys: tuple[str, ...], message: str) -> None:
        reason = "only the GPU's memory tells whether the run fits without it: remove the offload section"
        path = ("zero_optimization", *keys)
        if config.literal is not None:
            self.report(element(config.literal, path) or config.literal, message, no_fix_reason=reason)
            return
        where = config.location(*path)
        if where is not None:
            self.report_at(where, message, no_fix_reason=reason)
        elif config.node is not None:
            self.report(config.node, f"`{config.file}`: {message}", no_fix_reason=reason)


def _device(config: DeepSpeedConfig, keys: tuple[str, ...]) -> str:
    zero = section(config.values or {}, "zero_optimization")
    device = section(zero, keys[0]).get("device") if len(keys) > 1 else "cpu"
    return "NVMe drive" if device == "nvme" else "CPU"
