from __future__ import annotations

from typing import Any, Iterator

import libcst as cst

from speedfix.engine.findings import Applicability, LossCheck, Severity, Transform
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import same_quotes
from speedfix.model.amp import autocasts
from speedfix.model.autograd import differentiates_twice
from speedfix.model.context import FileContext
from speedfix.model.deepspeed_config import MARKERS, UNRESOLVED, DeepSpeedConfig, element, named_configs, offloaded, section
from speedfix.model.hardware import pre_ampere_only
from speedfix.model.versions import v
from speedfix.rules._impact import Estimate, Finding, Impact, compile_gain, small_model
from speedfix.syntax.nodes import code_of

# DeepSpeed's default bucket size (elements) for gradient reduction and parameter all-gathers.
_DEFAULT_BUCKET = 500_000_000
_SMALL_BUCKET = _DEFAULT_BUCKET // 10
# Keys of an "fp16" section that a bf16 section makes pointless (loss scaling and its knobs).
_LOSS_SCALING = frozenset(
    {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale",
     "consecutive_hysteresis", "auto_cast"}
)


_FP32 = 'the DeepSpeed config enables neither "bf16" nor "fp16": the engine trains in fp32'
_COMPILE_NOTE = "the DeepSpeed engine runs the model eagerly"


def _given_optimizer(call: cst.Call) -> bool:
    """`deepspeed.initialize(model=..., optimizer=...)` (or `model_parameters=`): an engine that trains."""
    return any(arg.keyword is not None and arg.keyword.value in ("optimizer", "model_parameters") for arg in call.args)


class DeepSpeedConfigRule(Rule):
    """
    ## What it does
    Reads the DeepSpeed config a script passes: a dict written in the script
    (`deepspeed.initialize(..., config=ds_config)`), or returned by a helper of another scanned
    file (DeepSpeed-Chat's `ds_config = get_train_ds_config(...)`), or a JSON file it names
    (`config="ds_config.json"`, `TrainingArguments(deepspeed="ds_z2.json")`,
    `HfDeepSpeedConfig(...)`, `DeepSpeedPlugin(hf_ds_config=...)`, a `--deepspeed_config`
    default) that lies beside the script or in the current folder, or a JSON file the script
    loads (`json.load(open(args.ds_file))`: each file the launch commands pass, else the
    option's default). It reports:

    - `"fp16": {"enabled": true}` (also written `"true"`, which DeepSpeed's config models read
      as a boolean) where bf16 fits (Ampere and newer GPUs): a warning; not when
      every launch command runs from a SLURM job script that asks for older GPUs
      (`#SBATCH --gres=gpu:v100:4`), where the fp32 advice names fp16 instead of bf16;
    - `"wall_clock_breakdown": true`, which reads its CUDA-event timers on every step (a wait
      for the GPU) and prints a timing line each time: a warning;
    - a ZeRO stage without offloading when the config's batch sizes say one GPU
      (`train_batch_size` = micro-batch x accumulation steps): ZeRO shards state across
      data-parallel GPUs, so there it saves no memory and only adds work: an info note;
    - `reduce_bucket_size` or `allgather_bucket_size` ten times below DeepSpeed's default of
      5e8 elements: many small collective calls per step (an info note);
    - a config for `deepspeed.initialize` that enables neither `bf16` nor `fp16` in a script
      without autocast: the engine trains in fp32;
    - a training script that never compiles its engine (`engine.compile()`, an info note; not for
      the evaluation engines, made without an optimizer, beside one that trains, nor where the
      script differentiates a gradient, as a GAN's R1 penalty does with `create_graph=True`:
      compiled graphs cannot run that double backward).

    Values the script decides are worked out from its argparse defaults (`"enabled": args.dtype
    == "fp16"` with `--dtype` defaulting to "fp16"). The config may also come from the project's
    launch commands: `deepspeed train.py --deepspeed ds_config.json` in every shell script or
    README command that runs the script. A JSON file's findings point at its lines; a file that
    cannot be read as JSON is named in an info note (DeepSpeed reads configs as hjson, which also
    allows comments). `"auto"` values are the Hugging Face Trainer's to fill in, as it does: the
    precision from its own `bf16`/`fp16` flags (SF902 reports those), the batch sizes from its
    batch size, accumulation and world size, which a scan cannot know.

    ## Why is this bad?
    fp16 needs dynamic loss scaling: the loss is scaled, and steps whose gradients overflow are
    skipped while the scale adapts; bf16 has fp32's exponent range and runs as fast on tensor
    cores without it. DeepSpeed's `wall_clock_breakdown` records CUDA events around forward,
    backward and step and reads them back every step, which makes the CPU wait for the GPU.
    ZeRO partitions optimizer state (stage 1), gradients (stage 2) and parameters (stage 3)
    across the ranks of a data-parallel group: with one rank there is nothing to partition, and
    the Hugging Face DeepSpeed guide says a model that fits on one GPU only slows down with it.
    Tiny buckets turn one all-reduce per bucket into many small, latency-bound ones.

    ## Example
    ```python
    ds_config = {
        "train_batch_size": 32,
        "fp16": {"enabled": True, "loss_scale": 0},
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 1e6},
    }
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=ds_config)
    ```

    ## Use instead
    ```python
    ds_config = {
        "train_batch_size": 32,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2},
    }
    ```

    ## Fix safety
    Unsafe, and only for a dict written in the script and passed to `deepspeed.initialize`: the
    "fp16" section (when it holds only loss-scaling settings) becomes `"bf16": {"enabled": True}`.
    bf16 changes the numbers, and GPUs before Ampere have no fast bf16. There is no fix when the
    script counts on fp16 elsewhere: inputs cast with `.half()` or to `torch.float16` (bf16
    weights would meet fp16 activations and the matmul raises), the `fp16` section read or
    written later, or a config given to the Trainer or Accelerate (they check it against their
    own fp16 flag and raise on a mismatch). A JSON file is never rewritten: the finding says
    what to change in it.

    ## Impact
    Medium. An engine that trains in fp32 is high, as SF202 weighs no mixed precision (medium
    for a small model). The compile note is weighed as in SF501: low for a model of a billion
    parameters or more, medium for a small one.

    ## Measured effect
    bf16 runs at fp16's tensor-core speed without loss scaling (PyTorch's AMP documentation);
    ZeRO on one GPU "will only slow things down" when the model fits (Hugging Face DeepSpeed
    guide). Sources: https://huggingface.co/docs/transformers/deepspeed,
    https://www.deepspeed.ai/docs/config-json/
    """

    impact = "medium"
    code = "SF905"
    name = "deepspeed-config"
    summary = "DeepSpeed config with fp16 where bf16 fits, per-step timers, ZeRO on one GPU or tiny buckets"
    severity = Severity.WARNING
    requires = MARKERS
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.NUMERICS
    fix_title = 'Train in bf16 (`"bf16": {"enabled": True}`) instead of fp16 with loss scaling'
    effect = "bf16 without loss scaling; no per-step timer syncs; no ZeRO bookkeeping on one GPU."

    VALID = [
        Valid(  # stylegan2-deepspeed: an R1 penalty differentiates the discriminator's gradient (no compile note)
            """
            import deepspeed
            import torch

            def gradient_penalty(images, output):
                grad, = torch.autograd.grad(outputs=output.sum(), inputs=images, create_graph=True)
                return grad.pow(2).sum()

            config = {"train_batch_size": 8, "bf16": {"enabled": True}}
            disc, *_ = deepspeed.initialize(model=discriminator, optimizer=optimizer, config=config)
            for images in loader:
                images = images.cuda().requires_grad_()
                output = disc(images)
                loss = output.mean() + gradient_penalty(images, output)
                disc.backward(loss)
                disc.step()
            """
        ),
        Valid(
            """
            import deepspeed
            ds_config = {"train_batch_size": 32, "bf16": {"enabled": True}, "zero_optimization": {"stage": 0}}
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=ds_config)
            """
        ),
        Valid(  # ZeRO across GPUs: 256 = 8 per GPU x 32 GPUs
            """
            import deepspeed
            config = {
                "train_batch_size": 256, "train_micro_batch_size_per_gpu": 8,
                "bf16": {"enabled": True}, "zero_optimization": {"stage": 1},
            }
            deepspeed.initialize(model=model, config=config)
            """
        ),
        Valid(  # the Trainer fills in "auto"; offloading is what ZeRO on one GPU is for
            """
            import deepspeed
            config = {
                "fp16": {"enabled": "auto"},
                "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
            }
            deepspeed.initialize(model=model, config=config)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import deepspeed
            ds_config = {
                "train_batch_size": 32,
                "fp16": {"enabled": True, "loss_scale": 0},
                "wall_clock_breakdown": True,
            }
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=ds_config)
            """,
            fixed="""
            import deepspeed
            ds_config = {
                "train_batch_size": 32,
                "bf16": {"enabled": True},
                "wall_clock_breakdown": True,
            }
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=ds_config)
            """,
            count=2,
        ),
        Invalid(  # ZeRO without offload where the batch sizes say one GPU, and tiny buckets: info notes
            """
            import deepspeed
            config = {
                "train_batch_size": 16,
                "train_micro_batch_size_per_gpu": 8,
                "gradient_accumulation_steps": 2,
                "bf16": {"enabled": True},
                "zero_optimization": {"stage": 2, "reduce_bucket_size": 1e6},
            }
            deepspeed.initialize(model=model, config=config)
            """,
            count=2,
        ),
        Invalid(  # inputs cast to fp16: bf16 weights would meet them, so no fix; the engine is not compiled
            """
            import deepspeed
            ds_config = {"train_batch_size": 8, "fp16": {"enabled": True}}
            engine, _, _, _ = deepspeed.initialize(model=model, config=ds_config)
            for x, y in loader:
                loss = engine(x.cuda().half(), y.cuda())
                engine.backward(loss)
                engine.step()
            """,
            count=2,
        ),
        Invalid(  # RLHF: the actor's engine trains and is not compiled; the reference model's engine only evaluates
            """
            import deepspeed
            train_config = {"train_batch_size": 8, "bf16": {"enabled": True}}
            actor, *_ = deepspeed.initialize(model=actor_model, optimizer=optimizer, config=train_config)
            reference, *_ = deepspeed.initialize(model=reference_model, config=eval_config)
            for batch in loader:
                with torch.no_grad():
                    ref_logits = reference(**batch).logits
                loss = kl_loss(actor(**batch).logits, ref_logits)
                actor.backward(loss)
                actor.step()
            """,
        ),
        Invalid(  # the precision an argparse default picks; no reduced precision at all
            """
            import argparse
            import deepspeed
            parser = argparse.ArgumentParser()
            parser.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
            args = parser.parse_args()
            ds_config = {"train_batch_size": 8, "fp16": {"enabled": args.dtype == "fp16"},
                         "bf16": {"enabled": args.dtype == "bf16"}}
            deepspeed.initialize(model=model, config=ds_config)
            fp32 = {"train_batch_size": 8}
            deepspeed.initialize(model=model, config=fp32)
            """,
            count=2,
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._dtype_names: list[cst.Attribute] = []  # `torch.float16`, `torch.half`
        self._fp16_subscripts: set[str] = set()  # `ds_config["fp16"]` read or written

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value in ("float16", "half"):
            self._dtype_names.append(node)

    def visit_Subscript(self, node: cst.Subscript) -> None:
        index = node.slice[0].slice if len(node.slice) == 1 else None
        if isinstance(node.value, cst.Name) and isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
            if index.value.evaluated_value == "fp16":
                self._fp16_subscripts.add(node.value.value)

    def finish(self) -> None:
        configs = named_configs(self.ctx)
        for config in configs:
            if config.values is None:
                message = f"DeepSpeed config not checked: {config.problem}"
                if config.node is not None:
                    self.report(config.node, message, severity=Severity.INFO)
                elif config.where is not None:
                    self.report_at(config.where, message, severity=Severity.INFO)
                continue
            self._check(config)
        self._check_compile(configs)

    def _check(self, config: DeepSpeedConfig) -> None:
        problems = list(self._problems(config))
        if config.literal is not None:
            for keys, message, severity, fix in problems:
                self.report(element(config.literal, keys) or config.literal, message, severity=severity, fix_ops=fix,
                            no_fix_reason="the section holds more than loss-scaling settings")
            return
        for keys, message, severity, _fix in problems:  # each on its line of the JSON file
            where = config.location(*keys)
            if where is not None:
                self.report_at(where, message, severity=severity,
                               no_fix_reason="the config is a JSON file: speedfix rewrites Python only")
            elif config.node is not None and config.file is not None:
                self.report(config.node, f"`{config.file}`: {message}", severity=severity,
                            no_fix_reason="the config is a JSON file: speedfix rewrites Python only")
            elif isinstance(config.node, cst.Call):  # DeepSpeed-Chat's `get_train_ds_config(...)` of another file
                self.report(config.node, f"the config `{code_of(config.node.func)}(...)` returns: {message}",
                            severity=severity, no_fix_reason="the dict is written in another file of the project")

    def impact_here(self, finding: Finding) -> Estimate | None:
        if finding.message.startswith(_FP32):  # no mixed precision at all, weighed as SF202 weighs it
            return small_model(self.ctx, Impact.MEDIUM) or Estimate(
                Impact.HIGH, "an engine that trains in fp32: no matmul or convolution runs on the tensor cores")
        return compile_gain(self.ctx) if _COMPILE_NOTE in finding.message else None

    def _check_compile(self, configs: list[DeepSpeedConfig]) -> None:
        """A training script that builds a DeepSpeed engine and never compiles it."""
        ctx = self.ctx
        if ctx.calls_to("torch.compile") or any(True for _ in ctx.method_calls("compile")) or not ctx.step_loops \
                or ctx.torch_version < v("2.0") or differentiates_twice(ctx) is not None:
            return  # (a gradient of a gradient, a GAN's R1 penalty: compiled graphs cannot run double backward)
        sites = ctx.calls_to("deepspeed.initialize")
        training = [site for site in sites if _given_optimizer(site.node)]
        for site in sites:
            if training and site not in training:
                continue  # an evaluation engine (a reference or reward model) beside the trained ones
            self.report(
                site.node,
                f"{_COMPILE_NOTE}: `engine.compile()` after `deepspeed.initialize` "
                "(DeepSpeed 0.14 and newer) compiles it with `torch.compile`",
                severity=Severity.INFO,
                no_fix_reason="the first steps pay the compile, and a model that does not trace breaks its graph: "
                "measure it with `speedfix bench`",
            )

    def _fp16_elsewhere(self, config: DeepSpeedConfig) -> bool:
        """Does anything else in the script count on fp16: inputs cast with `.half()` or to
        `torch.float16` (bf16 weights then meet fp16 activations), a Trainer or Accelerate that
        checks the config against its own fp16 setting, the `fp16` section read or written later?"""
        ctx = self.ctx
        if config.taker != "deepspeed.initialize":
            return True  # TrainingArguments/Accelerate compare the section with their own flags
        if any(True for _ in ctx.method_calls("half")):
            return True
        if any(ctx.qualname(node) in ("torch.float16", "torch.half") for node in self._dtype_names):
            return True
        return config.name is not None and config.name in self._fp16_subscripts

    def _problems(self, config: DeepSpeedConfig) -> Iterator[tuple[tuple[str, ...], str, Severity, list[Transform] | None]]:
        values = config.values or {}
        fp16, bf16 = section(values, "fp16"), section(values, "bf16")
        old_gpu = pre_ampere_only(self.ctx)  # the job scripts ask for V100s: fp16, never bf16
        if self._fp32(config, fp16, bf16):
            wanted = (f'`"fp16": {{"enabled": true}}` (the job scripts ask for {old_gpu} GPUs, which have no fast bf16)'
                      if old_gpu else '`"bf16": {"enabled": true}`')
            yield (), (f'{_FP32}; {wanted} runs the matmuls on the tensor cores'), Severity.WARNING, None
        if fp16.get("enabled") is True and bf16.get("enabled") is not True and not old_gpu:
            yield ("fp16",), ('"fp16" trains with dynamic loss scaling (a scaled loss, skipped steps on overflow); on '
                              'Ampere and newer GPUs `"bf16": {"enabled": true}` runs as fast without loss scaling'), \
                Severity.WARNING, self._bf16_fix(config)
        if values.get("wall_clock_breakdown") is True:
            yield ("wall_clock_breakdown",), ('"wall_clock_breakdown": true reads its CUDA-event timers on every step, '
                                              "which waits for the GPU, and prints a timing line each time"), \
                Severity.WARNING, None
        zero = section(values, "zero_optimization")
        stage = zero.get("stage")
        if isinstance(stage, int) and not isinstance(stage, bool) and stage >= 1 and not offloaded(zero) \
                and _one_gpu(values):
            sharded = {1: "optimizer state", 2: "optimizer state and gradients"}.get(stage, "optimizer state, "
                                                                                     "gradients and parameters")
            yield ("zero_optimization", "stage"), (f"ZeRO stage {stage} shards {sharded} across data-parallel GPUs: "
                                                   "this config's batch sizes say one GPU, where it saves no memory "
                                                   "without offloading and only adds work (use stage 0)"), \
                Severity.INFO, None
        for key in ("reduce_bucket_size", "allgather_bucket_size"):
            size = zero.get(key)
            if isinstance(size, (int, float)) and not isinstance(size, bool) and 0 < size < _SMALL_BUCKET:
                yield ("zero_optimization", key), (f'"{key}": {size:,.0f} elements makes many small collective calls '
                                                   f"per step; DeepSpeed's default is {_DEFAULT_BUCKET:,}"), Severity.INFO, None

    def _fp32(self, config: DeepSpeedConfig, fp16: dict[str, Any], bf16: dict[str, Any]) -> bool:
        """A config given to `deepspeed.initialize` that turns on no reduced precision, in a
        script without autocast (the Trainer and Accelerate set the precision themselves)."""
        values = config.values or {}
        if config.for_trainer or config.taker is None or UNRESOLVED in values or autocasts(self.ctx):
            return False
        if any(section(values, key).get("enabled") is not False for key in ("fp16", "bf16", "amp", "torch_autocast")
               if key in values):
            return False  # on, or a value speedfix cannot know
        return not fp16.get("enabled") and not bf16.get("enabled")

    def _bf16_fix(self, config: DeepSpeedConfig) -> list[Transform] | None:
        if config.literal is None or "bf16" in (config.values or {}) or self._fp16_elsewhere(config):
            return None
        fp16_element = element(config.literal, ("fp16",))
        fp16 = section(config.values or {}, "fp16")
        if fp16_element is None or not isinstance(fp16_element.key, cst.SimpleString) or not set(fp16) <= _LOSS_SCALING:
            return None
        key = same_quotes(fp16_element.key, "bf16")
        enabled = same_quotes(fp16_element.key, "enabled")

        def rewrite(node: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(node, cst.DictElement)
            return node.with_changes(key=key, value=cst.Dict([cst.DictElement(enabled, cst.Name("True"))]))

        return [Transform(fp16_element, rewrite)]


def _one_gpu(values: dict[str, Any]) -> bool:
    """`train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps`: DeepSpeed
    checks that the batch is micro x steps x world size, so these numbers mean one GPU."""
    batch, micro = values.get("train_batch_size"), values.get("train_micro_batch_size_per_gpu")
    steps = values.get("gradient_accumulation_steps", 1)
    numbers = [v for v in (batch, micro, steps) if isinstance(v, int) and not isinstance(v, bool)]
    return len(numbers) == 3 and batch == micro * steps
