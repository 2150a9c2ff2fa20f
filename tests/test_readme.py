"""The README stays true: its rule table is the catalog, and CI runs its test command."""

from __future__ import annotations

import re
from pathlib import Path

from speedfix.engine.registry import all_rules

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_rule_table_matches_the_catalog(run_cli):
    rows = re.findall(r"^\| (SF\d{3}) \| `([a-z0-9-]+)` \| (safe|unsafe|none) \| (.+) \|$", README, re.MULTILINE)
    assert [(code, name, fix) for code, name, fix, _ in rows] == [
        (rule.code, rule.name, rule.fix_availability()) for rule in all_rules()
    ]
    # ... and is exactly what `speedfix rules --output-format markdown` prints.
    assert run_cli("rules", "--output-format", "markdown").stdout in README


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = ci.strip().splitlines()[-1]
    assert f"```sh\n{command}\n```" in README
    # the tests pin the CPU torch through the constraints file, never through the bench extra
    assert "-c constraints.txt" in command
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines()
    assert "torch==" not in (ROOT / "pyproject.toml").read_text(encoding="utf-8")


def test_readme_shows_the_real_scan_output(run_cli):
    block = README.split("$ speedfix scan fixtures/sd.py\n", 1)[1].split("\n\nFound", 1)[0]
    result = run_cli("scan", "fixtures/sd.py", "--no-summary", "--torch-version", "2.4", cwd=ROOT)
    assert result.stdout.strip() == block.strip()
