"""What the training frameworks tell about a script: Lightning, Hugging Face's Trainer, Accelerate.

A framework script often never writes "cuda": Lightning's `Trainer` uses the GPU whenever one is
there (its default `accelerator="auto"`), so do Hugging Face's `TrainingArguments` (unless
`use_cpu=True`) and Accelerate's `Accelerator` (unless `cpu=True`), and all three move the
batches to the device themselves. These helpers read that from the code; they never import a
framework.
"""

from __future__ import annotations

import libcst as cst

from speedfix.model import launch
from speedfix.model.arguments import ArgValue, find_argument, literal_bool, literal_int, string_value
from speedfix.model.config_files import run_configs
from speedfix.model.config_tree import ConfigError, load
from speedfix.model.context import FileContext
from speedfix.model.deepspeed_config import DEEPSPEED_INITIALIZE
from speedfix.model.flow import assigned_name, default_truth, is_returned, literal_value, taken_on_a_gpu
from speedfix.model.frames import Stack, class_of_method, function_of
from speedfix.model.index import CallSite
from speedfix.model.loaded_config import loaded_node
from speedfix.project.steps import (HF_TRAINERS, LIGHTNING_CALLBACK, LIGHTNING_CLI, LIGHTNING_DATAMODULE, LIGHTNING_MODULE,
                                    LIGHTNING_TRAINER)
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import walk_expression

# Lightning 1.x: a Trainer made from the parsed command line
LIGHTNING_FROM_ARGPARSE = tuple(f"{name}.from_argparse_args" for name in LIGHTNING_TRAINER)
LIGHTNING_FABRIC = ("lightning.Fabric", "lightning.fabric.Fabric", "lightning_fabric.Fabric")
HF_TRAINING_ARGUMENTS = (
    "transformers.TrainingArguments",
    "transformers.training_args.TrainingArguments",
    "transformers.Seq2SeqTrainingArguments",
    "transformers.training_args_seq2seq.Seq2SeqTrainingArguments",
)
# TRL's trainer configs: subclasses of TrainingArguments with TRL's own defaults.
TRL_CONFIGS = tuple(
    f"trl.{name}Config" for name in (
        "SFT", "DPO", "GRPO", "KTO", "Reward", "RLOO", "ORPO", "CPO", "PPO", "BCO", "OnlineDPO", "GKD", "PRM",
        "XPO", "NashMD",
    )
)
# Parsers that fill TrainingArguments (or a TRL config) from the command line.
HF_ARGUMENT_PARSERS = ("transformers.HfArgumentParser", "transformers.hf_argparser.HfArgumentParser", "trl.TrlParser")
ACCELERATOR = ("accelerate.Accelerator", "accelerate.accelerator.Accelerator")
# Bytes that can make a file GPU code without the word "cuda" (for `Rule.may_apply`'s prefilter).
GPU_MARKERS = (b"Trainer", b"TrainingArguments", b"Accelerator", b"Fabric", b"Lightning", b"ArgumentParser",
               b"TrlParser", b"Config(", b"device")
# Why a finding on a framework setting has no fix: the call does not write the value itself.
SET_ELSEWHERE = "the value is set outside the call (a constant or an argparse default)"
# Lightning accelerators that are certainly not a CUDA GPU.
NOT_CUDA = frozenset({"cpu", "tpu", "mps", "hpu", "ipu", "xla"})
# Lightning 1.x took the distributed backend as `accelerator` (`--accelerator ddp` with `--gpus 4`):
# the devices are then whatever `gpus` says.
LEGACY_STRATEGIES = frozenset({"dp", "ddp", "ddp2", "ddp_spawn", "horovod", "ddp_sharded", "ddp_sharded_spawn",
                               "deepspeed", "fsdp"})


FP32_PRECISIONS = frozenset({"32", "32-true"})
# FSDP's own mixed precision policy: a Trainer/Fabric without `precision` then trains in its dtypes.
SHARDED_MIXED_PRECISION = (
    "torch.distributed.fsdp.MixedPrecisionPolicy", "torch.distributed.fsdp.MixedPrecision",
    "torch.distributed._composable.fsdp.MixedPrecisionPolicy",
)


def lightning_precision(ctx: FileContext, site: CallSite) -> tuple[str | None, ArgValue]:
    """The `precision` a Lightning `Trainer(...)`/`Fabric(...)` trains in, as text ("32" when left
    out: the default "32-true"; None when it cannot be known, or FSDP's policy sets it), with the
    argument as written."""
    precision = find_argument(ctx, site, "precision")
    if precision.unknown or precision.missing and ctx.calls_to(*SHARDED_MIXED_PRECISION):
        return None, precision
    if precision.missing:
        return "32", precision
    number = literal_int(ctx, precision.node, site.stack)
    text = str(number) if number is not None else string_value(ctx, precision.node, site.stack)
    if text is None and precision.node is not None:  # `"16-mixed" if hps.train.fp16_run else 32`
        value = literal_value(ctx, precision.node, site.stack)
        text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    return text, precision


def fabric_in_fp32(ctx: FileContext) -> bool:
    """Does a `Fabric(...)` of the file certainly train in fp32 on the GPU? Its precision and TF32
    advice is then SF901's, on the `Fabric` call: one TF32 finding, under the framework's rule."""
    return any(lightning_on_gpu(ctx, site) and lightning_precision(ctx, site)[0] in FP32_PRECISIONS
               for site in ctx.calls_to(*LIGHTNING_FABRIC))


def lightning_on_gpu(ctx: FileContext, site: CallSite) -> bool:
    """Does this Lightning `Trainer(...)`/`Fabric(...)` train on a CUDA GPU when there is one?

    Its `accelerator` defaults to "auto", which picks the GPU: only a known CPU/TPU/MPS value
    says no. A value speedfix cannot know (`accelerator=args.accelerator` without a default)
    means no, so that the framework rules stay silent rather than guess. A choice on the GPU
    itself (`"gpu" if torch.cuda.is_available() else "cpu"`) is its first value. A Lightning 1.x
    `gpus=` decides when `accelerator` is absent or names a distributed backend (``_some_gpus``).
    """
    accelerator = find_argument(ctx, site, "accelerator")
    gpus = find_argument(ctx, site, "gpus")
    if not gpus.missing and (accelerator.missing or _strategy_only(ctx, accelerator.node, site.stack)):
        return _some_gpus(ctx, gpus.node, site.stack)  # Lightning 1.x: `gpus=device_num, accelerator="ddp"`
    if accelerator.missing:
        return True
    node = accelerator.node
    if isinstance(node, cst.IfExp) and taken_on_a_gpu(ctx, node.test, site.stack):
        node = node.body
    value = string_value(ctx, node, site.stack)
    return value is not None and value.lower() not in NOT_CUDA


def _strategy_only(ctx: FileContext, node: cst.BaseExpression | None, stack: Stack) -> bool:
    """A Lightning 1.x `accelerator` that names a distributed backend, or nothing, whichever way
    it is chosen (`"ddp" if device_num > 1 else None`): it says nothing of the device."""
    choices = [node.body, node.orelse] if isinstance(node, cst.IfExp) else [node]
    for choice in choices:
        if isinstance(choice, cst.Name) and choice.value == "None":
            continue
        value = string_value(ctx, choice, stack)
        if value is None or value.lower() not in LEGACY_STRATEGIES:
            return False
    return True


def _some_gpus(ctx: FileContext, node: cst.BaseExpression | None, stack: Stack) -> bool:
    """Does a Lightning 1.x `gpus` setting take GPUs: a count other than 0 (-1: all of them), a
    list of devices, `"0,1"`, or the machine's own count (`torch.cuda.device_count()`, directly or
    through a name)? None, 0 or a value speedfix cannot know: no (1.x's default is the CPU)."""
    if isinstance(node, cst.IfExp) and taken_on_a_gpu(ctx, node.test, stack):
        node = node.body
    if isinstance(node, cst.Name):
        node = ctx.single_value(node.value, stack) or node
    if isinstance(node, cst.Call) and ctx.qualname(node.func) == "torch.cuda.device_count":
        return True
    if isinstance(node, (cst.List, cst.Tuple)):
        return bool(node.elements)  # `gpus=[0]`: those devices
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus) and isinstance(node.expression, cst.Integer):
        return True  # `gpus=-1`: all of them
    count = literal_int(ctx, node, stack)
    if count is not None:
        return count != 0
    listed = string_value(ctx, node, stack)
    if listed is None and node is not None and (loaded := loaded_node(ctx, node, stack)) is not None:
        # nuwave's `gpus=hparams.train.gpus` of `hparams = OmegaConf.load('hparameter.yaml')`
        value = loaded.value
        return isinstance(value, (int, list, str)) and not isinstance(value, bool) and value not in (0, [], "", "0")
    return listed is not None and listed.strip() not in ("", "0")


def hf_args_on_gpu(ctx: FileContext, site: CallSite) -> bool:
    """`TrainingArguments` train on CUDA when it is there, unless told `use_cpu`/`no_cuda`."""
    for keyword in ("use_cpu", "no_cuda"):
        flag = find_argument(ctx, site, keyword)
        if flag.unknown or (not flag.missing and literal_bool(ctx, flag.node, site.stack) is not False):
            return False
    return True


def accelerator_on_gpu(ctx: FileContext, site: CallSite) -> bool:
    """`Accelerator(...)` places everything on the GPU when there is one, unless `cpu=True` (a
    `--cpu` flag that is off by default counts as False)."""
    cpu = find_argument(ctx, site, "cpu")
    return cpu.missing or cpu.node is not None and default_truth(ctx, cpu.node, site.stack) is False


# What an `Accelerator` tells of the process it runs in (`Accelerator().process_index` for a
# device map), as opposed to the one that prepares the model and runs its backward pass.
_PROCESS_INFO = frozenset({"process_index", "local_process_index", "num_processes", "is_main_process",
                           "is_local_main_process", "device", "state", "distributed_type"})


def process_info_only(site: CallSite) -> bool:
    """`Accelerator().process_index`: an Accelerator made to read one fact of the process (a
    device map's index, Finetune_LLMs' quantized path), never kept, so never the one that trains."""
    statement = site.statement
    return statement is not None and any(
        isinstance(node, cst.Attribute) and node.value is site.node and node.attr.value in _PROCESS_INFO
        for node in walk_expression(statement))


def framework_uses_cuda(ctx: FileContext) -> bool:
    """CUDA evidence from the frameworks: a GPU-capable Lightning Trainer or Fabric (without one, a
    `LightningCLI` or a LightningModule/DataModule: Lightning's default accelerator is the GPU), a
    subclass of Hugging Face's `Trainer` (it trains on the GPU when there is one),
    Hugging Face `TrainingArguments`, an `Accelerator`, `accelerator.device` used as a device, or a
    DeepSpeed engine (`deepspeed.initialize`: DeepSpeed trains on accelerators).

    Each of them also moves the batches to the device itself, so a DataLoader in such a file
    feeds the GPU without any `.to()`/`.cuda()` in the file."""
    trainers = ctx.calls_to(*LIGHTNING_TRAINER, *LIGHTNING_FABRIC)
    if any(lightning_on_gpu(ctx, site) for site in trainers):
        return True
    if not trainers and (ctx.calls_to(*LIGHTNING_CLI) or any(is_lightning_class(ctx, name) for name in ctx.classes)):
        return True
    if any(ctx.is_subclass_of(name, *HF_TRAINERS) for name in ctx.classes):
        return True  # a Hugging Face Trainer subclass: the Trainer trains on the GPU when there is one
    return (
        any(hf_args_on_gpu(ctx, site) for site in ctx.calls_to(*HF_TRAINING_ARGUMENTS, *TRL_CONFIGS))
        or bool(ctx.calls_to(*HF_ARGUMENT_PARSERS))
        or any(accelerator_on_gpu(ctx, site) for site in ctx.calls_to(*ACCELERATOR))
        or _uses_accelerator_device(ctx)
        or bool(ctx.calls_to(DEEPSPEED_INITIALIZE))
    )


def is_lightning_class(ctx: FileContext, class_name: str | None) -> bool:
    """A LightningModule or LightningDataModule defined in this file."""
    return class_name is not None and ctx.is_subclass_of(class_name, *LIGHTNING_MODULE, *LIGHTNING_DATAMODULE)


def lightning_manual_optimization(ctx: FileContext) -> bool:
    """Does a LightningModule of this file optimize by hand (`self.automatic_optimization =
    False`)? Its steps take turns (a GAN's generator, then its discriminator), so a backward
    leaves the other networks' parameters without gradients: DDP has to look for them."""
    return any(default_truth(ctx, assignment.value, assignment.stack) is False
               and is_lightning_class(ctx, (owner := class_of_method(assignment.stack)) and owner.name.value)
               for assignment in ctx.assignments.get("self.automatic_optimization", ()))


def in_lightning_callback(ctx: FileContext, site: CallSite) -> bool:
    """Is the call in a hook of a Lightning `Callback` of this file (`on_fit_start(self, trainer,
    pl_module)`)? What it trains hangs off the LightningModule the Trainer owns."""
    owner = class_of_method(site.stack)
    return owner is not None and ctx.is_subclass_of(owner.name.value, *LIGHTNING_CALLBACK)


def configured_trainers_off_gpu(ctx: FileContext, stack: Stack) -> str | None:
    """Why the optimizer the `configure_optimizers` at ``stack`` builds steps on no GPU, or None:
    the project's run configs name its class, build Lightning Trainers (`_target_:
    lightning.pytorch.Trainer` in a hydra group, LightningCLI's `trainer:`) and every one of them
    names a CPU (TPU, MPS...) accelerator. The Trainer puts the module's parameters, and so the
    optimizer's state, on its own device, whatever devices the module's code names."""
    function = function_of(stack)
    owner = class_of_method(stack)
    if not isinstance(function, cst.FunctionDef) or function.name.value != "configure_optimizers" or owner is None:
        return None
    configs = run_configs(ctx)
    if owner.name.value not in configs.named_classes():
        return None
    trainers = configs.built(LIGHTNING_TRAINER)
    trainers += [trainer for tree in configs.cli_configs() if (trainer := tree.get("trainer")) is not None]
    accelerators = {str(found.value).lower() if (found := trainer.get("accelerator")) is not None else None
                    for trainer in trainers}
    if not trainers or not all(value in NOT_CUDA for value in accelerators):
        return None
    return f"every Lightning Trainer of the project's configs says `accelerator: {', '.join(sorted(map(str, accelerators)))}`"


def in_lightning_method(ctx: FileContext, site: CallSite) -> bool:
    """Is the call in a method of a LightningModule/LightningDataModule of this file?"""
    owner = class_of_method(site.stack)
    return owner is not None and is_lightning_class(ctx, owner.name.value)


# Lightning runs its validation, test and predict loops, hooks included, under
# `torch.inference_mode()` (or `no_grad`): `validation_step`, `on_validation_epoch_end`, `test_step`...
_NO_GRAD_HOOK_STAGES = ("validation", "test", "predict")


def lightning_hook_without_grad(ctx: FileContext, stack: Stack) -> bool:
    """Is code at ``stack`` in a validation/test/predict hook of a LightningModule or Callback of
    this file (`validation_step`, `on_validation_epoch_end`, `on_test_batch_end`, ...)? Lightning
    runs those with autograd off."""
    function = ctx.function_of(stack)
    owner = class_of_method(stack)
    if not isinstance(function, cst.FunctionDef) or owner is None:
        return False
    words = function.name.value.removeprefix("on_").split("_")
    if words[0] not in _NO_GRAD_HOOK_STAGES or len(words) < 2 or words[1] not in ("step", "batch", "epoch"):
        return False
    return is_lightning_class(ctx, owner.name.value) or ctx.is_subclass_of(owner.name.value, *LIGHTNING_CALLBACK)


_LOADER_HOOKS = ("train_dataloader", "val_dataloader")  # iterated every epoch (validation runs per epoch)
_ONE_PASS_HOOKS = ("test_dataloader", "predict_dataloader")  # iterated by `trainer.test()`/`.predict()` only


def lightning_one_pass_loader(ctx: FileContext, site: CallSite) -> bool:
    """Is the DataLoader made at ``site`` what a LightningModule/DataModule's `test_dataloader` or
    `predict_dataloader` hook returns (a method of that name, or one the class assigns to it:
    `self.test_dataloader = partial(self._test_dataloader, shuffle=False)`)? Lightning iterates
    it only in `trainer.test()`/`trainer.predict()`: one pass, never in training."""
    hooked = lightning_loader_hooks(ctx, site)
    return bool(hooked) and hooked <= set(_ONE_PASS_HOOKS)


def lightning_loader_hooks(ctx: FileContext, site: CallSite) -> set[str]:
    """The DataLoader hooks of a LightningModule/DataModule whose loader is the one made at
    ``site``: the method returning it is the hook, or the class assigns it to the hook
    (`self.train_dataloader = self._train_dataloader`)."""
    function = ctx.function_of(site.stack)
    if not isinstance(function, cst.FunctionDef) or not in_lightning_method(ctx, site) or not is_returned(function, site):
        return set()
    name = function.name.value
    return {hook for hook in (*_LOADER_HOOKS, *_ONE_PASS_HOOKS)
            if name == hook or any(_names_method(a.value, name) for a in ctx.assignments.get(f"self.{hook}", ()))}


def _names_method(value: cst.BaseExpression | None, name: str) -> bool:
    """`self.<name>`, or `partial(self.<name>, ...)`."""
    if isinstance(value, cst.Call) and (dotted_name(value.func) or "").endswith("partial") and value.args:
        value = value.args[0].value
    return dotted_name(value) == f"self.{name}" if value is not None else False


def lightning_iterates_per_epoch(ctx: FileContext, site: CallSite) -> bool:
    """Does Lightning iterate the DataLoader made at ``site`` once per epoch, for several epochs?
    It does for a loader returned by a LightningModule/DataModule's `train_dataloader` or
    `val_dataloader` (also a method the class assigns to them), and for one handed to
    `trainer.fit(...)`, unless every Trainer of the file stops after one epoch (`max_epochs=1`; Lightning's default is 1000 epochs)."""
    hooked = bool(lightning_loader_hooks(ctx, site) & set(_LOADER_HOOKS))
    loader = assigned_name(site)
    fitted = loader is not None and any(
        dotted_name(arg.value) == loader for fit in ctx.method_calls("fit") for arg in fit.node.args[1:])
    if not (hooked or fitted):
        return False
    trainers = ctx.calls_to(*LIGHTNING_TRAINER)
    return not trainers or any(
        literal_int(ctx, find_argument(ctx, trainer, "max_epochs").node, trainer.stack) != 1 for trainer in trainers)


def lightning_fits(ctx: FileContext) -> bool:
    """Does the file train through Lightning: a `Trainer` (Lightning 1.x's
    `Trainer.from_argparse_args(args)` too) and a `.fit(...)` call?"""
    return bool(ctx.calls_to(*LIGHTNING_TRAINER, *LIGHTNING_FROM_ARGPARSE)) and any(True for _ in ctx.method_calls("fit"))


# What a Trainer does besides training.
_EVALUATION_CALLS = ("test", "validate", "predict")


def evaluation_only_trainer(ctx: FileContext, site: CallSite) -> bool:
    """A Lightning `trainer = Trainer(...)` that its function (or the module) only tests,
    validates or predicts with (HTS-AT's `test` and `esm_test` modes): every use of the name is
    such a call; none fits, hands the Trainer on or returns it."""
    name = assigned_name(site)
    if name is None or "." in name:
        return False
    scope = function_of(site.stack) or ctx.module
    evaluations = sum(1 for method in _EVALUATION_CALLS for call in ctx.method_calls(method)
                      if isinstance(call.node.func, cst.Attribute) and isinstance(call.node.func.value, cst.Name)
                      and call.node.func.value.value == name and (function_of(call.stack) or ctx.module) is scope)
    if not evaluations:
        return False
    uses = sum(1 for node in walk_expression(scope) if isinstance(node, cst.Name) and node.value == name)
    return uses == evaluations + 1  # the assignment, and the evaluation calls


def trainer_fits(ctx: FileContext) -> list[CallSite]:
    """The `.fit(model, ...)` calls of the file that train through a Lightning Trainer: on a
    name assigned a `Trainer(...)` of the file, on a `Trainer(...)` call itself, or on a
    `trainer` (`cli.trainer.fit(...)`); not an encoder's or a scaler's `fit(data)`. When no
    call's receiver shows a Trainer, the `.fit` calls whose receiver is not a fresh object of
    another class (`LabelEncoder().fit(...)`)."""
    holders = _assigned_from(ctx, LIGHTNING_TRAINER)

    def receiver(site: CallSite) -> cst.BaseExpression:
        assert isinstance(site.node.func, cst.Attribute)
        return site.node.func.value

    def is_trainer(node: cst.BaseExpression) -> bool:
        if isinstance(node, cst.Call):
            return ctx.qualname(node.func) in LIGHTNING_TRAINER
        name = dotted_name(node)
        return name is not None and (name in holders or name.rsplit(".", 1)[-1].lower().endswith("trainer"))

    fits = [site for site in ctx.method_calls("fit") if site.node.args]
    return [site for site in fits if is_trainer(receiver(site))] \
        or [site for site in fits if not isinstance(receiver(site), cst.Call)]


def fitted_classes(ctx: FileContext) -> set[str]:
    """The classes whose instances the file's `trainer.fit(...)` calls train, qualified through
    its imports (`model = CLIPWrapper(...)`, `trainer.fit(model, dm)` -> `models.CLIPWrapper`)."""
    found: set[str] = set()
    for site in ctx.method_calls("fit"):
        module = find_argument(ctx, site, "model", 0)
        node = module.node
        if isinstance(node, cst.Name):
            node = ctx.single_value(node.value, site.stack)
        if isinstance(node, cst.Call):
            qualified = ctx.qualname(node.func)
            if qualified is not None:
                found.add(qualified)
    return found


def fabric_setups(ctx: FileContext) -> list[CallSite]:
    """`fabric.setup(model, optimizer)` / `fabric.setup_module(model)` of a `Fabric(...)` of the
    file: Fabric wraps the model for its strategy and precision from there on."""
    holders = _assigned_from(ctx, LIGHTNING_FABRIC)
    return [site for attr in ("setup", "setup_module") for site in ctx.method_calls(attr)
            if site.node.args and dotted_name(site.node.func.value) in holders]  # type: ignore[attr-defined]


def fabric_owned(ctx: FileContext, model: str) -> bool:
    """Is ``model`` handed to a `fabric.setup(...)` of the file?"""
    return any(dotted_name(site.node.args[0].value) == model for site in fabric_setups(ctx))


def accelerate_prepared(ctx: FileContext, model: str) -> bool:
    """Is ``model`` handed to the `prepare(...)` of an `Accelerator` of the file?"""
    holders = {"accelerator", *_assigned_from(ctx, ACCELERATOR)}
    return any(site.func.rsplit(".", 1)[0] in holders and any(dotted_name(arg.value) == model for arg in site.node.args)
               for site in ctx.method_calls("prepare") if site.func and "." in site.func)


def accelerator_step_state(ctx: FileContext, node: cst.BaseExpression) -> bool:
    """`accelerator.sync_gradients`: Accelerate's own state, not an option of the run. It is True
    whenever the optimizer steps (every step without gradient accumulation), so code under it
    runs once per optimizer step; its name only looks like a `--sync` debugging flag."""
    owner, _, attr = (dotted_name(node) or "").rpartition(".")
    if attr != "sync_gradients" or not owner:
        return False
    holders = {"accelerator", *_assigned_from(ctx, ACCELERATOR)}
    return owner in holders or owner.endswith((".accelerator", "gradient_state"))


def _uses_accelerator_device(ctx: FileContext) -> bool:
    """`model.to(accelerator.device)`, `device = accelerator.device` (Accelerate's idiom)."""
    holders = {"accelerator", *_assigned_from(ctx, ACCELERATOR)}

    def is_device(node: cst.BaseExpression) -> bool:
        name = dotted_name(node) or ""
        owner, _, attr = name.rpartition(".")
        return attr == "device" and (owner in holders or owner.endswith(".accelerator"))

    if any(is_device(a.value) for found in ctx.assignments.values() for a in found):
        return True
    return any(is_device(arg.value) for site in ctx.method_calls("to") for arg in site.node.args)


def _assigned_from(ctx: FileContext, qualnames: tuple[str, ...]) -> set[str]:
    """Variables assigned the result of one of these calls (`accelerator = Accelerator(...)`)."""
    names: set[str] = set()
    for site in ctx.calls_to(*qualnames):
        for statement in site.statement.body if site.statement is not None else ():
            if isinstance(statement, cst.Assign) and statement.value is site.node:
                names.update(n for target in statement.targets if (n := dotted_name(target.target)))
    return names


def launched_mixed_precision(ctx: FileContext) -> list[str | None]:
    """The mixed precision each launch command of the project gives an `Accelerator()` that
    leaves it open: `accelerate launch --mixed_precision bf16`, the `mixed_precision:` of the
    `--config_file` it names, or the script's own `--mixed_precision` option; None for a
    command that sets none, "?" where it cannot be known (a shell variable, an unreadable file)."""
    found: list[str | None] = []
    for command in launch.launches(ctx):
        value = command.launcher_options.get("mixed_precision", command.options.get("mixed_precision"))
        if value is None:
            value = _config_file_value(ctx, command, "mixed_precision")
        found.append(value if isinstance(value, str) or value is None else "?")
    return found


def launched_in_fp32(ctx: FileContext) -> bool:
    """Does every launch command give the `Accelerator` `--mixed_precision="no"` (fp32 for certain)?"""
    chosen = launched_mixed_precision(ctx)
    return bool(chosen) and all(value == "no" for value in chosen)


def _config_file_value(ctx: FileContext, command: launch.Launch, key: str) -> object:
    """``key`` of the Accelerate config file a launch command names (`--config_file
    deepspeed.yaml`): its value, None when the file leaves it out or no file is named, "?"
    when the file cannot be read."""
    config = command.launcher_options.get("config_file")
    project = ctx.project
    if config is None:
        return None
    if not isinstance(config, str) or project is None:
        return "?"
    path = project.find(config, (command.file.parent, project.top(), project.folder))
    try:
        tree = load(project, path) if path is not None else None
    except ConfigError:
        tree = None
    node = tree.get(key) if tree is not None else None
    return node.value if node is not None else ("?" if tree is None else None)


def accelerate_runs_deepspeed(ctx: FileContext) -> bool:
    """Does the file's `Accelerator` run DeepSpeed: given a `deepspeed_plugin=`, or launched by
    commands that all say so (`accelerate launch --use_deepspeed`, or a `--config_file` whose
    `distributed_type` is DEEPSPEED)? DeepSpeed's engine then owns the gradients: the prepared
    optimizer's `zero_grad()` does nothing, `accelerator.backward` clears them."""
    return _accelerate_runs(ctx, "deepspeed")


def accelerate_runs_fsdp(ctx: FileContext) -> bool:
    """Does the file's `Accelerator` run FSDP: given an `fsdp_plugin=`, or launched by commands
    that all say so (`accelerate launch --use_fsdp`, or a `--config_file` whose `distributed_type`
    is FSDP, HALOs' `accelerate_config/fsdp_8gpu.yaml`)? FSDP then wraps the model, not DDP."""
    return _accelerate_runs(ctx, "fsdp")


def accelerate_single_process(ctx: FileContext) -> bool:
    """Do the project's commands that run the script (one at least) all start one process:
    `accelerate launch --num_processes=1`, a `--config_file` whose `num_processes` is 1, or
    `python` itself? The `Accelerator` then wraps no model in DDP."""
    commands = launch.launches(ctx)
    if not commands or launch.launch_files_capped(ctx):
        return False
    for command in commands:
        if command.launcher == "python" and not command.launcher_options:
            continue
        if command.launcher != "accelerate":
            return False
        count = command.launcher_options.get("num_processes")
        if str(count if count is not None else _config_file_value(ctx, command, "num_processes")) != "1":
            return False
    return True


def _accelerate_runs(ctx: FileContext, kind: str) -> bool:
    """Given a `<kind>_plugin=`, or launched that way by every command whose config file can be
    read (and by one at least): a command naming a file the project does not hold (a docstring's
    `--config_file fsdp_config.yaml`) does not speak; nor does a `**kwargs` that may hold the
    plugin (imagen-pytorch's `Accelerator(**{..., **accelerate_kwargs})`, empty by default)."""
    for site in ctx.calls_to(*ACCELERATOR):
        plugin = find_argument(ctx, site, f"{kind}_plugin")
        if not plugin.missing and not plugin.unknown:
            return True
    says: set[bool] = set()
    for command in launch.launches(ctx):
        distributed = _config_file_value(ctx, command, "distributed_type")
        if command.launcher_options.get(f"use_{kind}") is not True and distributed == "?":
            continue
        says.add(command.launcher_options.get(f"use_{kind}") is True or str(distributed).upper() == kind.upper())
    return says == {True}
