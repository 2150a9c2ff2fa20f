"""The calls that build a DataLoader: `torch.utils.data.DataLoader`, or a subclass that takes its
arguments unchanged.

`class AudioDataLoader(DataLoader)` whose `__init__` only sets a `collate_fn` and hands
`*args, **kwargs` to `DataLoader.__init__` (or has no `__init__`) is built with DataLoader's own
keywords (`num_workers`, `pin_memory`, ...), so the loader rules read its calls like
DataLoader's. Keyword-only parameters of its own (`*args, LFR_m=1, **kwargs`) are allowed unless
one is named like a parameter of DataLoader's. The subclass is one of this file, or of another
file of the project (``project_classes``, read as text; the module found by the project's layout,
or by the linker for a folder the project puts on `PYTHONPATH`); a subclass with a constructor of
its own is left alone: its parameters need not be DataLoader's.
"""

from __future__ import annotations

import ast
import os
import textwrap
from pathlib import Path
from weakref import WeakKeyDictionary

from speedfix.model.context import FileContext
from speedfix.model.index import CallSite
from speedfix.model.patterns import DATALOADER
from speedfix.model.project_classes import ProjectClass, class_in_file, forwards_init, own_keywords, project_class
from speedfix.syntax.nodes import code_of

_FOUND: WeakKeyDictionary[FileContext, list[CallSite]] = WeakKeyDictionary()
# DataLoader's constructor parameters (torch 2.x): a subclass keeping one of these names for itself
# would not hand it on
_PARAMETERS = frozenset({
    "dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "num_workers", "collate_fn", "pin_memory",
    "drop_last", "timeout", "worker_init_fn", "multiprocessing_context", "generator", "prefetch_factor",
    "persistent_workers", "pin_memory_device", "in_order"})


def dataloader_calls(ctx: FileContext) -> list[CallSite]:
    """The calls of the file that build a DataLoader (the class or a subclass that forwards its
    arguments), in file order; computed once per file."""
    found = _FOUND.get(ctx)
    if found is None:
        found = _FOUND[ctx] = _find(ctx)
    return found


def _find(ctx: FileContext) -> list[CallSite]:
    subclasses = [name for name in ctx.classes if ctx.is_subclass_of(name, *DATALOADER) and _forwards(ctx, name)]
    plain = ctx.calls_to(*DATALOADER)
    found = plain + [site for site in ctx.calls if site.func in subclasses]
    if ctx.project is not None:
        for qualified, sites in ctx.calls_by_qualname.items():
            if qualified in DATALOADER or "Loader" not in qualified.rsplit(".", 1)[-1]:
                continue  # the class's name is the cheap test; its bases decide
            defined = project_class(ctx.project, qualified) or _linked_class(ctx, qualified)
            if defined is not None and _hands_on(defined.forwards_init, defined.own_keywords) \
                    and set(defined.bases) & set(DATALOADER):
                found += sites
    if len(found) == len(plain):
        return found
    order = {id(site.node): index for index, site in enumerate(ctx.calls)}
    return sorted(found, key=lambda site: order.get(id(site.node), 0))


def _forwards(ctx: FileContext, name: str) -> bool:
    try:
        tree = ast.parse(textwrap.dedent(code_of(ctx.classes[name].node)))
    except (SyntaxError, ValueError, RecursionError):
        return False
    node = tree.body[0] if tree.body else None
    return isinstance(node, ast.ClassDef) and _hands_on(forwards_init(node), own_keywords(node))


def _hands_on(forwards: bool, own: tuple[str, ...]) -> bool:
    """Does a subclass take DataLoader's arguments: its constructor forwards them, and keeps none
    of DataLoader's names for itself?"""
    return forwards and not set(own) & _PARAMETERS


def _linked_class(ctx: FileContext, qualified: str) -> ProjectClass | None:
    """The class from the module the linker resolved its import to, when the project's layout
    does not hold it (`from data import AudioDataLoader` with `src/data/` on `PYTHONPATH`)."""
    found = ctx.links.lookup(qualified) if ctx.project is not None else None
    if found is None or "." in found[1]:
        return None
    shown = ctx.links.names.get(found[0])
    return class_in_file(ctx.project, Path(os.path.abspath(shown)), found[1]) if shown else None
