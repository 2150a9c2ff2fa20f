"""The rule catalog's codes and names, known without importing a rule.

Each module of ``speedfix.rules`` is named after its rule (``sf304_gc_collect_in_loop`` holds
SF304 ``gc-collect-in-loop``; ``tests/test_catalog.py`` holds every module to it), so the codes
and names come from the package's file listing. The configuration checks selectors, and the scan
keys its cache, with them: a scan whose files are all cached never imports a rule, nor libcst.
``registry`` gives the rule classes.
"""

from __future__ import annotations

import importlib.util
import pkgutil
from functools import lru_cache
from typing import Iterable

from speedfix.model.versions import TorchRange, TorchVersion

RULES_PACKAGE = "speedfix.rules"


def rules_folders() -> list[str]:
    """The folders of the rules package (``rules/`` of a checkout, ``speedfix/rules`` installed)."""
    spec = importlib.util.find_spec(RULES_PACKAGE)
    return list(spec.submodule_search_locations or ()) if spec is not None else []


@lru_cache(maxsize=1)
def catalog() -> dict[str, str]:
    """Code -> kebab name of every rule, by code."""
    found: dict[str, str] = {}
    for info in pkgutil.iter_modules(rules_folders()):
        if info.name.startswith("_"):
            continue
        code, _, name = info.name.partition("_")
        found[code.upper()] = name.replace("_", "-")
    return dict(sorted(found.items()))


def rule_codes() -> tuple[str, ...]:
    return tuple(catalog())


def rule_name(code: str) -> str | None:
    return catalog().get(code)


def matches(code: str, selector: str) -> bool:
    """Ruff-style selectors: ``SF101``, a prefix (``SF1``, ``SF``) or ``ALL``."""
    selector = selector.strip().upper()
    return selector == "ALL" or code.startswith(selector)


def known_selector(selector: str) -> bool:
    return any(matches(code, selector) for code in catalog())


def _specificity(selector: str) -> int:
    return 0 if selector.strip().upper() == "ALL" else len(selector.strip())


def selected_codes(
    select: Iterable[str] | None, ignore: Iterable[str] = (), extend_select: Iterable[str] = ()
) -> tuple[str, ...]:
    """The codes a selection enables. As in ruff, the most specific selector decides
    (`--select SF101` beats `ignore = ["SF1"]`); between equally specific ones, ignore wins."""
    chosen = list(select) if select is not None else ["ALL"]
    chosen += list(extend_select)
    ignored = list(ignore)

    def enabled(code: str) -> bool:
        best_select = max((_specificity(s) for s in chosen if matches(code, s)), default=-1)
        best_ignore = max((_specificity(s) for s in ignored if matches(code, s)), default=-1)
        return best_select >= 0 and best_select > best_ignore

    return tuple(code for code in catalog() if enabled(code))


# What the scan's summary table says of each rule besides its name: its fix ("safe", "unsafe",
# "none") and its expected effect. ``rules/_summaries.py`` holds them, written from the rule
# classes by ``python -m speedfix.engine.registry``; tests/test_catalog.py keeps it up to date.
# A scan whose files are all cached prints its summary without importing a rule.
SUMMARIES_MODULE = f"{RULES_PACKAGE}._summaries"


def rule_summary(code: str) -> tuple[str, str] | None:
    """(fix, expected effect) of the rule ``code``, or None for an unknown code."""
    return importlib.import_module(SUMMARIES_MODULE).SUMMARIES.get(code)


def rule_torch_range(code: str) -> TorchRange | None:
    """The torch versions the advice of rule ``code`` applies to (an unbounded range for most
    rules), or None for a code ``rules/_summaries.py`` does not know (a rule added since)."""
    module = importlib.import_module(SUMMARIES_MODULE)
    if code not in module.SUMMARIES:
        return None
    low, high, upgrade_for = module.TORCH.get(code, (None, None, None))
    return TorchRange(TorchVersion.parse(low) if low else None, TorchVersion.parse(high) if high else None, upgrade_for)
