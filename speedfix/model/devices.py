"""Where a script runs: does it use CUDA at all?

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
