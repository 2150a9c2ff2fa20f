"""The bundled fixtures: their findings and their fixed code are compared exactly with the
expected files beside them (`NAME.findings.txt`, `NAME.fixed.py`).

After a deliberate change, regenerate them with `SPEEDFIX_UPDATE_FIXTURES=1 pytest
tests/test_fixtures.py` and review the diff like any other code change.
"""

from __future__ import annotations

import ast
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
SCRIPTS = sorted(p for p in FIXTURES.glob("*.py") if ".fixed" not in p.name)
ORIGINALS = [p for p in SCRIPTS if not p.stem.endswith("_expert")]
UPDATE = bool(os.environ.get("SPEEDFIX_UPDATE_FIXTURES"))
TORCH = "2.4"  # pinned so that the expectations do not depend on the installed torch
# Lightning and transformers scripts (their frameworks are test dependencies): no expert version.
FRAMEWORK_FIXTURES = {"lightning_vae", "hf_causal_lm"}


def check_or_update(expected: Path, actual: str) -> None:
    if UPDATE:
        expected.write_text(actual, encoding="utf-8")
        return
    assert expected.exists(), f"{expected.name} is missing: run with SPEEDFIX_UPDATE_FIXTURES=1"
    assert actual == expected.read_text(encoding="utf-8"), f"{expected.name} differs"


def test_the_fixtures_are_there():
    names = {p.stem for p in ORIGINALS}
    assert {"sd", "lstm_forecast", "cnn_classifier", "dataload_bound", "imagenet_resnet"} <= names
    assert FRAMEWORK_FIXTURES <= names
    for original in ORIGINALS:
        if original.stem not in FRAMEWORK_FIXTURES:  # scanned and benchmarked alone, not suite workloads
            assert (FIXTURES / f"{original.stem}_expert.py").exists()


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_findings_match_exactly(script, run_cli):
    result = run_cli("scan", script.name, "--no-summary", "--torch-version", TORCH, cwd=FIXTURES)
    assert result.exit_code in (0, 1), result.stderr
    check_or_update(FIXTURES / f"{script.stem}.findings.txt", result.stdout)


@pytest.mark.parametrize("script", ORIGINALS, ids=lambda p: p.stem)
def test_fixed_code_matches_exactly_and_is_stable(script, run_cli, tmp_path):
    copy = tmp_path / script.name
    shutil.copy(script, copy)
    result = run_cli("apply", copy, "--unsafe-fixes", "--torch-version", TORCH)
    assert result.exit_code == 1, result.stdout + result.stderr
    fixed = copy.read_text(encoding="utf-8")
    ast.parse(fixed)
    check_or_update(FIXTURES / f"{script.stem}.fixed.py", fixed)
    again = run_cli("apply", copy, "--unsafe-fixes", "--torch-version", TORCH)
    assert again.exit_code == 0 and copy.read_text(encoding="utf-8") == fixed
