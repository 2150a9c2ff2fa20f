"""The rule catalog: every rule class, looked up by code or by ``select``/``ignore`` prefixes."""

from __future__ import annotations

from functools import lru_cache
from typing import Iterable

from speedfix.rule import Rule


@lru_cache(maxsize=1)
def all_rules() -> tuple[type[Rule], ...]:
    from speedfix.rules import RULES  # the top-level rules/ folder, installed as speedfix.rules

    return tuple(sorted(RULES, key=lambda rule: rule.code))


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


def select_rules(
    select: Iterable[str] | None, ignore: Iterable[str] = (), extend_select: Iterable[str] = ()
) -> tuple[type[Rule], ...]:
    chosen_selectors = list(select) if select is not None else ["ALL"]
    chosen_selectors += list(extend_select)
    ignored = list(ignore)
    return tuple(
        rule
        for rule in all_rules()
        if any(matches(rule.code, s) for s in chosen_selectors) and not any(matches(rule.code, s) for s in ignored)
    )
