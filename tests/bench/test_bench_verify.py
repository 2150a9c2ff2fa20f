"""`speedfix apply --verify`: a fix that must be kept and fixes that must be rejected."""

from __future__ import annotations

import json
import os

import pytest

from rich.console import Console

from speedfix.bench import numerics, stats
from speedfix.bench.verify import verify_script

ENOUGH = dict(max_pairs=stats.MIN_VERDICT_PAIRS, min_pairs=stats.MIN_VERDICT_PAIRS)  # for a decision on speed

SCRIPT = """\
import time
import torch

SLEEP = 0.01
LR = 0.05

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
x, y = torch.randn(64, 8), torch.randn(64, 1)
for step in range(100000):  # updated by hand: torch.optim imports Dynamo (seconds, every run)
    loss = torch.nn.functional.mse_loss(model(x), y)
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= LR * p.grad
    time.sleep(SLEEP)
"""

REWRITES = {
    # removes the per-step sleep: faster, loss bitwise identical -> kept
    "SF304": ("    time.sleep(SLEEP)\n", ""),
    # breaks the numerics: the loss overflows to inf/NaN -> rejected by the loss check
    "SF201": ("LR = 0.05", "LR = 1e30"),
}


def test_real_runs_with_too_few_pairs_reject_only_the_broken_fix_and_write_nothing(tmp_path, fake_fixer,
                                                                                   quick_settings):
    # Each fix alone (--per-fix), one pair (the budget ran out, in effect): the loss check still rejects the broken fix, but
    # neither the faster nor the slower one gets a decision on speed, and nothing is written.
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    fixer = fake_fixer(REWRITES)
    console = Console(record=True, width=200)
    code = verify_script(script, ["--some-arg"], unsafe=True, console=console, fixer=fixer,
                         compare_settings=quick_settings(discard=False, max_pairs=1, min_pairs=1), cwd=tmp_path,
                         per_fix=True)
    assert code == 1  # not everything was kept

    assert script.read_text() == SCRIPT and fixer.written == []

    report = json.loads((tmp_path / "train.speedfix-verify.json").read_text())
    fixes = {f["label"]: f for f in report["fixes"]}
    assert fixes["SF304"]["decision"] == "not measured enough" and not fixes["SF304"]["kept"]
    assert fixes["SF304"]["numerics"]["level"] == "identical"
    assert fixes["SF304"]["speedup"]["pairs"] == 1
    assert fixes["SF304"]["reason"].startswith(f"not measured enough: 1 pair of the {stats.MIN_VERDICT_PAIRS}")
    assert fixes["SF201"]["decision"] == "rejected"
    assert fixes["SF201"]["numerics"]["level"] == "new non-finite"
    assert "loss check failed" in fixes["SF201"]["reason"]
    assert report["kept"] == [] and not report["written"]
    assert report["args"] == ["--some-arg"]

    markdown = (tmp_path / "train.speedfix-verify.md").read_text()
    assert "| SF304 |" in markdown and "not measured enough" in markdown
    assert numerics.CAVEAT in markdown
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py", "train.speedfix-verify.json",
                                                          "train.speedfix-verify.md"]  # no variant files
    assert "not measured enough SF304 (static advice only, not written)" in console.export_text()


def test_per_fix_measured_fixes_are_kept_or_rejected_and_the_kept_one_written(tmp_path, fake_fixer, fake_runs, quick_settings):
    script = tmp_path / "train.py"
    script.write_text("A\nB\nC\n")
    fixer = fake_fixer({"SF304": ("A", "a"), "SF303": ("B", "b"), "SF201": ("C", "c")})
    runs = fake_runs({"original": 100.0, "SF304": 150.0, "SF303": 25.0, "SF201": 100.0},
                     losses={"SF201": [float("nan")] * 40})
    code = verify_script(script, [], console=Console(record=True), fixer=fixer,
                         compare_settings=quick_settings(**ENOUGH), run=runs, per_fix=True)
    report = json.loads((tmp_path / "train.speedfix-verify.json").read_text())
    fixes = {f["label"]: f for f in report["fixes"]}
    assert report["mode"] == "per-fix"
    assert fixes["SF304"]["decision"] == "kept" and fixes["SF304"]["kept"]
    assert fixes["SF304"]["speedup"]["pairs"] == stats.MIN_VERDICT_PAIRS
    assert fixes["SF303"]["decision"] == "rejected" and fixes["SF303"]["reason"].startswith("measurably slower")
    assert fixes["SF201"]["decision"] == "rejected" and "loss check failed" in fixes["SF201"]["reason"]
    assert report["kept"] == ["SF304"] and script.read_text() == "a\nB\nC\n"
    assert code == 1


def test_per_fix_combination_that_fails_drops_the_weakest_fix(tmp_path, fake_fixer, fake_runs, quick_settings):
    script = tmp_path / "train.py"
    script.write_text("A\nB\nC\n")
    fixer = fake_fixer({"SF102": ("A", "a"), "SF104": ("B", "b"), "SF402": ("C", "c")})
    runs = fake_runs({"original": 100.0, "SF102": 130.0, "SF104": 120.0, "SF402": 110.0,
                      "SF102+SF104+SF402": 50.0, "SF102+SF104": 150.0})
    code = verify_script(script, [], console=Console(record=True), fixer=fixer,
                         compare_settings=quick_settings(**ENOUGH), run=runs, per_fix=True)
    report = json.loads((tmp_path / "train.speedfix-verify.json").read_text())
    assert [c["label"] for c in report["combinations"]] == ["SF102+SF104+SF402", "SF102+SF104"]
    assert report["kept"] == ["SF102", "SF104"]
    weakest = next(f for f in report["fixes"] if f["label"] == "SF402")
    assert not weakest["kept"] and "combination with it failed (measurably slower" in weakest["reason"]
    assert script.read_text() == "a\nb\nC\n"
    assert code == 1


def test_per_fix_combination_that_keeps_failing_falls_back_to_the_best_single_fix(tmp_path, fake_fixer, fake_runs,
                                                                          quick_settings):
    script = tmp_path / "train.py"
    script.write_text("A\nB\n")
    fixer = fake_fixer({"SF102": ("A", "a"), "SF104": ("B", "b")})
    runs = fake_runs({"original": 100.0, "SF102": 110.0, "SF104": 140.0, "SF102+SF104": 60.0})
    verify_script(script, [], console=Console(record=True), fixer=fixer, compare_settings=quick_settings(**ENOUGH),
                  run=runs, per_fix=True)
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
                         compare_settings=quick_settings(**ENOUGH), run=runs, report_md=tmp_path / "r.md",
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
    code = verify_script(script, [], console=Console(record=True), fixer=fixer,
                         compare_settings=quick_settings(**ENOUGH), run=runs)
    report = json.loads((tmp_path / "train.speedfix-verify.json").read_text())
    assert code == 0
    assert report["kept"] == ["SF102", "SF104"] and len(report["combinations"]) == 1
    assert script.read_text() == "a\nb\n"


# ---------------------------------------------------------------- issue 13, item 7

def test_a_single_pair_decides_nothing(tmp_path, fake_fixer, fake_runs, quick_settings):
    script = tmp_path / "train.py"
    script.write_text("A\nB\n")
    fixer = fake_fixer({"SF102": ("A", "a"), "SF104": ("B", "b")})
    runs = fake_runs({"original": 100.0, "SF102": 150.0, "SF104": 50.0, "SF102+SF104": 150.0})
    console = Console(record=True, width=200)
    code = verify_script(script, [], console=console, fixer=fixer, compare_settings=quick_settings(max_pairs=1),
                         run=runs)
    assert code == 1
    report = json.loads((tmp_path / "train.speedfix-verify.json").read_text())
    for fix in report["fixes"]:  # 1.5x and 0.5x alike: one pair is not a measurement
        assert fix["decision"] == "not measured enough" and not fix["kept"] and not fix["measured"]
        assert fix["reason"].startswith(f"not measured enough: 1 pair of the {stats.MIN_VERDICT_PAIRS}")
    assert report["kept"] == [] and not report["written"] and script.read_text() == "A\nB\n"
    assert "--max-pairs 1 is below" in console.export_text()


def test_a_budget_that_runs_out_after_one_pair_decides_nothing(tmp_path, fake_fixer, fake_runs, quick_settings,
                                                               monkeypatch):
    from speedfix.bench import compare as compare_mod

    clock = [0.0]
    monkeypatch.setattr(compare_mod.time, "monotonic", lambda: clock[0])
    script = tmp_path / "train.py"
    script.write_text("A\n")
    runs = fake_runs({"original": 100.0, "SF102": 150.0}, clock=clock)  # every run takes 10 fake seconds
    code = verify_script(script, [], console=Console(record=True), fixer=fake_fixer({"SF102": ("A", "a")}),
                         compare_settings=quick_settings(max_pairs=10, min_pairs=5, budget_s=35.0), run=runs)
    report = json.loads((tmp_path / "train.speedfix-verify.json").read_text())
    assert report["comparison"]["stop_reason"] == "budget" and report["comparison"]["pairs"] == 1
    (fix,) = report["fixes"]
    assert fix["decision"] == "not measured enough" and "1 pair of the" in fix["reason"]
    assert script.read_text() == "A\n" and code == 1


def test_per_fix_a_combination_not_measured_enough_keeps_only_the_best_single_fix(tmp_path, fake_fixer, fake_runs,
                                                                          quick_settings, monkeypatch):
    from speedfix.bench import compare as compare_mod

    clock = [0.0]
    monkeypatch.setattr(compare_mod.time, "monotonic", lambda: clock[0])
    script = tmp_path / "train.py"
    script.write_text("A\nB\n")
    fixer = fake_fixer({"SF102": ("A", "a"), "SF104": ("B", "b")})
    fake = fake_runs({"original": 100.0, "SF102": 110.0, "SF104": 140.0, "SF102+SF104": 160.0}, clock=clock)

    def run(spec, config):  # the combination's runs are slow: its budget ends after one pair
        if "+" in spec.name:
            clock[0] += 500.0
        return fake(spec, config)

    code = verify_script(script, [], console=Console(record=True), fixer=fixer,
                         compare_settings=quick_settings(**ENOUGH, budget_s=200.0), run=run, per_fix=True)
    report = json.loads((tmp_path / "train.speedfix-verify.json").read_text())
    (combo,) = report["combinations"]
    assert combo["decision"] == "not measured enough"
    assert report["kept"] == ["SF104"] and script.read_text() == "A\nb\n"
    weaker = next(f for f in report["fixes"] if f["label"] == "SF102")
    assert weaker["decision"] == "not measured enough"
    assert "the combination SF102+SF104 was not measured" in weaker["reason"]
    assert code == 1


def test_variants_run_outside_the_users_tree_with_the_scripts_name_and_neighbours(tmp_path, fake_fixer, fake_runs,
                                                                                  quick_settings, monkeypatch):
    import tempfile

    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    (project / "data").mkdir()
    (project / "data" / "train.csv").write_text("1,2\n")
    script = project / "scripts" / "train.py"
    script.write_text("A\n")
    (project / "scripts" / "helpers.py").write_text("VALUE = 42\n")
    runner_tmp = tmp_path / "runner-tmp"
    runner_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(runner_tmp))
    before = sorted(p.relative_to(project) for p in project.rglob("*"))
    fake = fake_runs({"original": 100.0, "SF102": 150.0})
    seen = []

    def run(spec, config):
        path = spec.script
        seen.append(spec)
        assert project not in path.parents and path.name == "train.py"  # out of the tree, same name
        assert runner_tmp in path.parents
        assert (path.parent / "helpers.py").read_text() == "VALUE = 42\n"  # sibling imports resolve
        assert (path.parents[1] / "data" / "train.csv").read_text() == "1,2\n"  # so does Path(__file__).parents[1]
        assert sorted(p.relative_to(project) for p in project.rglob("*")) == before  # nothing in the user's tree
        return fake(spec, config)

    verify_script(script, [], console=Console(record=True), fixer=fake_fixer({"SF102": ("A", "a")}),
                  compare_settings=quick_settings(**ENOUGH), run=run, real_cwd=True, report_md=tmp_path / "r.md",
                  report_json=tmp_path / "r.json")
    assert {s.name for s in seen} == {"original", "SF102"}
    assert all(s.real_cwd for s in seen)  # --real-cwd reaches every run
    assert next(s for s in seen if s.name == "original").script.parent != script.parent  # the original too
    assert script.read_text() == "a\n"  # the kept fix, written to the real script
    assert sorted(p.relative_to(project) for p in project.rglob("*")) == before
    assert list(runner_tmp.iterdir()) == []  # the mirrors are gone


KILLED_VERIFY = """
import os, signal, sys
from pathlib import Path
from rich.console import Console
from speedfix.bench.verify import verify_script

class Fixer:
    def fixable_codes(self, code, **kw):
        return ["SF304"]
    def fix_code(self, code, *, path, select, **kw):
        return type("Outcome", (), {"code": code.replace("A", "a"), "applied": {"SF304": 1}})()
    def write_fixed(self, path, code):
        raise AssertionError("not reached")

def run(spec, config):  # the first run: the variants exist, and speedfix is killed
    os.kill(os.getpid(), signal.SIGKILL)

verify_script(Path(sys.argv[1]), [], fixer=Fixer(), run=run, console=Console(file=open(os.devnull, "w")))
"""


def test_a_killed_verify_leaves_nothing_in_the_tree_and_the_next_run_cleans_up(tmp_path, fake_fixer, fake_runs,
                                                                                quick_settings, monkeypatch):
    import subprocess
    import sys
    import tempfile

    project, runner_tmp = tmp_path / "project", tmp_path / "runner-tmp"
    project.mkdir()
    runner_tmp.mkdir()
    script = project / "train.py"
    script.write_text("A\n")
    killed = subprocess.run([sys.executable, "-c", KILLED_VERIFY, str(script)], capture_output=True, text=True,
                            env={**os.environ, "TMPDIR": str(runner_tmp)}, timeout=120)
    assert killed.returncode == -9, killed.stderr
    assert [p.name for p in project.iterdir()] == ["train.py"]  # nothing for a later scan or apply to pick up
    assert script.read_text() == "A\n"
    (stale,) = runner_tmp.glob("speedfix-verify-*")  # the killed process could not remove its mirrors

    monkeypatch.setattr(tempfile, "tempdir", str(runner_tmp))
    verify_script(script, [], console=Console(record=True), fixer=fake_fixer({"SF304": ("A", "a")}),
                  compare_settings=quick_settings(**ENOUGH), run=fake_runs({"original": 100.0, "SF304": 150.0}))
    assert not stale.exists()  # the next start removed them
    assert list(runner_tmp.iterdir()) == []


def test_hidden_variants_left_by_an_older_version_are_removed_at_the_next_run(tmp_path, fake_fixer, fake_runs,
                                                                             quick_settings):
    script = tmp_path / "train.py"
    script.write_text("A\n")
    legacy = [tmp_path / ".speedfix-verify-SF304-train.py", tmp_path / ".speedfix-verify-combined0-other.py"]
    for path in legacy:
        path.write_text("A\n")
    notes = tmp_path / ".speedfix-verify-notes.txt"  # not a variant's name: the user's
    notes.write_text("mine")
    console = Console(record=True, width=300)
    verify_script(script, [], console=console, fixer=fake_fixer({"SF304": ("A", "a")}),
                  compare_settings=quick_settings(**ENOUGH), run=fake_runs({"original": 100.0, "SF304": 150.0}))
    assert not any(path.exists() for path in legacy)
    assert notes.read_text() == "mine"
    assert "a variant left by an interrupted speedfix apply --verify" in console.export_text()


@pytest.mark.parametrize("per_fix", [False, True])
def test_on_a_cpu_a_gpu_only_fix_is_never_called_verified(tmp_path, fake_fixer, fake_runs, quick_settings, per_fix):
    # SF102 (pin_memory) targets CUDA: on a CPU it passes bit-identically even where it would
    # raise on the GPU. SF304 (gc.collect in the loop) means the same on any device.
    script = tmp_path / "train.py"
    script.write_text("A\nB\n")
    fixer = fake_fixer({"SF102": ("A", "a"), "SF304": ("B", "b")})
    runs = fake_runs({"original": 100.0, "SF102": 150.0, "SF304": 150.0, "SF102+SF304": 150.0}, device="cpu")
    console = Console(record=True, width=200)
    code = verify_script(script, [], console=console, fixer=fixer, compare_settings=quick_settings(**ENOUGH), run=runs,
                         per_fix=per_fix)
    report = json.loads((tmp_path / "train.speedfix-verify.json").read_text())
    fixes = {f["label"]: f for f in report["fixes"]}
    assert report["verified_on"] == "cpu"
    # the combination first: the GPU-only fix is not even run on a CPU
    assert ("SF102" in {name for name, _ in runs.calls}) is per_fix
    assert fixes["SF102"]["decision"] == "needs a GPU to verify" and not fixes["SF102"]["kept"]
    assert "run --verify on a machine with a CUDA GPU" in fixes["SF102"]["reason"]
    assert fixes["SF304"]["decision"] == "kept"
    assert report["kept"] == ["SF304"] and script.read_text() == "A\nb\n"  # the GPU-only fix is not written
    text = console.export_text()
    assert "verified on cpu, not on a CUDA GPU" in text
    assert "SF102 need a GPU to verify (not written)" in text
    assert code == 1



def test_an_edit_saved_while_verify_runs_is_never_overwritten(tmp_path, fake_fixer, fake_runs, quick_settings):
    script = tmp_path / "train.py"
    script.write_text("A\n")
    fake = fake_runs({"original": 100.0, "SF304": 150.0})

    def run(spec, config):
        if len(fake.calls) == 3:  # the user saves the script in the middle of the benchmark
            script.write_text("A  # my edit\n")
        return fake(spec, config)

    code = verify_script(script, [], console=Console(record=True), fixer=fake_fixer({"SF304": ("A", "a")}),
                         compare_settings=quick_settings(**ENOUGH), run=run)
    assert code == 2
    assert script.read_text() == "A  # my edit\n"


def test_kept_fixes_are_written_with_the_scripts_own_line_endings(tmp_path, fake_fixer, fake_runs, quick_settings):
    script = tmp_path / "train.py"
    script.write_bytes(b"A\r\nB\r\n")
    verify_script(script, [], console=Console(record=True), fixer=fake_fixer({"SF304": ("A", "a")}),
                  compare_settings=quick_settings(**ENOUGH), run=fake_runs({"original": 100.0, "SF304": 150.0}))
    assert script.read_bytes() == b"a\r\nB\r\n"
