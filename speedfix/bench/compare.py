"""A/B comparison of an original script against one or more candidates.

Sequence: one discarded run (the first run after an idle spell is slow: cold caches and clocks),
one calibration run of the original that picks the warm-up W and the window N from a time target
(past lazy initialisation, and long enough to average out per-step jitter), then rounds of fresh
runs in counterbalanced order - A B, then B A (ABBA for one candidate; A B C, C B A for
several) - until the 95% interval of every median speedup is within the tolerance, or
``max_pairs`` rounds, or the time budget. Every run uses the same seed, W, N and cwd. The original's runs double as its A/A baseline for the loss check.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

from . import numerics
from .results import (INCOMPLETE, OK, SAMPLES_PER_S, STEPS_PER_S, Calibration, CandidateResult, Comparison, Device, Env, Load,
                      LoggedRun, MemoryChange, RunAggregate, RunResult, ScriptRef, SeedBand, Speedup, Window,
                      median_or_none)
from .runner import RunSpec, run_once
from .settings import CompareSettings, RunConfig
from .stats import cv, precise_enough, summarize

RunFn = Callable[[RunSpec, RunConfig], RunResult]


class Progress:
    """What a comparison reports while it runs; report.RichProgress draws it."""

    def plan(self, runs: int) -> None:
        """Up to this many more runs are coming."""

    def start(self, description: str) -> None:
        """A run starts."""

    def finish(self, result: RunResult) -> None:
        """The run that started last has ended."""


class ComparisonError(RuntimeError):
    """The original script cannot be benchmarked; ``result`` is its failed run."""

    def __init__(self, message: str, result: RunResult) -> None:
        super().__init__(message)
        self.result = result


class Session:
    """One original script under comparison: its calibrated window, its runs and its seed band.

    ``verify`` reuses one session for every fix and for the combination, so the discarded run,
    the calibration and the seed band are paid once.
    """

    def __init__(self, original: RunSpec, settings: CompareSettings, *, run: RunFn = run_once,
                 progress: Progress | None = None) -> None:
        self.original = original
        self.settings = settings
        self.run_fn = run
        self.progress = progress or Progress()
        self.warmup: int | None = settings.warmup
        self.steps: int | None = settings.steps
        self.calibration: Calibration | None = None
        self.prepared = False
        self.calibration_failures: dict[str, RunResult] = {}
        self.a_losses: list[list] = []  # every timed run of the original, for the A/A baseline
        self._band: SeedBand | None = None
        self.env: Env | None = None  # interpreter, torch and device of the original's first good run
        self.device: Device | None = None

    # ------------------------------------------------------------ plumbing
    def _run(self, spec: RunSpec, config: RunConfig, what: str) -> RunResult:
        self.progress.start(f"{what}: {spec.name}")
        result = self.run_fn(spec, config)
        self.progress.finish(result)
        return result

    def timed_config(self, **overrides) -> RunConfig:
        return self.settings.run_config(warmup_steps=self.warmup, steps=self.steps, **overrides)

    # ------------------------------------------------------------ phases
    def prepare(self, candidates: list[RunSpec] = ()) -> None:
        """Discarded run, then calibration of the original and the candidates.

        Raises ComparisonError if the original cannot run. A candidate that fails its
        calibration run is recorded in ``calibration_failures`` and not run again.
        """
        s = self.settings
        self.prepared = True
        needs_calibration = self.warmup is None or self.steps is None
        self.progress.plan(int(s.discard) + (1 + len(candidates)) * int(needs_calibration))
        if s.discard:
            result = self._run(self.original, s.run_config(warmup_steps=1, steps=2), "discarded warm-up run")
            if not result.measured:
                raise ComparisonError(f"the original script failed: {result.message}", result)
        if needs_calibration:
            self._calibrate(list(candidates))

    def _calibrate(self, candidates: list[RunSpec]) -> None:
        """W and N from time targets. Every variant is calibrated: a compiled candidate
        needs a longer warm-up than the original (its slow compile and recompile steps must end
        before the window), and A and B must share W and N."""
        s = self.settings
        config = s.run_config(
            warmup_steps=self.warmup or s.min_warmup_steps, warmup_s=0.0 if self.warmup else s.warmup_s,
            steps=self.steps or s.min_steps, window_s=0.0 if self.steps else s.window_s, record_all_steps=True)
        result = self._run(self.original, config, "calibration run")
        status = result.status
        if not result.measured or result.observed_steps < 4:
            raise ComparisonError(f"the original script could not be calibrated ({status}): "
                                  f"{result.message}", result)
        needed = {self.original.name: _needed_warmup(result)}
        # the largest window any variant filled: one calibration run caught in a busy phase of the
        # machine must not shrink every later window
        window = [result.timing.steps_timed] if result.ok else []
        limits = [result.observed_steps] if status == INCOMPLETE else []
        for cand in candidates:
            res = self._run(cand, config, "calibration run")
            if not res.measured or res.observed_steps < 4:
                self.calibration_failures[cand.name] = res
                continue
            needed[cand.name] = _needed_warmup(res)
            if res.ok:
                window.append(res.timing.steps_timed)
            if res.status == INCOMPLETE:
                limits.append(res.observed_steps)
        warmup = self.warmup or max(needed.values())
        steps = self.steps or (max(window) if window and result.ok else None)
        note = None
        if limits:
            # The script is shorter than the targets. Keep a 5% margin, so that a candidate whose
            # GradScaler skips a few more steps (fp16 scale calibration) still completes the window.
            shortest = min(limits)
            usable = shortest - max(1, shortest // 20)
            if warmup + (steps or usable) > usable:
                warmup = self.warmup or max(1, min(warmup, usable // 2))
                steps = self.steps or max(1, usable - warmup)
                note = (f"the script runs only {shortest} optimizer steps: window shortened to "
                        f"{warmup} warm-up + {steps} timed steps")
        self.warmup, self.steps = warmup, steps or s.min_steps
        self.calibration = Calibration(status=status, steps_per_s=result.timing.steps_per_s,
                                       observed_steps=result.observed_steps, warmup=self.warmup, steps=self.steps,
                                       warmup_needed=needed, wall_s=result.runner.wall_s, note=note)

    def seed_band(self) -> SeedBand:
        """The original with other seeds (lazy, measured once per session)."""
        if self._band is None:
            others = []
            self.progress.plan(self.settings.seed_band_runs)
            for offset in range(1, self.settings.seed_band_runs + 1):
                result = self._run(self.original, self.timed_config(seed_offset=offset), f"seed band (seed +{offset})")
                if result.ok:
                    others.append(result.losses)
            reference = self.a_losses[0] if self.a_losses else []
            self._band = numerics.seed_band(reference, others)
        return self._band

    def compare(self, candidates: list[RunSpec], *, kinds: dict[str, str] | None = None,
                budget_s: float | None = None) -> Comparison:
        """Rounds of original + candidates in alternating order; one speedup per candidate."""
        s = self.settings
        if not self.prepared:
            self.prepare(candidates)
        budget = s.budget_s if budget_s is None else budget_s
        max_rounds = max(1, s.max_pairs)
        min_rounds = min(max(1, s.min_pairs), max_rounds)
        variants = [self.original, *candidates]
        if len({v.name for v in variants}) != len(variants):
            raise ValueError(f"variants need distinct labels: {[v.name for v in variants]}")
        self.progress.plan(max_rounds * len(variants))
        config = self.timed_config()
        started = time.monotonic()
        runs: dict[str, list[RunResult]] = {v.name: [] for v in variants}
        failed = {c.name: self.calibration_failures[c.name] for c in candidates if c.name in self.calibration_failures}
        ratios: dict[str, list[float]] = {c.name: [] for c in candidates}
        metric: dict[str, str] = {}
        log: list[LoggedRun] = []
        stop_reason = "max_pairs"
        round_times: list[float] = []
        for rnd in range(max_rounds):
            live = [c for c in candidates if c.name not in failed]
            if not live:
                stop_reason = "every candidate failed"
                break
            if rnd >= min_rounds and all(precise_enough(summarize(ratios[c.name]), s.tolerance) for c in live):
                stop_reason = "precise"
                break
            estimate = statistics.fmean(round_times) if round_times else 0.0
            if rnd >= 1 and time.monotonic() - started + estimate > budget:
                stop_reason = "budget"
                break
            t0 = time.monotonic()
            order = [self.original, *live]
            if rnd % 2:
                order.reverse()
            this_round: dict[str, RunResult] = {}
            for position, spec in enumerate(order):
                result = self._run(spec, config, f"pair {rnd + 1}/{max_rounds}, run {position + 1}/{len(order)}")
                this_round[spec.name] = result
                runs[spec.name].append(result)
                log.append(LoggedRun(rnd, position, spec.name, result.summary()))
            round_times.append(time.monotonic() - t0)
            base = this_round[self.original.name]
            if not base.ok:
                raise ComparisonError(f"the original script failed in pair {rnd + 1} ({base.status}): "
                                      f"{base.message}", base)
            self.a_losses.append(base.losses)
            if self.env is None:
                self.env, self.device = base.env, base.device
            for cand in live:
                res = this_round[cand.name]
                if not res.ok:
                    failed[cand.name] = res
                    continue
                key = metric.setdefault(cand.name, _metric(base, res))
                ratios[cand.name].append(res.rate(key) / base.rate(key))
        # Unused planned runs must not linger in the progress total.
        self.progress.plan(-(max_rounds * len(variants) - sum(len(r) for r in runs.values())))
        every_run = [r for rs in runs.values() for r in rs]
        return Comparison(
            original=ScriptRef(str(self.original.script), list(self.original.args), self.original.name),
            env=self.env, device=self.device, settings=replace(s), window=Window(self.warmup, self.steps),
            calibration=self.calibration, pairs=len(round_times), stop_reason=stop_reason,
            elapsed_s=time.monotonic() - started, original_runs=RunAggregate.of(runs[self.original.name]),
            candidates=[self._candidate_report(c, runs, ratios, failed, metric, (kinds or {}).get(c.name))
                        for c in candidates],
            runs=log, load=_load(every_run), caveat=numerics.CAVEAT,
            real_files_modified=sorted({p for r in every_run for p in r.runner.real_files_modified}))

    def _candidate_report(self, cand: RunSpec, runs: dict[str, list[RunResult]], ratios: dict[str, list[float]],
                          failed: dict[str, RunResult], metric: dict[str, str], kind: str | None) -> CandidateResult:
        a_runs, b_runs = runs[self.original.name], [r for r in runs[cand.name] if r.ok]
        kind = kind or numerics.AUTO
        broken = failed.get(cand.name)
        speedup = memory = check = None
        pair_ratios = ratios[cand.name]
        if pair_ratios:
            speedup = Speedup.of(summarize(pair_ratios), pair_ratios,
                                 p10_step_time_ratio=_time_ratio(a_runs, b_runs, "p10"),
                                 median_step_time_ratio=_time_ratio(a_runs, b_runs, "median"),
                                 cv_a=cv([r.timing.steps_per_s for r in a_runs if r.ok]),
                                 cv_b=cv([r.timing.steps_per_s for r in b_runs]))
            peak_a = median_or_none([r.peak_memory()[0] for r in a_runs])
            peak_b = median_or_none([r.peak_memory()[0] for r in b_runs])
            memory = MemoryChange(peak_a, peak_b, peak_b / peak_a if peak_a and peak_b else None,
                                  a_runs[0].peak_memory()[1] if a_runs else "")
        if b_runs:
            check = numerics.check(self.a_losses, b_runs[0].losses, kind=kind, band=self.seed_band)
        return CandidateResult(
            label=cand.name, script=str(cand.script), status=broken.status if broken else OK, kind=kind,
            metric=metric.get(cand.name), runs=RunAggregate.of(runs[cand.name]),
            failure=broken.failure() if broken else None, speedup=speedup, memory=memory, numerics=check,
            loss_original=(self.a_losses[0] if self.a_losses else []) if b_runs else None,
            loss_candidate=b_runs[0].losses if b_runs else None)


SLOW_STEP = 5.0  # a step this many times the settled median is still warming up
WARMUP_MARGIN = 10


def settled_after(durations: list[float]) -> int:
    """Steps until the run has settled: past the last slow step (lazy init, torch.compile and its
    recompiles, cudnn.benchmark autotuning) in the first half of a calibration run. Durations are
    between consecutive steps, so ``durations[i]`` belongs to step i + 2."""
    if len(durations) < 10:
        return 0
    reference = statistics.median(durations[len(durations) // 2:])
    slow = [i for i, d in enumerate(durations[:len(durations) // 2]) if d > SLOW_STEP * reference]
    return slow[-1] + 2 + WARMUP_MARGIN if slow else 0


def _needed_warmup(result: RunResult) -> int:
    """The warm-up a variant needs: its time-based warm-up, or longer if it was still settling."""
    return max(result.steps.warmup or 0, settled_after(result.timing.all_step_s or []))


def _metric(a: RunResult, b: RunResult) -> str:
    """samples/s when both runs know their batch size (an expert version may change it)."""
    return SAMPLES_PER_S if a.data.samples_per_s and b.data.samples_per_s else STEPS_PER_S


def _step_time(result: RunResult, key: str) -> float | None:
    return getattr(result.timing.step_time_s, key) if result.timing.step_time_s else None


def _time_ratio(a_runs: list[RunResult], b_runs: list[RunResult], key: str) -> float | None:
    """Cross-check estimator: median A step time over median B step time (>1: B faster)."""
    a = median_or_none([_step_time(r, key) for r in a_runs if r.ok])
    b = median_or_none([_step_time(r, key) for r in b_runs])
    return a / b if a and b else None


def _load(results: list[RunResult]) -> Load:
    """The highest 1-minute load average seen around the runs, against the CPU count."""
    loads = [v for r in results for v in r.runner.loadavg]
    return Load(max(loads) if loads else None, os.cpu_count())
