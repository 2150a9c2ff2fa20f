"""`apply --verify`'s default: the combination of the fixes first, a bisection only when it fails."""

from __future__ import annotations

import json

from rich.console import Console

from speedfix.bench import stats
from speedfix.bench.verify import verify_script

ENOUGH = dict(max_pairs=stats.MIN_VERDICT_PAIRS, min_pairs=stats.MIN_VERDICT_PAIRS)
THREE = {"SF304": ("A", "a"), "SF402": ("B", "b"), "SF603": ("C", "c")}  # CPU fixes (not GPU-only)


def verify(tmp_path, fake_fixer, run, quick_settings, rewrites=THREE, **settings):
    script = tmp_path / "train.py"
    script.write_text("A\nB\nC\n")
    console = Console(record=True, width=250)
    code = verify_script(script, [], console=console, fixer=fake_fixer(rewrites), run=run,
                         compare_settings=quick_settings(**{**ENOUGH, **settings}))
    report = json.loads((tmp_path / "train.speedfix-verify.json").read_text())
    return code, report, script.read_text(), console.export_text()


def measured_sets(runs) -> list[str]:
    seen = []
    for name, _ in runs.calls:
        if name != "original" and name not in seen:
            seen.append(name)
    return seen


def by_membership(fake, culprit: str, **effect):
    """Every set that holds ``culprit`` gets ``effect`` (slower, NaN losses or a crash)."""

    def run(spec, config):
        if culprit in spec.name.split("+"):
            if "fail" in effect:
                return fake.__class__({}, fail={spec.name: effect["fail"]})(spec, config)
            if "losses" in effect:
                return fake.__class__({spec.name: 150.0}, losses={spec.name: effect["losses"]},
                                      device=fake.device)(spec, config)
        return fake(spec, config)

    run.calls = fake.calls
    return run


def test_a_combination_that_passes_keeps_every_fix_after_one_comparison(tmp_path, fake_fixer, fake_runs,
                                                                        quick_settings):
    runs = fake_runs({"original": 100.0, "SF304+SF402+SF603": 300.0}, device="cpu")
    code, report, text, out = verify(tmp_path, fake_fixer, runs, quick_settings)
    assert code == 0 and report["mode"] == "combination first"
    assert measured_sets(runs) == ["SF304+SF402+SF603"]  # no fix measured alone
    assert len(runs.calls) == 1 + 2 * stats.MIN_VERDICT_PAIRS  # the discarded run, then 6 pairs
    assert report["kept"] == ["SF304", "SF402", "SF603"] and text == "a\nb\nc\n"
    for fix in report["fixes"]:
        assert fix["decision"] == "kept" and fix["measured_as"] == "SF304+SF402+SF603"
        assert fix["reason"].startswith("kept with SF304+SF402+SF603: faster (3.00x")
        assert fix["speedup"]["pairs"] == stats.MIN_VERDICT_PAIRS
    assert "verify: 3 fix(es) together first" in out and "up to 4 more comparisons" in out


def test_a_slower_combination_is_bisected_down_to_the_fix_that_slows_it(tmp_path, fake_fixer, fake_runs,
                                                                         quick_settings):
    runs = fake_runs({"original": 100.0, "SF304+SF402+SF603": 50.0, "SF304": 150.0, "SF304+SF402": 160.0})
    code, report, text, _ = verify(tmp_path, fake_fixer, runs, quick_settings)
    assert measured_sets(runs) == ["SF304+SF402+SF603", "SF304", "SF304+SF402"]  # the full set is not run twice
    assert [c["label"] for c in report["combinations"]] == measured_sets(runs)
    assert report["kept"] == ["SF304", "SF402"] and text == "a\nb\nC\n"
    fixes = {f["label"]: f for f in report["fixes"]}
    assert fixes["SF304"]["measured_as"] == "SF304+SF402" and fixes["SF402"]["decision"] == "kept"
    culprit = fixes["SF603"]
    assert culprit["decision"] == "rejected" and culprit["measured_as"] == "SF304+SF402+SF603"
    assert culprit["reason"].startswith("rejected added to SF304+SF402: measurably slower: 0.50x")
    assert code == 1


def test_a_fix_that_breaks_the_loss_is_found_and_the_rest_kept(tmp_path, fake_fixer, fake_runs, quick_settings):
    runs = by_membership(fake_runs({"original": 100.0, "SF402": 120.0, "SF402+SF603": 130.0}), "SF304",
                         losses=[float("nan")] * 40)
    code, report, text, _ = verify(tmp_path, fake_fixer, runs, quick_settings)
    assert report["kept"] == ["SF402", "SF603"] and text == "A\nb\nc\n"
    culprit = next(f for f in report["fixes"] if f["label"] == "SF304")
    assert culprit["decision"] == "rejected" and culprit["reason"].startswith("rejected alone: loss check failed")
    assert code == 1


def test_a_fix_that_crashes_the_script_is_found(tmp_path, fake_fixer, fake_runs, quick_settings):
    fake = fake_runs({"original": 100.0, "SF304": 150.0, "SF304+SF402": 160.0})
    runs = by_membership(fake, "SF603", fail="error")
    _, report, text, _ = verify(tmp_path, fake_fixer, runs, quick_settings)
    assert report["kept"] == ["SF304", "SF402"] and text == "a\nb\nC\n"
    culprit = next(f for f in report["fixes"] if f["label"] == "SF603")
    assert "the patched script failed (error)" in culprit["reason"]


def test_two_culprits_leave_the_fix_that_passes(tmp_path, fake_fixer, fake_runs, quick_settings):
    runs = fake_runs({"original": 100.0, "SF304+SF402+SF603": 50.0, "SF304": 50.0, "SF402+SF603": 50.0,
                      "SF402": 150.0})
    _, report, text, _ = verify(tmp_path, fake_fixer, runs, quick_settings)
    assert report["kept"] == ["SF402"] and text == "A\nb\nC\n"
    decisions = {f["label"]: f["decision"] for f in report["fixes"]}
    assert decisions == {"SF304": "rejected", "SF402": "kept", "SF603": "rejected"}
    assert len(report["combinations"]) <= 2 * 3 - 1  # the combination, then at most 2k - 2 steps


def test_a_combination_not_measured_enough_decides_nothing_and_is_not_searched(tmp_path, fake_fixer, fake_runs,
                                                                               quick_settings):
    runs = fake_runs({"original": 100.0, "SF304+SF402+SF603": 300.0})
    code, report, text, _ = verify(tmp_path, fake_fixer, runs, quick_settings, max_pairs=2, min_pairs=2)
    assert measured_sets(runs) == ["SF304+SF402+SF603"]
    assert {f["decision"] for f in report["fixes"]} == {"not measured enough"}
    assert report["kept"] == [] and text == "A\nB\nC\n" and code == 1


def test_with_calibration_there_is_no_discarded_run_and_each_set_is_calibrated_once(tmp_path, fake_fixer, fake_runs,
                                                                                    quick_settings):
    runs = fake_runs({"original": 100.0, "SF304+SF402+SF603": 50.0, "SF304": 150.0, "SF304+SF402": 160.0})
    verify(tmp_path, fake_fixer, runs, quick_settings, warmup=None, steps=None)
    calibrated = [name for name, cfg in runs.calls if cfg.record_all_steps]
    assert calibrated == ["original", "SF304+SF402+SF603", "SF304", "SF304+SF402"]
    assert runs.calls[0][1].record_all_steps  # the first run is the original's calibration


def test_the_cpu_timing_example_holds_three_cpu_fixes_and_no_gpu_only_one():
    # benchmarks/verify_cpu_example.py is the script whose `apply --verify` time docs/benchmarks.md reports
    from pathlib import Path

    from speedfix.fixes import fixer
    from speedfix.bench.fixsets import gpu_only

    example = Path(__file__).resolve().parents[2] / "benchmarks" / "verify_cpu_example.py"
    codes = list(fixer.fixable_codes(example.read_text(), path=str(example), unsafe=True))
    assert codes == ["SF304", "SF402", "SF603"] and not any(gpu_only(c) for c in codes)


def test_without_a_run_before_the_combination_a_gpu_only_fix_measured_on_a_cpu_is_still_not_verified(
        tmp_path, fake_fixer, fake_runs, quick_settings):
    # a fixed window and no discarded run: the device is known only once the combination ran
    runs = fake_runs({"original": 100.0, "SF102+SF304": 200.0}, device="cpu")
    code, report, text, _ = verify(tmp_path, fake_fixer, runs, quick_settings,
                                   rewrites={"SF102": ("A", "a"), "SF304": ("B", "b")}, discard=False)
    decisions = {f["label"]: f["decision"] for f in report["fixes"]}
    assert decisions == {"SF102": "needs a GPU to verify", "SF304": "kept"}
    assert report["kept"] == ["SF304"] and text == "A\nb\nC\n" and code == 1
