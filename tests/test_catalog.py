"""One place to add a rule or a format: rules are found in rules/, formats in speedfix/output/;
a module that is not picked up, a shared code or name, or a fix without a loss check fails here."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pytest

from speedfix.bench import numerics
from speedfix.engine.catalog import catalog, rule_summary
from speedfix.engine.findings import LossCheck
from speedfix.engine.plugins import PluginError, check_unique, one_per_module
from speedfix.engine.registry import all_rules, discover_rules, summaries_source
from speedfix.output import Reporter, format_names, get_reporter, reporters

ROOT = Path(__file__).resolve().parent.parent


def test_every_rule_module_defines_the_rule_its_file_name_says():
    modules = sorted(p.stem for p in (ROOT / "rules").glob("*.py") if not p.name.startswith("_"))
    assert modules == [f"{rule.code.lower()}_{rule.name.replace('-', '_')}" for rule in all_rules()]
    assert [rule.__module__.rsplit(".", 1)[1] for rule in all_rules()] == modules
    # ... so the codes and names known without importing a rule are the catalog's
    assert catalog() == {rule.code: rule.name for rule in all_rules()}


def test_the_summaries_known_without_importing_a_rule_are_the_rules_own():
    """rules/_summaries.py (each rule's fix and effect, for the scan's summary table) is written
    from the rule classes; a rule whose fix or effect changed needs it written again."""
    written = (ROOT / "rules" / "_summaries.py").read_text(encoding="utf-8")
    assert written == summaries_source(), "rules/_summaries.py is out of date: run python -m speedfix.engine.registry"
    assert all(rule_summary(rule.code) == (rule.fix_availability(), rule.effect) for rule in all_rules())
    assert rule_summary("SF999") is None


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A throw-away package of rule modules: package(name, {module: source}) -> its name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(name: str, modules: dict[str, str]) -> str:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "__init__.py").write_text("")
        for module, source in modules.items():
            (folder / f"{module}.py").write_text(textwrap.dedent(source))
        importlib.invalidate_caches()  # the folder is newer than the import system's listing
        return name

    yield make
    for module in [m for m in sys.modules if m.startswith("fake_")]:
        del sys.modules[module]


RULE = """\
    from speedfix.engine.rule import Rule

    class {cls}(Rule):
        code = "{code}"
        name = "{name}"
        summary = "s"
    """


def test_discovery_finds_every_rule_module(package):
    name = package("fake_rules_ok", {
        "sf902_b": RULE.format(cls="B", code="SF902", name="b"),
        "sf901_a": RULE.format(cls="A", code="SF901", name="a"),
        "_helpers": "X = 1\n",  # helpers start with an underscore
    })
    assert [rule.code for rule in discover_rules(name)] == ["SF901", "SF902"]


def test_a_rule_module_without_a_rule_fails(package):
    name = package("fake_rules_empty", {"sf901_a": RULE.format(cls="A", code="SF901", name="a"), "sf902_typo": "class B:\n    pass\n"})
    with pytest.raises(PluginError, match="fake_rules_empty.sf902_typo defines 0 Rule subclasses"):
        discover_rules(name)


@pytest.mark.parametrize("attribute", ["code", "name"])
def test_two_rules_sharing_a_code_or_a_name_fail(package, attribute):
    second = {"code": ("SF901", "b"), "name": ("SF902", "a")}[attribute]
    name = package(f"fake_rules_same_{attribute}", {
        "sf901_a": RULE.format(cls="A", code="SF901", name="a"),
        "sf902_b": RULE.format(cls="B", code=second[0], name=second[1]),
    })
    with pytest.raises(PluginError, match=f"share the {attribute}"):
        discover_rules(name)


@pytest.mark.parametrize("rule", all_rules(), ids=lambda rule: rule.code)
def test_a_rule_with_a_fix_declares_its_loss_check(rule):
    if rule.fix_applicability is None:
        assert rule.loss_check is None, f"{rule.code} has no fix, so nothing for a loss check to judge"
    else:
        assert isinstance(rule.loss_check, LossCheck), f"{rule.code} has a fix but no loss_check class attribute"


def test_the_benchmark_reads_the_rules_loss_check(monkeypatch):
    rule = next(rule for rule in all_rules() if rule.loss_check is LossCheck.EXACT)
    assert numerics.class_of([rule.code]) == numerics.EXACT
    monkeypatch.setattr(rule, "loss_check", LossCheck.RNG)
    assert numerics.class_of([rule.code]) == numerics.RNG
    monkeypatch.setattr(rule, "loss_check", None)
    with pytest.raises(ValueError, match="declares no loss check"):
        numerics.class_of([rule.code])
    with pytest.raises(ValueError, match="unknown rule code"):
        numerics.class_of(["SF999"])  # never silently the loosest check


def test_every_output_module_is_a_registered_format():
    modules = sorted(p.stem for p in (ROOT / "speedfix" / "output").glob("*.py") if not p.name.startswith("_"))
    assert sorted(cls.__module__.rsplit(".", 1)[1] for cls in reporters().values()) == modules
    assert format_names() == ("text", "github", "json", "markdown", "sarif")  # the default first
    assert all(cls.supports("scan") for cls in reporters().values())


def test_a_format_is_refused_for_a_report_it_does_not_write():
    assert format_names("apply_summary") == ("text",)
    assert get_reporter("sarif").name == "sarif"
    with pytest.raises(ValueError, match="must be one of text, json, markdown, not 'sarif'"):
        get_reporter("sarif", "rule_page")


def test_format_names_are_unique():
    class Text(Reporter):
        name = "text"

    with pytest.raises(PluginError, match="share the name 'text'"):
        check_unique([*reporters().values(), Text], "name")


def test_a_new_format_module_is_found(package):
    name = package("fake_formats", {"csv_format": """\
        from speedfix.output import Reporter

        class CsvReporter(Reporter):
            name = "csv"

            def scan(self, result, options):
                return "".join(f"{f.path},{f.line},{f.code}\\n" for f in result.findings)
        """})
    (found,) = one_per_module(name, Reporter)
    assert found.name == "csv" and found.supports("scan") and not found.supports("rule_page")

