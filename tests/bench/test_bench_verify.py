"""`speedfix apply --verify`: a fix that must be kept and fixes that must be rejected."""

from __future__ import annotations

import json

from rich.console import Console

from speedfix.bench import numerics
from speedfix.bench.verify import verify_script

SCRIPT = """\
import time
import torch

SLEEP = 0.01
LR = 0.05

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=LR)
x, y = torch.randn(64, 8), torch.randn(64, 1)
for step in range(100000):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(SLEEP)
"""

REWRITES = {
    # removes the per-step sleep: faster, loss bitwise identical -> kept
    "SF304": ("    time.sleep(SLEEP)\n", ""),
    # breaks the numerics: the loss overflows to inf/NaN -> rejected by the loss check
    "SF201": ("LR = 0.05", "LR = 1e30"),
    # a deliberately slowing rewrite (4x the step time), numerics untouched -> rejected as slower
    "SF303": ("    opt.step()\n", "    opt.step()\n    time.sleep(0.03)\n"),
}


def test_verify_keeps_the_good_fix_and_rejects_the_slow_and_the_broken_ones(tmp_path, fake_fixer, quick_settings):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    fixer = fake_fixer(REWRITES)
    console = Console(record=True, width=200)
    code = verify_script(script, ["--some-arg"], unsafe=True, console=console, fixer=fixer,
                         compare_settings=quick_settings(), cwd=tmp_path)
    assert code == 1  # something was rejected

    written = script.read_text()
    assert "time.sleep(SLEEP)" not in written  # SF304 applied
    assert "LR = 0.05" in written and "time.sleep(0.03)" not in written  # the others not

    report = json.loads((tmp_path / "train.speedfix-verify.json").read_text())
    fixes = {f["label"]: f for f in report["fixes"]}
    assert fixes["SF304"]["kept"]
    assert fixes["SF304"]["numerics"]["level"] == "identical"
    assert fixes["SF304"]["speedup"]["pairs"] == 2
    assert not fixes["SF201"]["kept"]
    assert fixes["SF201"]["numerics"]["level"] == "new non-finite"
    assert "loss check failed" in fixes["SF201"]["reason"]
    assert not fixes["SF303"]["kept"]
    assert fixes["SF303"]["numerics"]["level"] == "identical"  # rejected for speed alone
    # two pairs are too few for a verdict, but a median far below 1 is enough to reject
    assert fixes["SF303"]["reason"].startswith("probably slower")
    assert report["kept"] == ["SF304"] and report["written"]
    assert report["args"] == ["--some-arg"]

    markdown = (tmp_path / "train.speedfix-verify.md").read_text()
    assert "| SF304 |" in markdown and "rejected" in markdown
    assert numerics.CAVEAT in markdown
    assert not list(tmp_path.glob(".speedfix-verify-*"))  # the variant files are gone
    assert "kept 1 of 3 fixes" in console.export_text()


def test_combination_that_fails_drops_the_weakest_fix(tmp_path, fake_fixer, fake_runs, quick_settings):
    script = tmp_path / "train.py"
    script.write_text("A\nB\nC\n")
    fixer = fake_fixer({"SF102": ("A", "a"), "SF104": ("B", "b"), "SF402": ("C", "c")})
    runs = fake_runs({"original": 100.0, "SF102": 130.0, "SF104": 120.0, "SF402": 110.0,
                      "SF102+SF104+SF402": 50.0, "SF102+SF104": 150.0})
    code = verify_script(script, [], console=Console(record=True), fixer=fixer,
                         compare_settings=quick_settings(max_pairs=5, min_pairs=5), run=runs)
    report = json.loads((tmp_path / "train.speedfix-verify.json").read_text())
    assert [c["label"] for c in report["combinations"]] == ["SF102+SF104+SF402", "SF102+SF104"]
    assert report["kept"] == ["SF102", "SF104"]
    weakest = next(f for f in report["fixes"] if f["label"] == "SF402")
    assert not weakest["kept"] and "combination with it failed (measurably slower" in weakest["reason"]
    assert script.read_text() == "a\nb\nC\n"
    assert code == 1


def test_combination_that_keeps_failing_falls_back_to_the_best_single_fix(tmp_path, fake_fixer, fake_runs,
                                                                          quick_settings):
    script = tmp_path / "train.py"
    script.write_text("A\nB\n")
    fixer = fake_fixer({"SF102": ("A", "a"), "SF104": ("B", "b")})
    runs = fake_runs({"original": 100.0, "SF102": 110.0, "SF104": 140.0, "SF102+SF104": 60.0})
    verify_script(script, [], console=Console(record=True), fixer=fixer, compare_settings=quick_settings(), run=runs)
    report = json.loads((tmp_path / "train.speedfix-verify.json").read_text())
    assert report["kept"] == ["SF104"]
    assert script.read_text() == "A\nb\n"


def test_nothing_to_verify_leaves_the_script_alone(tmp_path, fake_fixer):
    script = tmp_path / "train.py"
    script.write_text("print('no torch here')\n")
    console = Console(record=True, width=200)
    assert verify_script(script, [], console=console, fixer=fake_fixer({"SF101": ("DataLoader(", "x")})) == 0
    assert "no applicable fixes" in console.export_text()
    assert not (tmp_path / "train.speedfix-verify.json").exists()


def test_original_that_cannot_run_is_exit_2_with_a_report(tmp_path, fake_fixer, fake_runs, quick_settings):
    script = tmp_path / "train.py"
    script.write_text("A\n")
    runs = fake_runs({"original": 100.0}, fail={"original": "error"})
    code = verify_script(script, [], console=Console(record=True), fixer=fake_fixer({"SF102": ("A", "a")}),
                         compare_settings=quick_settings(), run=runs)
    assert code == 2
    report = json.loads((tmp_path / "train.speedfix-verify.json").read_text())
    assert "original script failed" in report["error"]
    assert script.read_text() == "A\n"


def test_no_write_mode_reports_but_leaves_the_script(tmp_path, fake_fixer, fake_runs, quick_settings):
    script = tmp_path / "train.py"
    script.write_text("A\n")
    runs = fake_runs({"original": 100.0, "SF102": 150.0})
    code = verify_script(script, [], write=False, console=Console(record=True), fixer=fake_fixer({"SF102": ("A", "a")}),
                         compare_settings=quick_settings(), run=runs, report_md=tmp_path / "r.md",
                         report_json=tmp_path / "r.json")
    assert code == 0
    assert script.read_text() == "A\n"
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["kept"] == ["SF102"] and not report["written"]
    assert (tmp_path / "r.md").exists()


def test_combination_that_holds_keeps_every_fix(tmp_path, fake_fixer, fake_runs, quick_settings):
    script = tmp_path / "train.py"
    script.write_text("A\nB\n")
    fixer = fake_fixer({"SF102": ("A", "a"), "SF104": ("B", "b")})
    runs = fake_runs({"original": 100.0, "SF102": 110.0, "SF104": 140.0, "SF102+SF104": 160.0})
    code = verify_script(script, [], console=Console(record=True), fixer=fixer, compare_settings=quick_settings(), run=runs)
    report = json.loads((tmp_path / "train.speedfix-verify.json").read_text())
    assert code == 0
    assert report["kept"] == ["SF102", "SF104"] and len(report["combinations"]) == 1
    assert script.read_text() == "a\nb\n"
