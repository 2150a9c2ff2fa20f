"""The rule catalog: every rule class, looked up by code or by ``select``/``ignore`` prefixes.

Rules are found, not listed: every module of the ``speedfix.rules`` package (the top-level
``rules/`` folder) defines exactly one ``Rule`` subclass, so adding a rule is adding a file.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterable

from speedfix.engine.plugins import check_unique, one_per_module
from speedfix.engine.rule import Rule

RULES_PACKAGE = "speedfix.rules"


def discover_rules(package: str) -> tuple[type[Rule], ...]:
    """The rule each module of ``package`` defines, sorted by code; raises PluginError when a
    module defines no rule or several, or when two rules share a code or a name."""
    rules = one_per_module(package, Rule)
    check_unique(rules, "code")
    check_unique(rules, "name")
    return tuple(sorted(rules, key=lambda rule: rule.code))


@lru_cache(maxsize=1)
def all_rules() -> tuple[type[Rule], ...]:
    return discover_rules(RULES_PACKAGE)


def rule_by_code(code: str) -> type[Rule] | None:
    wanted = code.strip().upper()
    for rule in all_rules():
        if rule.code == wanted or rule.name == code.strip().lower():
            return rule
    return None


def matches(code: str, selector: str) -> bool:
    """Ruff-style selectors: ``SF101``, a prefix (``SF1``, ``SF``) or ``ALL``."""
    selector = selector.strip().upper()
    return selector == "ALL" or code.startswith(selector)


def known_selector(selector: str) -> bool:
    return any(matches(rule.code, selector) for rule in all_rules())


def _specificity(selector: str) -> int:
    return 0 if selector.strip().upper() == "ALL" else len(selector.strip())


def select_rules(
    select: Iterable[str] | None, ignore: Iterable[str] = (), extend_select: Iterable[str] = ()
) -> tuple[type[Rule], ...]:
    """The rules a selection enables. As in ruff, the most specific selector decides
    (`--select SF101` beats `ignore = ["SF1"]`); between equally specific ones, ignore wins."""
    chosen = list(select) if select is not None else ["ALL"]
    chosen += list(extend_select)
    ignored = list(ignore)

    def enabled(code: str) -> bool:
        best_select = max((_specificity(s) for s in chosen if matches(code, s)), default=-1)
        best_ignore = max((_specificity(s) for s in ignored if matches(code, s)), default=-1)
        return best_select >= 0 and best_select > best_ignore

    return tuple(rule for rule in all_rules() if enabled(rule.code))
