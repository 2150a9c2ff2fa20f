"""The framework fixtures run under the harness on a CPU: the harness counts the optimizer steps
that Lightning's `Trainer` and transformers' `Trainer` take for the script (one process each:
importing a framework alone takes seconds)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
QUICK = ["--warmup", "3", "--steps", "10", "--warmup-s", "0", "--window-s", "0", "--timeout-s", "180"]


@pytest.mark.parametrize(
    ("script", "framework", "script_args"),
    [
        ("lightning_vae.py", "lightning", ["--tiny"]),
        ("hf_causal_lm.py", "transformers", ["--tiny", "--trainer"]),  # the Trainer API, not the custom loop
    ],
    ids=["lightning", "transformers-trainer"],
)
def test_framework_fixture_is_measured(cli_app, tmp_path, monkeypatch, script, framework, script_args):
    if importlib.util.find_spec(framework) is None:  # a test dependency (the `test` extra)
        pytest.skip(f"{framework} is not installed")
    monkeypatch.chdir(tmp_path)  # one intra-op thread, as every run of the tests (conftest.py)
    out = tmp_path / "result.json"
    result = CliRunner().invoke(
        cli_app, ["bench", str(FIXTURES / script), *QUICK, "--json", str(out)], obj={"script_args": script_args}
    )
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["status"] == "ok", data["message"]
    assert data["steps"]["warmup"] == 3 and data["timing"]["steps_timed"] == 10
    assert data["steps"]["observed_primary"] >= 13  # the framework's own optimizer steps
    assert data["loss"]["values"], "the losses of the framework's backward() calls are recorded"
