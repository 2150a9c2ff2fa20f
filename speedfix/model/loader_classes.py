"""The calls that build a DataLoader: `torch.utils.data.DataLoader`, or a subclass that takes its
arguments unchanged.

`class AudioDataLoader(DataLoader)` whose `__init__` only sets a `collate_fn` and hands
`*args, **kwargs` to `DataLoader.__init__` (or has no `__init__`) is built with DataLoader's own
keywords (`num_workers`, `pin_memory`, ...), so the loader rules read its calls like
DataLoader's. The subclass is one of this file, or of another file of the project
(``project_classes``, read as text); a subclass with a constructor of its own is left alone: its
parameters need not be DataLoader's.
"""

from __future__ import annotations

import ast
import textwrap
from weakref import WeakKeyDictionary

from speedfix.model.context import FileContext
from speedfix.model.index import CallSite
from speedfix.model.patterns import DATALOADER
from speedfix.model.project_classes import forwards_init, project_class
from speedfix.syntax.nodes import code_of

_FOUND: WeakKeyDictionary[FileContext, list[CallSite]] = WeakKeyDictionary()


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
            defined = project_class(ctx.project, qualified)
            if defined is not None and defined.forwards_init and set(defined.bases) & set(DATALOADER):
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
    return isinstance(node, ast.ClassDef) and forwards_init(node)
