"""Where a script runs: does it use CUDA at all, and does it copy anything to a device?

If not, GPU-only advice is noise. The evidence is the file's own (`cuda` in a string, an
attribute or a device helper, noted by the index), another scanned file's (``Links.cuda``:
``DEVICE`` imported from ``config.py``, or an importer that trains on CUDA), or a training
framework's (a Lightning ``Trainer``, Hugging Face ``TrainingArguments`` or an ``Accelerator``
uses the GPU when there is one).
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

from speedfix.model.context import FileContext
from speedfix.model.frameworks import framework_uses_cuda

_USES_CUDA: WeakKeyDictionary[FileContext, bool] = WeakKeyDictionary()


def uses_cuda(ctx: FileContext) -> bool:
    """Does the script touch CUDA at all (computed once per file)?"""
    found = _USES_CUDA.get(ctx)
    if found is None:
        found = _USES_CUDA[ctx] = ctx.mentions_cuda or ctx.links.cuda is not None or framework_uses_cuda(ctx)
    return found


def trains_on_cpu_only(ctx: FileContext) -> bool:
    """Does the file train with no sign of a GPU anywhere: no CUDA, no framework that picks the
    GPU, nothing copied to a device? Advice about feeding a GPU (loader workers) is then moot."""
    return ctx.drives_training and not uses_cuda(ctx) and not copies_to_device(ctx)


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
            or any(uploads for _, _, uploads, _ in ctx.links.feeds)
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
