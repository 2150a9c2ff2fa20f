"""The rule catalog: every rule class, looked up by code or by ``select``/``ignore`` prefixes.

Rules are found, not listed: every module of the ``speedfix.rules`` package (the top-level
``rules/`` folder) defines exactly one ``Rule`` subclass, so adding a rule is adding a file.
Importing this module imports no rule; the first lookup does.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Iterable

from speedfix.engine.catalog import RULES_PACKAGE, selected_codes
from speedfix.engine.plugins import check_unique, one_per_module
from speedfix.model.versions import TorchRange

if TYPE_CHECKING:
    from speedfix.engine.rule import Rule


def discover_rules(package: str) -> tuple[type[Rule], ...]:
    """The rule each module of ``package`` defines, sorted by code; raises PluginError when a
    module defines no rule or several, or when two rules share a code or a name."""
    from speedfix.engine.rule import Rule  # the rule base imports the model and libcst: only on use

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


def select_rules(
    select: Iterable[str] | None, ignore: Iterable[str] = (), extend_select: Iterable[str] = ()
) -> tuple[type[Rule], ...]:
    """The rules a selection enables (``catalog.selected_codes``)."""
    codes = set(selected_codes(select, ignore, extend_select))
    return tuple(rule for rule in all_rules() if rule.code in codes)


def summaries_source() -> str:
    """The text of ``rules/_summaries.py`` (``catalog.rule_summary``, ``catalog.rule_torch_range``),
    from the rule classes."""

    def version(value: object) -> str:
        return repr(str(value)) if value is not None else "None"

    lines = [
        '"""Each rule\'s fix and expected effect, for the scan\'s summary table, and the torch versions',
        "its advice needs (where it has bounds), for the notes on a project's torch pin, without",
        "importing the rules. Written by `python -m speedfix.engine.registry`: do not edit by hand.",
        '"""',
        "",
        "SUMMARIES = {",
        *(f"    {rule.code!r}: ({rule.fix_availability()!r}, {rule.effect!r})," for rule in all_rules()),
        "}",
        "",
        "# code: (min_torch, max_torch, upgrade_for)",
        "TORCH = {",
        *(f"    {rule.code!r}: ({version(rule.min_torch)}, {version(rule.max_torch)}, {rule.upgrade_for!r}),"
          for rule in all_rules() if rule.torch_range() != TorchRange()),
        "}",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":  # rewrite rules/_summaries.py
    from pathlib import Path

    from speedfix.engine.catalog import rules_folders

    target = Path(rules_folders()[0]) / "_summaries.py"
    target.write_text(summaries_source(), encoding="utf-8")
    print(f"wrote {target}")
