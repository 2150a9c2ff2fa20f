"""The README stays true: its rule table is the catalog, and CI runs its test command."""

from __future__ import annotations

import importlib.util
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


def _samples_module():
    spec = importlib.util.spec_from_file_location("readme_samples", ROOT / "docs" / "readme_samples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_samples_are_the_tools_output(monkeypatch):
    """Each `$ speedfix ...` console sample is what the command prints today (regenerate them
    with `python docs/readme_samples.py`); only the benchmark's dated measurements are kept."""
    samples = _samples_module()
    monkeypatch.setenv("SPEEDFIX_NO_CACHE", "1")
    found = samples.samples(README)
    commands = [command for command, _ in found]
    assert "speedfix scan fixtures/sd.py --torch-version 2.4" in commands
    assert "speedfix apply --diff fixtures/sd.py --torch-version 2.4" in commands
    for command, shown in found:
        assert samples.run(command) == shown, f"README sample `{command}` differs: run python docs/readme_samples.py"
    every = re.findall(r"^```console\n\$ (.*)$", README, re.MULTILINE)
    assert all(c in commands or samples.measured(c) for c in every)
    assert len(every) - len(commands) == 3  # the bench runs (a sample of its runtime facts, a timed run) and apply --verify
