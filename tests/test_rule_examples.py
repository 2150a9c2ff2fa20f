"""Every rule's VALID and INVALID examples are its tests (the Fixit model)."""

from __future__ import annotations

import pytest

from speedfix.engine.registry import all_rules
from speedfix.engine.rule import DOC_SECTIONS, Invalid, Rule, Valid
from speedfix.testing import check_example

# The examples are analysed as `example.py` in the current folder: an empty one, not the checkout.
pytestmark = pytest.mark.usefixtures("outside_the_checkout")

EXAMPLES = [
    pytest.param(rule, example, id=f"{rule.code}-{'valid' if isinstance(example, Valid) else 'invalid'}-{index}")
    for rule in all_rules()
    for index, example in enumerate([*rule.VALID, *rule.INVALID])
]


@pytest.mark.parametrize(("rule", "example"), EXAMPLES)
def test_example(rule, example) -> None:
    check_example(rule, example)


@pytest.mark.parametrize("rule", all_rules(), ids=lambda rule: rule.code)
def test_rule_has_examples_of_both_kinds(rule) -> None:
    assert rule.VALID, f"{rule.code} has no VALID examples"
    assert rule.INVALID, f"{rule.code} has no INVALID examples"
    if rule.fix_applicability is not None:
        assert any(isinstance(e, Invalid) and e.fixed is not None for e in rule.INVALID), (
            f"{rule.code} has a fix but no INVALID example shows its output"
        )


@pytest.mark.parametrize("rule", all_rules(), ids=lambda rule: rule.code)
def test_rule_docs_have_the_fixed_sections_in_order(rule) -> None:
    sections = list(rule.doc_sections())
    assert sections == list(DOC_SECTIONS), f"{rule.code} doc sections: {sections}"
    for title, text in rule.doc_sections().items():
        assert text.strip(), f"{rule.code}: section '{title}' is empty"
    assert "http" in rule.doc_sections()["Measured effect"], f"{rule.code}: the measured effect needs a source"


@pytest.mark.parametrize("rule", all_rules(), ids=lambda rule: rule.code)
def test_rule_docs_say_its_impact_and_what_moves_it(rule) -> None:
    """The Impact section starts with the rule's usual impact; a rule whose findings never move
    says so, and one that moves them (its own decision, or a benchmark's measurement) says how."""
    text = " ".join(rule.doc_sections()["Impact"].split())
    assert text.startswith(rule.impact.value.capitalize()), f"{rule.code}: Impact starts with {text.split()[0]!r}"
    moves = rule.impact_here is not Rule.impact_here
    if rule.measure is not None:
        assert "`speedfix bench`" in text, f"{rule.code}: a benchmark decides its impact, the docs must say how"
    assert ("Nothing moves it." in text) == (not moves and rule.measure is None), (
        f"{rule.code}: the Impact section and impact_here/measure disagree"
    )


@pytest.mark.parametrize("rule", all_rules(), ids=lambda rule: rule.code)
def test_rule_metadata(rule) -> None:
    assert rule.code.startswith("SF") and len(rule.code) == 5
    assert rule.name == rule.name.lower() and " " not in rule.name
    assert rule.summary and rule.effect
    assert (rule.fix_title is None) == (rule.fix_applicability is None)


def test_codes_and_names_are_unique() -> None:
    codes = [rule.code for rule in all_rules()]
    names = [rule.name for rule in all_rules()]
    assert len(codes) == len(set(codes)) and len(names) == len(set(names))
