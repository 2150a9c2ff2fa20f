"""The typed results: each reads its JSON and writes back the same keys and values (a public format)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from speedfix.bench import report
from speedfix.bench.results import (Comparison, Decision, FixDecision, LossCheck, RunnerInfo, RunResult, RunSummary,
                                    SuiteResult, SuiteRow, VerifyReport)
from speedfix.bench.stats import MIN_VERDICT_PAIRS

DOCS_RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"

# what child.py writes for a script that never steps, and what the runner adds
NO_STEPS = {
    "schema": "speedfix.bench/0.1", "status": "no_steps", "message": "the script ended without stepping",
    "script": "/p/train.py", "args": ["--x"], "cwd": "/p", "seed": 0, "seed_offset": 0,
    "env": {"python": "3.11.7", "torch": "2.13.0+cpu", "cuda_available": False, "torch_num_threads": 2,
            "cpu_count": 2},
    "device": {"type": None, "param_dtype": None, "name": None, "driver_version": None, "cuda_version": None},
    "clock": None,
    "compile": {"watched": False, "compilations": 0, "seconds": 0.0, "in_window": 0, "settled": None,
                "window_restarts": []},
    "steps": {"warmup": None, "warmup_requested": 3, "warmup_s_requested": 0.0, "requested": 10,
              "window_s_requested": 0.0, "observed_primary": 0, "optimizers": 0, "per_optimizer": []},
    "wall": {"startup_to_first_step_s": None, "total_s": 5.7},
    "timing": {"window_complete": False, "steps_timed": 0, "window_s": None, "steps_per_s": None, "step_time_s": {},
               "per_step_s": [], "all_step_s": None, "cpu_s": None, "warmup_s": None, "synchronized": False,
               "harness_self_s": 0.0, "harness_share": None},
    "data": {"batch_size": None, "batch_size_source": None, "first_batch": [], "batches_in_window": 0,
             "samples_in_window": 0, "samples_per_s": None, "samples_per_step": None, "data_wait_s": 0.0,
             "data_wait_fraction": None, "batches_fetched_total": 0, "batches_fetched_no_grad": 0},
    "memory": {"vmhwm_window_kb": 0, "ru_maxrss_kb": 227920, "children_rss_kb": 0, "children": 0,
               "cuda_max_allocated_window": 0, "cuda_max_reserved_window": 0},
    "epochs": {"detected_by": None, "ended": 0, "between": [], "between_in_window_s": 0.0},
    "guard": {"active": True, "refusals": 0, "refused": []},
    "loss": {"source": "autograd.backward", "values": [], "step_index": [], "backward_calls": 0,
             "nonscalar_backward_calls": 0, "nonfinite": 0, "grad_scaler_seen": False, "grad_scaler_step_calls": 0,
             "grad_scaler_skipped_steps": 0},
    "exception": {"type": "ValueError", "message": "bad", "traceback": "Traceback ..."},
    "runner": {"returncode": 0, "wall_s": 6.1, "killed": None, "loadavg": [0.5, 0.6], "leftover_processes_at_exit": [],
               "run_id": "abc", "supervised": True, "scratch_cwd": "/tmp/x/p", "real_files_modified": [],
               "stdout_tail": "", "stderr_tail": "Traceback ..."},
}


def same_json(a: dict, b: dict) -> bool:
    """Same keys in the same order, same values (as a JSON report writes them: inf as null)."""
    return json.dumps(report._finite(a)) == json.dumps(report._finite(b))


def test_a_child_result_reads_and_writes_back_unchanged():
    result = RunResult.from_json(NO_STEPS)
    assert same_json(result.to_json(), NO_STEPS)
    assert result.reported and result.device.type is None and result.timing.step_time_s is None
    assert result.exception.type == "ValueError" and result.observed_steps == 0
    # the device's index is written once a step has told the device
    cpu = {"type": "cpu", "param_dtype": "float32", "index": None, "name": None, "driver_version": None,
           "cuda_version": None}
    stepped = RunResult.from_json({**NO_STEPS, "device": cpu})
    assert stepped.to_json()["device"] == cpu  # on a CPU the GPU's name and versions are null


def test_a_gpu_run_names_the_gpu_the_driver_and_cuda():
    from speedfix.bench.child import Harness

    class FakeTorch:
        class cuda:
            @staticmethod
            def get_device_name(device):
                return "NVIDIA H100 80GB HBM3"

        class version:
            cuda = "13.0"

    class FakeDevice:
        type = "cuda"

    harness = Harness.__new__(Harness)
    harness.torch = FakeTorch
    info = harness._gpu_info(FakeDevice)
    assert info["name"] == "NVIDIA H100 80GB HBM3" and info["cuda_version"] == "13.0"
    assert set(info) == {"name", "driver_version", "cuda_version"}  # the driver's: from /proc or NVML, None here
    device = RunResult.from_json({**NO_STEPS, "device": {"type": "cuda", "param_dtype": "bfloat16", "index": 0,
                                                         **info, "driver_version": "580.159.04"}}).device
    assert device.describe() == "cuda:0 NVIDIA H100 80GB HBM3 (driver 580.159.04, CUDA 13.0)"


def test_a_result_the_runner_made_up_writes_only_the_runners_keys():
    failed = RunResult.failed("error", "the child exited with code -9 without a result", "/p/train.py", ["--x"])
    assert not failed.reported
    never_started = RunResult.from_json({**failed.to_json(), "runner": RunnerInfo(run_id="abc").to_json()})
    assert list(never_started.to_json()) == ["schema", "status", "message", "script", "args", "runner"]
    assert list(never_started.to_json()["runner"]) == ["returncode", "killed", "leftover_processes_at_exit", "run_id",
                                                       "stdout_tail", "stderr_tail"]
    ran = {key: NO_STEPS[key] for key in ("schema", "status", "message", "script", "args", "cwd", "runner")}
    assert same_json(RunResult.from_json(ran).to_json(), ran)


# keys added after docs/results were saved: an older report reads back with their empty values
ADDED_LATER = {"real_files_modified": [], "name": None, "driver_version": None, "cuda_version": None}


def drop_added_keys(before, after):
    """``after`` without the keys that ``before`` (an older report) predates, where they are empty."""
    if isinstance(before, dict) and isinstance(after, dict):
        for key in [k for k in after if k not in before and k in ADDED_LATER and after[k] == ADDED_LATER[k]]:
            del after[key]
        for key in after:
            if key in before:
                drop_added_keys(before[key], after[key])
    elif isinstance(before, list) and isinstance(after, list):
        for b, a in zip(before, after):
            drop_added_keys(b, a)


def test_the_saved_example_reports_read_back():
    # docs/results predate some keys (ADDED_LATER); everything else reads back as written
    for path in sorted(DOCS_RESULTS.glob("*.json")):
        saved = json.loads(path.read_text())
        if saved.get("schema") == "speedfix.bench.compare/0.1":
            again = Comparison.from_json(saved).to_json()
        elif saved.get("schema") == "speedfix.suite/0.1":
            again = SuiteResult.from_json(saved).to_json()
        else:
            continue
        drop_added_keys(saved, again)
        assert same_json(again, saved), path.name


def test_the_special_forms_keep_their_keys():
    unchecked = LossCheck("exact", level="unchecked", passed=True, reason="no loss")
    assert unchecked.to_json() == {"kind": "exact", "level": "unchecked", "passed": True, "reason": "no loss"}
    skipped = FixDecision.skipped("SF304", "the fix changed nothing in this script")
    assert skipped.to_json() == {"label": "SF304", "kept": False, "decision": "skipped", "skipped": True,
                                 "reason": "the fix changed nothing in this script"}
    assert FixDecision.from_json(skipped.to_json()) == skipped
    error_row = SuiteRow(name="cnn", kind="cnn", script="cnn.py", fixes=["SF101"], applied={"SF101": 1},
                         error="the original script failed", failure="Traceback ...")
    assert list(error_row.to_json()) == ["name", "kind", "description", "script", "expert_script", "args", "fixes",
                                         "applied", "error", "failure"]


def test_older_reports_without_pair_counts_or_decisions_read():
    fix = FixDecision.from_json({"label": "SF101", "kept": True, "reason": "faster",
                                 "speedup": {"median": 1.2, "ci95_median": [1.1, None], "per_pair": [1.2, 1.1, 1.3]}})
    assert fix.decision is Decision.KEPT
    assert fix.speedup.pairs == 3 and fix.speedup.hi == float("inf")


def test_a_verify_report_reads_back(tmp_path, fake_fixer, fake_runs, quick_settings):
    from speedfix.bench.verify import verify_script

    script = tmp_path / "train.py"
    script.write_text("A\nB\nC\n")
    fixer = fake_fixer({"SF102": ("A", "a"), "SF104": ("B", "b"), "SF402": ("C\n", "C\n")})  # SF402: no change
    runs = fake_runs({"original": 100.0, "SF102": 130.0, "SF104": 50.0, "SF102+SF104": 50.0})
    settings = quick_settings(max_pairs=MIN_VERDICT_PAIRS, min_pairs=MIN_VERDICT_PAIRS)
    verify_script(script, [], console=Console(record=True), fixer=fixer, compare_settings=settings, run=runs)
    saved = json.loads((tmp_path / "train.speedfix-verify.json").read_text())
    assert [f["decision"] for f in saved["fixes"]] == ["skipped", "kept", "rejected"]
    assert "candidates" not in saved["comparison"]
    assert same_json(VerifyReport.from_json(saved).to_json(), saved)


def test_a_suite_result_reads_back_and_its_rows_tell_a_failed_loss_check(tmp_path, fake_fixer, fake_runs,
                                                                         monkeypatch):
    from speedfix.bench import suite
    from speedfix.bench.settings import CompareSettings
    from speedfix.bench.suite import run_suite

    def no_torch_import() -> bool:
        raise AssertionError("the sizes were given: only the runs import torch")

    monkeypatch.setattr(suite, "cuda_available", no_torch_import)

    fixtures = tmp_path / "fixtures"
    fixtures.mkdir()
    (fixtures / "suite.toml").write_text('[[workload]]\nname = "toy"\nscript = "toy.py"\nexpert = "toy_expert.py"\n')
    (fixtures / "toy.py").write_text("SLOW\n")
    (fixtures / "toy_expert.py").write_text("\n")
    runs = fake_runs({"original": 100.0, "speedfix": 120.0, "expert": 200.0}, losses={"speedfix": [None] * 40})
    result = run_suite(fixtures=fixtures, tiny=True, console=Console(record=True), run=runs,
                       settings=CompareSettings(warmup=3, steps=10, max_pairs=2, min_pairs=2),
                       fixer=fake_fixer({"SF304": ("SLOW\n", "")}))
    (row,) = result.workloads
    assert row.loss_check == "FAIL: new non-finite" and row.loss_check_failed
    assert result.cuda_available and result.device == "cuda"  # as the runs found it
    assert same_json(SuiteResult.from_json(result.to_json()).to_json(), result.to_json())


def test_a_runs_summary_says_where_its_wall_time_went():
    stepped = RunResult.from_json({**NO_STEPS, "wall": {"startup_to_first_step_s": 4.5, "total_s": 12.0},
                                   "timing": {**NO_STEPS["timing"], "warmup_s": 2.25}})
    summary = RunSummary.of(stepped).to_json()
    assert (summary["startup_s"], summary["warmup_s"], summary["wall_s"]) == (4.5, 2.25, 6.1)
    # a run that never stepped has neither, and an older report without them reads back unchanged
    assert "startup_s" not in RunSummary.of(RunResult.from_json(NO_STEPS)).to_json()
    older = {key: value for key, value in summary.items() if key not in ("startup_s", "warmup_s")}
    assert RunSummary.from_json(older).to_json() == older


def test_the_suite_runs_real_processes_on_a_copy_of_its_fixtures(tmp_path, fake_fixer, train_source, quick_settings):
    # The suite's whole path on real runs, the original, speedfix's fixes and the expert's version
    # (one pair each, after the discarded warm-up run), on a copy: the fixtures stay as they were.
    # Tiny scripts that update by hand (no optimizer import); the bundled fixtures from the wheel:
    # test_packaging.py.
    from speedfix.bench.suite import run_suite

    fixtures = tmp_path / "fixtures"
    fixtures.mkdir()
    (fixtures / "suite.toml").write_text('[[workload]]\nname = "toy"\nscript = "toy.py"\nexpert = "toy_expert.py"\n'
                                         'tiny_args = ["--tiny"]\n')
    (fixtures / "toy.py").write_text(train_source(in_loop="torch.cuda.empty_cache()"))
    (fixtures / "toy_expert.py").write_text(train_source())
    before = {path.name: path.read_bytes() for path in fixtures.iterdir()}
    result = run_suite(fixtures=fixtures, tiny=True, console=Console(record=True),
                       settings=quick_settings(warmup=2, steps=3, max_pairs=1, min_pairs=1),
                       fixer=fake_fixer({"SF303": ("    torch.cuda.empty_cache()\n", "")}))
    (row,) = result.workloads
    assert not row.error and row.args == ["--tiny"] and row.fixes == ["SF303"] and row.pairs == 1
    assert row.before > 0 and row.after > 0 and row.expert > 0 and row.loss_check.startswith("ok")
    assert row.speedup.pairs == 1 and row.expert_speedup.pairs == 1
    assert row.captured is None  # 1 pair is too few to call the expert faster
    assert result.size == "tiny" and result.device == "cpu" and not result.cuda_available
    assert {path.name: path.read_bytes() for path in fixtures.iterdir()} == before
    from speedfix.bench import report

    assert "| toy | SF303 |" in report.suite_markdown(result)  # what `--markdown` writes
    assert same_json(SuiteResult.from_json(result.to_json()).to_json(), result.to_json())  # and `--json`
