"""How much a script trains: a LoRA adapter, or a model whose size the code gives away.

Memory settings (DeepSpeed's CPU offload) are worth what they save, and that depends on how many
parameters the optimizer holds. A static scan knows it in two cases:

- the script trains adapters (`peft.get_peft_model`, `LoraConfig`, loralib's
  `mark_only_lora_as_trainable`, DeepSpeed-Chat's `convert_linear_layer_to_lora`, or a helper of
  another scanned file that calls one of them) on the default path, or on the path a launch
  command's options take (`--use_lora`): the optimizer holds the adapters only;
- the model is built from sizes the file states: a Hugging Face config with literal sizes
  (`GPT2Config(n_layer=6, n_embd=256, vocab_size=50257)`, the same as a dict), or a checkpoint
  whose name says its size (`"facebook/opt-125m"`, `"EleutherAI/pythia-70m"`, `"gpt2"`); where
  the name is an option that the project's launch commands pass, their value is the run's, not
  the option's default.
"""

from __future__ import annotations

import re

import libcst as cst

from speedfix.model.arguments import find_argument, literal_int, string_value
from speedfix.model.context import FileContext
from speedfix.model.flow import off_by_default, reached_by_command
from speedfix.model.index import CallSite
from speedfix.model import launch
from speedfix.model.launch import Launch
from speedfix.model.project_files import Location
from speedfix.project.steps import makes_adapters

_SIZE_IN_NAME = re.compile(r"[-_/](\d+(?:\.\d+)?)([mb])(?![a-z])", re.IGNORECASE)
# Checkpoints whose names do not say their size (parameters, rounded).
_KNOWN = {
    "gpt2": 124_000_000, "distilgpt2": 82_000_000, "gpt2-medium": 355_000_000, "bert-base-uncased": 110_000_000,
    "bert-base-cased": 110_000_000, "distilbert-base-uncased": 66_000_000, "roberta-base": 125_000_000,
    "t5-small": 60_000_000, "t5-base": 220_000_000, "prajjwal1/bert-tiny": 4_400_000,
}
_SIZES = {  # Hugging Face config keys: (hidden, layers, feed-forward, vocabulary)
    "hidden": ("hidden_size", "n_embd", "d_model", "dim"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "ffn": ("intermediate_size", "n_inner", "d_ff", "hidden_dim"),
    "vocab": ("vocab_size",),
}
_FROM_PRETRAINED = ("from_pretrained",)


def trains_adapters(ctx: FileContext) -> bool:
    """Does the default run train LoRA adapters (the base model frozen)?"""
    return any(off_by_default(ctx, site.statement, site.stack) is None for site in _adapter_sites(ctx))


def command_trains_adapters(ctx: FileContext, command: Launch) -> bool:
    """Does the run of one launch command train LoRA adapters (`--use_lora` turning on the
    script's `if args.use_lora: model = get_peft_model(...)`)?"""
    return any(reached_by_command(ctx, site.statement, site.stack, command) for site in _adapter_sites(ctx))


_QUANTIZED_LOADS = ("load_in_4bit", "load_in_8bit")


def loads_quantized(ctx: FileContext) -> bool:
    """Does the default run load its base model quantized by bitsandbytes (a `BitsAndBytesConfig`,
    `from_pretrained(..., load_in_8bit=True)`): QLoRA and 8-bit LoRA, whose matmuls are
    bitsandbytes kernels that `torch.compile` cannot fuse through?"""
    return any(((site.func or "").rsplit(".", 1)[-1] == "BitsAndBytesConfig" or any(
        arg.keyword is not None and arg.keyword.value in _QUANTIZED_LOADS
        and not (isinstance(arg.value, cst.Name) and arg.value.value in ("False", "None")) for arg in site.node.args))
        and off_by_default(ctx, site.statement, site.stack) is None for site in ctx.calls)


def _adapter_sites(ctx: FileContext) -> list[CallSite]:
    """The calls that leave only adapters to train: of peft or loralib, or of a helper of another
    scanned file that calls them (`model = get_lora_model(model, lora_config)`)."""
    return [site for site in ctx.calls if makes_adapters(ctx.call_qualname(site), site.func)
            or ((callee := ctx.project_callee(site)) is not None and callee.adapters)]


def estimated_parameters(ctx: FileContext) -> int | None:
    """The size of the model the file builds, when the code states it (None: unknown, or more
    than one model)."""
    found = {size for site in ctx.calls if (size := _config_size(ctx, site)) is not None}
    found |= {size for site in ctx.calls if (size := _checkpoint_size(ctx, site)) is not None}
    return found.pop() if len(found) == 1 else None


def _config_size(ctx: FileContext, site: CallSite) -> int | None:
    name = ctx.call_qualname(site) or ""
    if not name.startswith("transformers.") or not name.endswith("Config"):
        if not (name.startswith("transformers.") and name.endswith("Config.from_dict")):
            return None
        if not site.node.args:
            return None
        node = site.node.args[0].value
        if isinstance(node, cst.Name):
            node = ctx.single_value(node.value, site.stack) or node
        return _size(_dict_sizes(ctx, node, site)) if isinstance(node, cst.Dict) else None
    sizes = {}
    for role, keys in _SIZES.items():
        for key in keys:
            value = literal_int(ctx, find_argument(ctx, site, key).node, site.stack)
            if value is not None:
                sizes[role] = value
    return _size(sizes)


def _dict_sizes(ctx: FileContext, node: cst.Dict, site: CallSite) -> dict[str, int]:
    sizes = {}
    for element in node.elements:
        if not isinstance(element, cst.DictElement) or not isinstance(element.key, cst.SimpleString):
            continue
        for role, keys in _SIZES.items():
            if element.key.evaluated_value in keys:
                value = literal_int(ctx, element.value, site.stack)
                if value is not None:
                    sizes[role] = value
    return sizes


def _size(sizes: dict[str, int]) -> int | None:
    """A transformer's parameters: 4 d^2 attention + 2 d f feed-forward per layer, V d embedding."""
    if not {"hidden", "layers", "vocab"} <= set(sizes):
        return None
    hidden, layers, vocab = sizes["hidden"], sizes["layers"], sizes["vocab"]
    ffn = sizes.get("ffn", 4 * hidden)
    return layers * (4 * hidden * hidden + 2 * hidden * ffn) + vocab * hidden


def _checkpoint_size(ctx: FileContext, site: CallSite) -> int | None:
    func = site.node.func
    if not isinstance(func, cst.Attribute) or func.attr.value not in _FROM_PRETRAINED or not site.node.args:
        return None
    if not (ctx.qualname(func.value) or "").startswith("transformers."):
        return None
    node = site.node.args[0].value
    name = string_value(ctx, node, site.stack)
    if isinstance(node, cst.Attribute):  # `model_args.model_name_or_path`: a run command may name another
        options = (node.attr.value, node.attr.value.replace("_", "-"))
        passed = launch.option(ctx, *options)
        if passed.state is launch.State.MIXED:
            return _smallest_named(name, launch.per_command(ctx, *options))
        if passed.state is not launch.State.MISSING:
            name = str(passed.value) if passed.known else None
    return size_in_name(name) if name is not None else None


def _smallest_named(default: str | None, given: list[tuple[object, Location | None] | None]) -> int | None:
    """The smallest checkpoint the launch commands name (the option's default where a command
    leaves it out), passing over a command whose value is a shell variable set nowhere (DeepSeek-
    Coder's README sets `MODEL` and passes `$MODEL_PATH`); None when any named one's size is
    unknown, or none is known."""
    names = [default if value is None else value[0] for value in given]
    sizes = [size_in_name(name) for name in names if isinstance(name, str)]
    return min(sizes) if sizes and None not in sizes else None  # type: ignore[type-var]


def checkpoints_per_run(ctx: FileContext) -> list[str]:
    """The checkpoint each launch command's run loads through a `from_pretrained(args.<option>)`
    of the file (EasyContext's `--model meta-llama/Llama-2-7b-hf`): the command's value, else the
    option's default."""
    names: list[str] = []
    for site in ctx.calls:
        func = site.node.func
        if not isinstance(func, cst.Attribute) or func.attr.value not in _FROM_PRETRAINED or not site.node.args \
                or not (ctx.qualname(func.value) or "").startswith("transformers."):
            continue
        node = site.node.args[0].value
        if not isinstance(node, cst.Attribute):
            continue
        default = string_value(ctx, node, site.stack)
        for given in launch.per_command(ctx, node.attr.value, node.attr.value.replace("_", "-")):
            value = given[0] if given is not None else default
            if isinstance(value, str):
                names.append(value)
    return names


def size_in_name(name: str) -> int | None:
    """The parameters a Hub checkpoint's name says it has (`mistralai/Mistral-7B-v0.1`: 7B)."""
    if name in _KNOWN:
        return _KNOWN[name]
    match = _SIZE_IN_NAME.search(name.lower())
    if match is None:
        return None
    number, unit = float(match.group(1)), match.group(2).lower()
    return int(number * (1_000_000 if unit == "m" else 1_000_000_000))
