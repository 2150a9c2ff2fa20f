"""`speedfix bench` through typer: usage errors, one run, a comparison, the suite."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from speedfix.bench import verify

QUICK = ["--warmup", "3", "--steps", "10", "--timeout-s", "60"]


def invoke(app, args, script_args=()):
    return CliRunner().invoke(app, ["bench", *args], obj={"script_args": list(script_args)})


@pytest.mark.parametrize("args", [[], ["--suite", "x.py"], ["a.py", "b.py", "c.py"], ["missing.py"]])
def test_usage_errors_exit_2(cli_app, args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("x.py", "a.py", "b.py", "c.py"):
        (tmp_path / name).write_text("")
    result = invoke(cli_app, args)
    assert result.exit_code == 2
    assert "usage" in result.output or "no such script" in result.output


# A single run's JSON and the script's arguments: test_bench_harness.py::test_a_cli_run_with_real_cwd_... (one
# run shows them with what the script sees).


def test_single_run_of_a_crashing_script_exits_2_with_the_stderr_tail(cli_app, write_script, train_source):
    script = write_script("crash.py", train_source(in_loop="raise ValueError('bad batch')"))
    result = invoke(cli_app, [str(script), *QUICK])
    assert result.exit_code == 2
    assert "ValueError: bad batch" in result.output


def test_comparison_that_breaks_the_loss_exits_1(cli_app, write_script, train_source, tmp_path):
    a = write_script("a.py", train_source())
    b = write_script("b.py", train_source(lr=1e30))  # the loss overflows
    out = tmp_path / "ab.json"
    result = invoke(cli_app, [str(a), str(b), *QUICK, "--max-pairs", "2", "--min-pairs", "2", "--json", str(out)])
    assert result.exit_code == 1, result.output
    data = json.loads(out.read_text())
    cand = data["candidates"][0]
    assert cand["numerics"]["level"] == "new non-finite" and not cand["numerics"]["passed"]
    assert cand["speedup"]["pairs"] == 2
    assert cand["speedup"]["verdict"] == "inconclusive"  # 2 pairs are too few for a speed verdict
    assert data["pairs"] == 2
    order = [(r["round"], r["label"]) for r in data["runs"]]
    assert order == [(0, "a.py"), (0, "b.py"), (1, "b.py"), (1, "a.py")]  # ABBA
    assert "not proof of equal convergence" in result.output


SUITE_TOML = """
[[workload]]
name = "toy"
kind = "mlp"
script = "toy.py"
expert = "toy_expert.py"
tiny_args = ["--tiny"]
gpu_args = ["--big"]
"""


def test_suite_runs_original_fixed_and_expert(cli_app, write_script, train_source, tmp_path, fake_fixer,
                                              monkeypatch):
    fixtures = tmp_path / "fixtures"
    write_script("suite.toml", SUITE_TOML, fixtures)
    write_script("toy.py", train_source(in_loop="time.sleep(0.01)\ntime.sleep(0.01)  # SLOW"), fixtures)
    write_script("toy_expert.py", train_source(), fixtures)
    fixer = fake_fixer({"SF304": ("time.sleep(0.01)  # SLOW\n", "")})
    monkeypatch.setattr(verify, "load_fixer", lambda: fixer)
    out, md = tmp_path / "suite.json", tmp_path / "suite.md"
    result = invoke(cli_app, ["--suite", "--fixtures", str(fixtures), "--tiny", *QUICK, "--max-pairs", "1",
                              "--min-pairs", "1", "--json", str(out), "--markdown", str(md)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["size"] == "tiny"
    (row,) = data["workloads"]
    assert row["name"] == "toy" and row["args"] == ["--tiny"]
    assert row["fixes"] == ["SF304"]
    assert row["speedup"]["pairs"] == 1 and row["expert_speedup"]["pairs"] == 1
    assert row["captured"] is None  # 1 pair is too few to call the expert faster
    assert row["loss_check"] == "ok: identical"
    assert row["before"] and row["after"] and row["expert"]
    assert "| toy | SF304 |" in md.read_text()
    assert (fixtures / "toy.py").read_text().count("time.sleep") == 2  # the fixtures are not touched


@pytest.mark.parametrize("args, moved", [
    (["--tiny"], "-- --tiny"),  # a suite option: it would set the suite's sizes, not reach the script
    (["--full", "--workload", "sd"], "-- --full --workload sd"),
    (["--epochs", "3", "--lr=0.1"], "-- --epochs 3 --lr=0.1 --seed-data"),  # unknown options
])
def test_script_arguments_before_the_separator_are_refused_with_the_right_command(cli_app, tmp_path, monkeypatch,
                                                                               args, moved):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("raise SystemExit('the script must not run')\n")
    result = invoke(cli_app, ["train.py", *args], ["--seed-data"] if "--epochs" in args else [])
    assert result.exit_code == 2
    output = " ".join(result.output.split())
    assert f"speedfix bench train.py {moved}" in output
    assert "arguments for the script go after `--`" in output
