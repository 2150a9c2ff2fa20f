"""Where a script runs: does it use CUDA at all, and does it copy anything to a device?

If not, GPU-only advice is noise. The evidence is the file's own (`cuda` in a string, an
attribute or a device helper, noted by the index; not when every device it moves tensors to
is an option that defaults to the CPU), another scanned file's (``Links.cuda``:
``DEVICE`` imported from ``config.py``, or an importer that trains on CUDA), or a training
framework's (a Lightning ``Trainer``, Hugging Face ``TrainingArguments`` or an ``Accelerator``
uses the GPU when there is one).
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

import libcst as cst

from speedfix.model import launch
from speedfix.model.arguments import argparse_option, string_value
from speedfix.model.context import FileContext
from speedfix.model.flow import bound_once, false_in_every_run
from speedfix.model.frames import Stack
from speedfix.model.frameworks import framework_uses_cuda
from speedfix.project.linker import NAMES_CUDA_ITSELF
from speedfix.syntax.names import dotted_name

_USES_CUDA: WeakKeyDictionary[FileContext, bool] = WeakKeyDictionary()


def uses_cuda(ctx: FileContext) -> bool:
    """Does the script touch CUDA at all (computed once per file)? Not when its own mentions of
    CUDA are for a device option that defaults to the CPU (``cpu_by_default``), also where the
    project's links say so for the same mentions."""
    found = _USES_CUDA.get(ctx)
    if found is None:
        linked = ctx.links.cuda is not None and not (ctx.links.cuda == NAMES_CUDA_ITSELF and ctx.mentions_cuda)
        found = _USES_CUDA[ctx] = (ctx.mentions_cuda and not cpu_by_default(ctx)) or linked \
            or framework_uses_cuda(ctx) or _configured_cuda(ctx)
    return found


def _configured_cuda(ctx: FileContext) -> bool:
    """Is a device that the script names only through a setting CUDA by default:
    `torch.device(cfg.training.device)` where every run config of the project says `cuda:0`, or
    `.to(device)` with the `device` that the run configs give the class's constructor?"""
    named = [(site.node.args[0].value, site) for site in ctx.calls_to("torch.device") if site.node.args]
    for site in ctx.method_calls("to"):  # `.to(device)`, `.to(self.device)`: not a dtype or another tensor
        target = next((arg.value for arg in site.node.args if arg.keyword is None or arg.keyword.value == "device"), None)
        if isinstance(target, (cst.Name, cst.Attribute)) and "device" in (dotted_name(target) or "").lower():
            named.append((target, site))
    return any((device := string_value(ctx, target, site.stack)) is not None and device.startswith("cuda")
               for target, site in named)


def trains_on_cpu_only(ctx: FileContext) -> bool:
    """Does the file train with no sign of a GPU anywhere: no CUDA, no framework that picks the
    GPU, nothing copied to a device? Advice about feeding a GPU (loader workers) is then moot."""
    return ctx.drives_training and not uses_cuda(ctx) and not copies_to_device(ctx)


def cpu_by_default(ctx: FileContext) -> bool:
    """Does the script move its tensors only to a device that an option or a constant chooses
    and that is the CPU with the defaults (`parser.add_argument("--device", default="cpu")` then
    `model.to(args.device)`), with no `.cuda()` call and no launch command of the project that
    passes another device? The CUDA it names (`if args.device.startswith("cuda"):`, a help text)
    is then for a run the user asks for, not the default run."""
    if any(True for _ in ctx.method_calls("cuda")):
        return False
    devices: list[str] = []
    options: set[str] = set()
    for site in ctx.method_calls("to"):
        target = next((arg.value for arg in site.node.args if arg.keyword is None or arg.keyword.value == "device"), None)
        if isinstance(target, cst.Call) and ctx.qualname(target.func) == "torch.device" and target.args:
            target = target.args[0].value
        if target is None:
            continue
        device = string_value(ctx, target, site.stack) or _device_every_run_takes(ctx, target, site.stack)
        if isinstance(target, cst.SimpleString):
            if device is not None and not device.startswith("cpu"):
                return False  # `.to("cuda")`
            continue  # `.to("cpu")`: a copy to the host, not where the script runs
        if device is None:
            if "device" in (dotted_name(target) or "").lower():
                return False  # a device the scan cannot know (`"cuda" if torch.cuda.is_available() else "cpu"`)
            continue  # a dtype, another tensor
        if device.split(":", 1)[0] not in _DEVICES:
            continue
        devices.append(device)
        if isinstance(target, cst.Attribute) and argparse_option(ctx, target) is not None:
            options.add(target.attr.value)
    if not devices or not all(device.startswith("cpu") for device in devices):
        return False
    for name in options:
        passed = launch.option(ctx, name, name.replace("_", "-"))
        if passed.state is not launch.State.MISSING and not (passed.known and str(passed.value).startswith("cpu")):
            return False  # a launch command runs the script on another device
    return True


def _device_every_run_takes(ctx: FileContext, target: cst.BaseExpression, stack: Stack) -> str | None:
    """The CPU of `torch.device("cuda" if args.cuda else "cpu")`, bound once to the name or the
    attribute ``target`` (SAC's `self.device`), when the test is false with the defaults and in
    every launch command of the project (`--cuda`, a `store_true` flag that none passes)."""
    bound = bound_once(ctx, target, stack)
    if bound is None:
        return None
    value, at = bound
    if isinstance(value, cst.Call) and ctx.qualname(value.func) == "torch.device" and len(value.args) == 1:
        value = value.args[0].value
    if not isinstance(value, cst.IfExp) or not isinstance(value.orelse, cst.SimpleString):
        return None
    chosen = value.orelse.evaluated_value
    return chosen if isinstance(chosen, str) and chosen.startswith("cpu") and false_in_every_run(ctx, value.test, at) else None


_DEVICES = frozenset({"cpu", "cuda", "mps", "xpu", "npu", "hpu", "xla", "meta"})


_COPIES: WeakKeyDictionary[FileContext, bool] = WeakKeyDictionary()


def copies_to_device(ctx: FileContext) -> bool:
    """Is anything copied to a device here (`.to(...)`, `.cuda()`), in the training loop
    of a function of another scanned file that this file calls (the batches of its loaders),
    by a helper of another scanned file that this file's training loop calls on every batch
    (`batch = to_device(batch, device)`), or by the file that iterates the loaders this file's
    functions return?"""
    found = _COPIES.get(ctx)
    if found is None:
        found = _COPIES[ctx] = (
            any(True for _ in ctx.method_calls("to")) or any(True for _ in ctx.method_calls("cuda"))
            or any(feed[2] for feed in ctx.links.feeds)
            or any((callee := ctx.project_callee(site)) is not None
                   and (callee.uploads or (callee.moves and ctx.in_training_loop(site.stack))) for site in ctx.calls)
        )
    return found


# Calls that start one process per GPU, or join such a group.
_PER_GPU_PROCESSES = (
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "torch.distributed.init_process_group",
    "torch.multiprocessing.spawn",
    "torch.utils.data.DistributedSampler",
    "torch.utils.data.distributed.DistributedSampler",
)


def one_process_per_gpu(ctx: FileContext) -> bool:
    """Does the script run as one process per GPU (DDP, `init_process_group`, `mp.spawn`, a
    `DistributedSampler`)? The node's CPU cores are then shared by all of them."""
    return bool(ctx.calls_to(*_PER_GPU_PROCESSES))


# torch.distributed's collectives: every process waits at each for all the others.
_COLLECTIVES = frozenset(
    f"torch.distributed.{name}" for name in (
        "all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce", "all_to_all", "broadcast",
        "gather", "reduce", "reduce_scatter", "scatter", "barrier",
    )
)


def communication_helper(ctx: FileContext, stack: Stack) -> bool:
    """Is the function around ``stack`` a helper that hands tensors to torch.distributed's
    collectives and takes no training step (the `all_gather(data)` that detection codebases copy
    from maskrcnn-benchmark: it pickles the data and moves its bytes and sizes to the GPU)? What
    it copies is small, and the collective after it waits for every process anyway."""
    function = ctx.function_of(stack)
    if not isinstance(function, cst.FunctionDef) or function in ctx.step_functions:
        return False
    return any(ctx.function_of(site.stack) is function for site in ctx.calls_to(*_COLLECTIVES)) \
        and not any(loop in ctx.loops and ctx.function_of(ctx.loops[loop].stack) is function for loop in ctx.step_loops)
