"""Find the classes a package's modules define: one per module, so adding one is adding a file.

The rule catalog (``speedfix.rules``) and the output formats (``speedfix.output``) are found this
way; neither keeps a list that a new module could be missing from.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import TypeVar

T = TypeVar("T")


class PluginError(Exception):
    """A module that does not define exactly one class of the kind its package holds."""


def one_per_module(package: str, base: type[T]) -> list[type[T]]:
    """The ``base`` subclass each public module of ``package`` defines, in module-name order.

    Modules whose names start with an underscore are helpers and are skipped; any other module
    must define exactly one subclass of ``base`` (imported classes do not count)."""
    found: list[type[T]] = []
    for info in sorted(pkgutil.iter_modules(importlib.import_module(package).__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        defined = [
            obj for obj in vars(module).values()
            if inspect.isclass(obj) and issubclass(obj, base) and obj is not base and obj.__module__ == module.__name__
        ]
        if len(defined) != 1:
            raise PluginError(
                f"{module.__name__} defines {len(defined)} {base.__name__} subclasses; each module of {package} "
                f"defines exactly one (helper modules start with an underscore)"
            )
        found.extend(defined)
    return found


def check_unique(classes: list[type[T]], attribute: str) -> None:
    """Raise PluginError when two classes share a value of ``attribute`` (a rule code, a format name)."""
    seen: dict[object, type[T]] = {}
    for cls in classes:
        value = getattr(cls, attribute)
        if value in seen:
            raise PluginError(
                f"{seen[value].__module__}.{seen[value].__name__} and {cls.__module__}.{cls.__name__} "
                f"share the {attribute} {value!r}"
            )
        seen[value] = cls
