"""`speedfix bench` through typer: usage errors, one run, a comparison (the suite: test_bench_results.py)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner


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
# run shows them with what the script sees); a crashing script's exit code 2 and its stderr tail:
# test_bench_harness.py::test_crash_gives_error_with_traceback_and_the_losses_so_far_and_the_command_exits_2.


def test_comparison_that_breaks_the_loss_exits_1(cli_app, write_script, train_source, tmp_path):
    a = write_script("a.py", train_source())
    b = write_script("b.py", train_source(lr=1e30))  # the loss overflows
    out = tmp_path / "ab.json"
    # One pair (each real run costs seconds of `import torch`); the ABBA order of further pairs is
    # test_bench_compare.py's, with a fake runner.
    result = invoke(cli_app, [str(a), str(b), *QUICK, "--max-pairs", "1", "--min-pairs", "1", "--json", str(out)])
    assert result.exit_code == 1, result.output
    data = json.loads(out.read_text())
    cand = data["candidates"][0]
    assert cand["numerics"]["level"] == "new non-finite" and not cand["numerics"]["passed"]
    assert cand["speedup"]["pairs"] == 1
    assert cand["speedup"]["verdict"] == "inconclusive"  # 1 pair is too few for a speed verdict
    assert data["pairs"] == 1
    order = [(r["round"], r["label"]) for r in data["runs"]]
    assert order == [(0, "a.py"), (0, "b.py")]
    assert "not proof of equal convergence" in result.output


# The suite on real runs (the original, speedfix's fixes, the expert's version, on a copy of its
# fixtures) is test_bench_results.py's; its bundled fixtures from the installed wheel, test_packaging.py's.


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
