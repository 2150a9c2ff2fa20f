"""Helpers that turn a rule's VALID/INVALID examples into tests (used by tests/ and by rule
authors: ``check_example(MyRule, MyRule.INVALID[0])``)."""

from __future__ import annotations

from pathlib import Path

from speedfix.engine.analysis import analyze
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.fixer import fix_source
from speedfix.model.versions import DEFAULT_TARGET, TorchVersion
from speedfix.syntax.source import SourceFile, decode_source


def _source(code: str) -> SourceFile:
    data = code.encode("utf-8")
    return SourceFile(Path("example.py"), data, *decode_source(data))


def check_example(rule: type[Rule], example: Valid | Invalid) -> None:
    """Raise AssertionError with a readable message when the rule disagrees with its example."""
    target = TorchVersion.parse(example.torch or DEFAULT_TARGET)
    analysis = analyze(_source(example.code), "example.py", [rule], target)
    assert analysis.error is None, f"example does not parse: {analysis.error}"
    found = [f for f in analysis.findings if f.code == rule.code]
    listing = "\n".join(f"  {f.line}:{f.column} {f.message} (fix: {bool(f.fix)})" for f in found)
    if isinstance(example, Valid):
        assert not found, f"{rule.code} reported a VALID example:\n{listing}\n---\n{example.code}"
        return
    assert len(found) == example.count, (
        f"{rule.code}: expected {example.count} finding(s), got {len(found)}:\n{listing}\n---\n{example.code}"
    )
    outcome = fix_source(_source(example.code), "example.py", [rule], target, unsafe=True)
    if example.fixed is None:
        fixable = [f for f in found if f.fix]
        assert not fixable, f"{rule.code} has a fix but the INVALID example gives no expected output:\n{listing}"
        assert outcome.code == example.code, f"{rule.code} changed code it reports as unfixable:\n{outcome.code}"
        return
    assert rule.fix_applicability is not None, f"{rule.code} declares no fix but an example has fixed code"
    assert outcome.code == example.fixed, (
        f"{rule.code}: fixed code differs.\n--- expected\n{example.fixed}\n--- got\n{outcome.code}"
    )
    again = fix_source(_source(outcome.code), "example.py", [rule], target, unsafe=True)
    assert again.code == outcome.code, f"{rule.code}: a second fix changed the code again:\n{again.code}"
