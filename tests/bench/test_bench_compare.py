"""The comparison loop with a fake runner: order, stop rules, budget, failures, calibration."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from speedfix.bench import compare as compare_mod
from speedfix.bench import stats
from speedfix.bench.compare import ComparisonError, Session
from speedfix.bench.runner import RunSpec
from speedfix.bench.settings import CompareSettings

def spec(name: str) -> RunSpec:
    return RunSpec(Path(f"{name}.py"), [], None, label=name)


def settings(**overrides) -> CompareSettings:
    base = dict(warmup=5, steps=20, max_pairs=4, min_pairs=4, budget_s=1e9)
    base.update(overrides)
    return CompareSettings(**base)


def test_pairs_run_in_abba_order_after_one_discarded_run(fake_runs):
    runs = fake_runs({"A": 100.0, "B": 150.0})
    outcome = Session(spec("A"), settings(max_pairs=6, min_pairs=6), run=runs).compare([spec("B")])
    assert [name for name, _ in runs.calls] == ["A", "A", "B", "B", "A", "A", "B", "B", "A", "A", "B", "B", "A"]
    # the discarded run is short; every timed run uses the same window and seed
    timed = [cfg for _, cfg in runs.calls[1:]]
    assert {(c.warmup_steps, c.steps, c.seed) for c in timed} == {(5, 20, 0)}
    cand = outcome.candidates[0]
    assert cand.speedup.median == pytest.approx(1.5)
    assert cand.speedup.verdict == "faster"
    assert cand.metric == "samples_per_s"
    assert cand.numerics.level == "identical"


def test_several_candidates_rotate_forward_then_reversed(fake_runs):
    runs = fake_runs({"A": 100.0, "B": 90.0, "C": 200.0})
    outcome = Session(spec("A"), settings(max_pairs=2, min_pairs=2, discard=False), run=runs).compare(
        [spec("B"), spec("C")])
    assert [name for name, _ in runs.calls] == ["A", "B", "C", "C", "B", "A"]
    speed = {c.label: c.speedup.median for c in outcome.candidates}
    assert speed == {"B": pytest.approx(0.9), "C": pytest.approx(2.0)}


def test_stops_once_the_interval_is_tight_enough(fake_runs):
    runs = fake_runs({"A": 100.0, "B": 130.0})
    outcome = Session(spec("A"), settings(max_pairs=10, min_pairs=3), run=runs).compare([spec("B")])
    assert outcome.pairs == stats.MIN_VERDICT_PAIRS  # the first count with a 95% interval
    assert outcome.stop_reason == "precise"


def test_budget_ends_the_rounds(fake_runs, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(compare_mod.time, "monotonic", lambda: clock[0])
    runs = fake_runs({"A": 100.0, "B": 100.0}, clock=clock)
    # each run takes 10 fake seconds, so a pair takes 20: a 35 s budget allows one pair
    outcome = Session(spec("A"), settings(max_pairs=10, min_pairs=5, budget_s=35.0, discard=False),
                      run=runs).compare([spec("B")])
    assert outcome.pairs == 1
    assert outcome.stop_reason == "budget"


def test_the_budget_counts_the_calibration_and_keeps_time_for_the_seed_band(fake_runs, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(compare_mod.time, "monotonic", lambda: clock[0])
    # every run takes 10 fake seconds: calibration 20 s, a pair 20 s, the seed band 2 x 10 s; the
    # candidate's loss differs from the original's, so the loss check needs the band
    runs = fake_runs({"A": 100.0, "B": 100.0}, clock=clock, losses={"B": [v * 1.001 for v in fake_runs.LOSSES]})
    loose = settings(warmup=None, steps=None, warmup_s=1.0, window_s=2.0, max_pairs=10, min_pairs=6)
    outcome = Session(spec("A"), replace(loose, budget_s=65.0), run=runs).compare([spec("B")])
    # after one pair 40 s are gone; another pair and the band would end at 80 s
    assert (outcome.pairs, outcome.stop_reason) == (1, "budget")
    assert [name for name, _ in runs.calls] == ["A", "B", "A", "B", "A", "A"]  # calibration, a pair, the band
    assert clock[0] <= 65.0 and outcome.elapsed_s == clock[0]
    assert outcome.candidates[0].numerics.level == "within seed band"
    runs = fake_runs({"A": 100.0, "B": 100.0}, clock=clock, losses={"B": [v * 1.001 for v in fake_runs.LOSSES]})
    assert Session(spec("A"), replace(loose, budget_s=85.0), run=runs).compare([spec("B")]).pairs == 2


def test_a_failing_candidate_is_reported_and_not_run_again(fake_runs):
    runs = fake_runs({"A": 100.0, "B": 100.0}, fail={"B": "error"})
    outcome = Session(spec("A"), settings(discard=False), run=runs).compare([spec("B")])
    cand = outcome.candidates[0]
    assert cand.status == "error"
    assert cand.failure.message == "B broke"
    assert "RuntimeError" in cand.failure.stderr_tail
    assert [name for name, _ in runs.calls].count("B") == 1
    assert outcome.stop_reason == "every candidate failed"


def test_an_original_that_cannot_run_raises(fake_runs):
    runs = fake_runs({"A": 100.0, "B": 100.0}, fail={"A": "no_steps"})
    with pytest.raises(ComparisonError) as err:
        Session(spec("A"), settings(), run=runs).compare([spec("B")])
    assert err.value.result.status == "no_steps"


def test_calibration_picks_the_window_from_the_time_targets(fake_runs):
    runs = fake_runs({"A": 100.0, "B": 100.0})
    session = Session(spec("A"), settings(warmup=None, steps=None, warmup_s=1.0, window_s=2.0), run=runs)
    session.prepare()
    assert len(runs.calls) == 1  # the calibration run warms the caches: no discarded run before it
    calibration_cfg = runs.calls[0][1]
    assert calibration_cfg.warmup_s == 1.0 and calibration_cfg.window_s == 2.0
    assert calibration_cfg.warmup_steps == 20  # at least 20 warm-up steps
    assert (session.warmup, session.steps) == (100, 200)  # 1 s and 2 s at 100 steps/s


def test_a_fixed_window_needs_no_calibration_but_one_discarded_run(fake_runs):
    runs = fake_runs({"A": 100.0})
    Session(spec("A"), settings(warmup=5, steps=20), run=runs).prepare()
    (name, cfg), = runs.calls
    assert name == "A" and (cfg.warmup_steps, cfg.steps, cfg.record_all_steps) == (1, 2, False)


def test_calibration_shortens_the_window_for_a_short_script(fake_runs):
    runs = fake_runs({"A": 100.0, "B": 100.0}, total_steps=50)
    session = Session(spec("A"), settings(warmup=None, steps=None), run=runs)
    session.prepare()
    assert session.warmup + session.steps <= 50 - 2  # a 5% margin for skipped steps
    assert "only 50" in session.calibration.note


def test_seed_band_is_measured_only_when_needed_and_only_once(fake_runs):
    runs = fake_runs({"A": 100.0, "B": 100.0, "C": 100.0},
                    losses={"B": [v * 1.005 for v in fake_runs.LOSSES], "C": [v * 1.5 for v in fake_runs.LOSSES]})
    session = Session(spec("A"), settings(max_pairs=2, min_pairs=2, discard=False), run=runs)
    outcome = session.compare([spec("B"), spec("C")], kinds={"B": "numerics", "C": "numerics"})
    offsets = [cfg.seed_offset for _, cfg in runs.calls if cfg.seed_offset]
    assert offsets == [1, 2]
    checks = {c.label: c.numerics for c in outcome.candidates}
    assert checks["B"].passed and checks["B"].level == "within seed band"
    assert not checks["C"].passed and checks["C"].level == "outside seed band"


def test_exact_candidates_that_match_need_no_seed_band(fake_runs):
    runs = fake_runs({"A": 100.0, "B": 100.0})
    Session(spec("A"), settings(max_pairs=2, min_pairs=2), run=runs).compare([spec("B")], kinds={"B": "exact"})
    assert not any(cfg.seed_offset for _, cfg in runs.calls)


def test_labels_must_be_distinct(fake_runs):
    runs = fake_runs({"A": 100.0})
    with pytest.raises(ValueError):
        Session(spec("A"), settings(), run=runs).compare([spec("A")])


def test_settled_after_skips_past_the_last_slow_warm_up_step():
    durations = [2.0, 0.1, 0.1, 1.5, 0.1] + [0.1] * 30  # compile, then a recompile at step 5
    assert compare_mod.settled_after(durations) == 5 + compare_mod.WARMUP_MARGIN
    assert compare_mod.settled_after([0.1] * 40) == 0
    # a slow step in the second half is the workload (an epoch boundary), not warm-up
    assert compare_mod.settled_after([0.1] * 30 + [5.0] + [0.1] * 9) == 0


def test_a_slowly_settling_candidate_lengthens_everyones_warm_up(fake_runs):
    runs = fake_runs({"A": 100.0, "B": 100.0}, slow_steps={"B": 60})  # B compiles for 60 steps
    session = Session(spec("A"), settings(warmup=None, steps=None, warmup_s=0.1, window_s=2.0, max_pairs=1,
                                          min_pairs=1), run=runs)
    outcome = session.compare([spec("B")])
    assert [name for name, cfg in runs.calls if cfg.record_all_steps] == ["A", "B"]
    assert session.calibration.warmup_needed == {"A": 20, "B": 61 + compare_mod.WARMUP_MARGIN}
    timed = {(cfg.warmup_steps, cfg.steps) for _, cfg in runs.calls[2:]}
    assert timed == {(61 + compare_mod.WARMUP_MARGIN, 200)}  # A and B run the same steps
    assert outcome.window == outcome.candidates[0].window


def test_the_window_goes_before_a_recompile_at_an_epoch_end_where_it_fits(fake_runs):
    # B compiles in its first 3 steps and again at step 120 (its first epoch end: a smaller last
    # batch, evaluation in eval mode); its calibration saw 250 steps, the recompile in their first half
    def timed(rate_a: float) -> set[tuple[int, int]]:
        runs = fake_runs({"A": rate_a, "B": 100.0}, slow_steps={"B": 3}, slow_at={"B": [120]})
        session = Session(spec("A"), settings(warmup=None, steps=None, warmup_s=0.5, window_s=2.0, max_pairs=1,
                                              min_pairs=1), run=runs)
        session.compare([spec("B")])
        return {(cfg.warmup_steps, cfg.steps) for _, cfg in runs.calls[2:] if not cfg.seed_offset}

    # A runs 20 steps/s: a window of 40 steps fits before step 120, after the minimum warm-up
    assert timed(20.0) == {(20, 40)}
    # at 100 steps/s the window (200 steps) does not fit before it: every variant warms up past it
    assert timed(100.0) == {(120 + compare_mod.WARMUP_MARGIN, 200)}


def test_quiet_warmup_never_starts_later_than_past_the_last_slow_step():
    margin = compare_mod.WARMUP_MARGIN
    # a slow step 5 steps into the window, then a quiet stretch: the window starts after it
    assert compare_mod.quiet_warmup(20, 50, [([4, 30], 400)], latest=200) == 30 + margin
    # a window beyond what the calibration saw proves nothing: past the last slow step it is
    assert compare_mod.quiet_warmup(20, 50, [([4, 30], 60)], latest=40) == 40
    # every calibrated compiled variant must be quiet in the same window
    assert compare_mod.quiet_warmup(20, 50, [([4], 400), ([60], 400)], latest=70) == 70
    assert compare_mod.quiet_warmup(20, 30, [([4], 400), ([60], 400)], latest=70) == 20
    assert compare_mod.quiet_warmup(20, 50, [], latest=20) == 20


def test_a_candidate_that_fails_calibration_is_not_run_again(fake_runs):
    runs = fake_runs({"A": 100.0, "B": 100.0}, fail={"B": "error"})
    outcome = Session(spec("A"), settings(warmup=None, steps=None), run=runs).compare([spec("B")])
    assert [name for name, _ in runs.calls].count("B") == 1
    assert outcome.candidates[0].status == "error"


def test_the_window_is_sized_by_the_slowest_variant_and_the_same_for_all(fake_runs):
    # a slow original is not timed over the many steps a fast candidate fills in the same seconds;
    # the candidate runs the original's steps, in less time (the same steps of the script: like for like)
    runs = fake_runs({"A": 50.0, "B": 200.0})
    session = Session(spec("A"), settings(warmup=None, steps=None, warmup_s=1.0, window_s=2.0, max_pairs=2,
                                          min_pairs=2), run=runs)
    outcome = session.compare([spec("B")])
    assert {(cfg.warmup_steps, cfg.steps) for _, cfg in runs.calls if not cfg.record_all_steps} == {(50, 100)}
    assert outcome.candidates[0].speedup.median == pytest.approx(4.0)  # rates are compared


def test_slow_steps_of_an_eager_variant_are_the_machines_and_do_not_lengthen_the_warm_up(fake_runs, monkeypatch):
    runs = fake_runs({"A": 100.0, "B": 100.0}, slow_steps={"B": 60})

    def eager(spec, config):  # the same slow first steps, but nothing was compiled: a busy phase
        result = runs(spec, config)
        return replace(result, compile=replace(result.compile, compilations=0))

    session = Session(spec("A"), settings(warmup=None, steps=None, warmup_s=0.1, window_s=2.0, max_pairs=1,
                                          min_pairs=1), run=eager)
    session.compare([spec("B")])
    assert session.window(["A", "B"]).warmup == 20


def test_a_calibration_caught_in_a_slow_phase_shortens_the_window_not_lengthens_the_runs(fake_runs):
    runs = fake_runs({"A": 200.0, "B": 50.0})  # here the candidate is the slow one
    session = Session(spec("A"), settings(warmup=None, steps=None, window_s=2.0, max_pairs=1, min_pairs=1),
                      run=runs)
    session.compare([spec("B")])
    assert session.window(["A", "B"]).steps == 100


def test_a_variant_added_later_is_calibrated_once_when_it_first_runs(fake_runs):
    runs = fake_runs({"A": 100.0, "B": 150.0, "C": 300.0})
    session = Session(spec("A"), settings(warmup=None, steps=None, window_s=1.0, max_pairs=2, min_pairs=2),
                      run=runs)
    session.compare([spec("B")])
    session.compare([spec("C")])
    session.compare([spec("C")])
    calibrated = [name for name, cfg in runs.calls if cfg.record_all_steps]
    assert calibrated == ["A", "B", "C"]
    # each comparison sized by its own variants: A (100 steps/s) is the slowest of A and C
    assert {cfg.steps for name, cfg in runs.calls if name == "C" and not cfg.record_all_steps} == {100}


def test_runs_in_a_scratch_mirror_are_stopped_as_soon_as_their_result_is_written(fake_runs):
    runs = fake_runs({"A": 100.0, "B": 100.0})
    real = RunSpec(Path("B.py"), [], None, label="B", real_cwd=True)
    Session(spec("A"), settings(max_pairs=1, min_pairs=1, result_grace_s=5.0), run=runs).compare([real])
    grace = {(name, cfg.result_grace_s) for name, cfg in runs.calls}
    assert grace == {("A", 0.0), ("B", 5.0)}  # B writes into the real folder: it may unwind


class Recorder(compare_mod.Progress):
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.left: list[float | None] = []

    def expect(self, seconds_left):
        self.left.append(seconds_left)

    def note(self, text):
        self.lines.append(text)


def test_the_expected_time_is_said_before_the_pairs_and_counted_down(fake_runs, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(compare_mod.time, "monotonic", lambda: clock[0])
    runs = fake_runs({"A": 100.0, "B": 150.0}, clock=clock)  # every run takes 10 s
    progress = Recorder()
    Session(spec("A"), settings(warmup=None, steps=None, max_pairs=3, min_pairs=3), run=runs,
            progress=progress).compare([spec("B")])
    assert progress.lines == ["1 candidate(s) against the original: up to 3 pairs, 6 runs, about 1 min 00 s"]
    # after each calibration run (B's still to come after A's), then after each of the 6 timed runs
    # (None: nothing left in the plan)
    assert progress.left == [pytest.approx(v) for v in (10.0, None, 50.0, 40.0, 30.0, 20.0, 10.0, None)]


def test_a_window_past_the_end_of_the_script_is_shortened_and_the_run_repeated(fake_runs):
    # the calibration runs did not reach the script's end (300 steps); the window does
    fake = fake_runs({"A": 100.0, "B": 100.0})

    def run(spec, config):
        fake.total_steps = None if config.record_all_steps else 300
        return fake(spec, config)

    outcome = Session(spec("A"), settings(warmup=None, steps=None, warmup_s=0.1, window_s=3.0, max_pairs=2,
                                          min_pairs=2), run=run).compare([spec("B")])
    assert outcome.candidates[0].status == "ok" and outcome.candidates[0].speedup.pairs == 2
    timed = [(name, cfg.warmup_steps + cfg.steps) for name, cfg in fake.calls if not cfg.record_all_steps]
    assert timed[0] == ("A", 320)  # ended at step 300
    assert timed[1][0] == "A" and all(total <= 300 - 15 for _, total in timed[1:])  # again, and later runs, fit
    assert len(timed) == 5 and outcome.window.warmup + outcome.window.steps <= 285
