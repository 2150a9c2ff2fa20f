"""A/B comparison of an original script against one or more candidates.

Sequence: a calibration run of every variant (the original first: it also takes the place of a
discarded first run, whose job was to warm the caches after an idle spell), then rounds of fresh
runs in counterbalanced order - A B, then B A (ABBA for one candidate; A B C, C B A for several) -
until the 95% interval of every median speedup is within the tolerance, or ``max_pairs`` rounds, or
the time budget. Every run of a comparison uses the same seed, cwd, warm-up W and window N, so
that each variant is timed over the same steps of the script: a script whose steps differ in cost
(a grid search training one model after another, epochs with evaluation between them) is
compared like for like. W and N come from the calibration runs and are sized by the *slowest*
variant: N is the steps it runs in ``window_s``, W the steps it runs in ``warmup_s`` (at least the
minimum, and with no slow step of a compiled variant in the window: its compilation and recompiles
come before it, or after it where the calibration saw them, as at an epoch end). So no run
lasts much longer than the time targets, and a faster variant runs the same steps in less time.
(Sizing by the fastest variant made an original at 2-3 steps/s run 100 s against a candidate at 37
steps/s.) Rates are compared. With ``--warmup``/``--steps`` every variant runs exactly those steps
and one short discarded run comes first; a script shorter than the targets gets a window that fits
it. A variant added after the first comparison (a combination of fixes) is calibrated once when it
first runs. The original's runs double as its A/A baseline for the loss check.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from . import numerics
from .advice import first_runtime
from .results import (INCOMPLETE, OK, SAMPLES_PER_S, STEPS_PER_S, Calibration, CandidateResult, Comparison, Device, Env, Load,
                      LoggedRun, MemoryChange, RunAggregate, RunResult, ScriptRef, SeedBand, Speedup, Window,
                      median_or_none)
from .runner import RunSpec, run_once, runs_in_real_cwd
from .settings import CompareSettings, RunConfig
from .stats import cv, precise_enough, summarize
from .timeplan import TimePlan, about

RunFn = Callable[[RunSpec, RunConfig], RunResult]


class Progress:
    """What a comparison reports while it runs; report.RichProgress draws it."""

    def plan(self, runs: int) -> None:
        """Up to this many more runs are coming."""

    def start(self, description: str) -> None:
        """A run starts."""

    def expect(self, seconds_left: float | None) -> None:
        """The runs still planned will take about this long (None: not known yet)."""

    def finish(self, result: RunResult) -> None:
        """The run that started last has ended."""

    def note(self, text: str) -> None:
        """A line for the reader (the expected time of what comes next)."""


class ComparisonError(RuntimeError):
    """The original script cannot be benchmarked; ``result`` is its failed run."""

    def __init__(self, message: str, result: RunResult) -> None:
        super().__init__(message)
        self.result = result


class Session:
    """One original script under comparison: the variants' calibrated windows, the original's runs
    and its seed band.

    ``verify`` reuses one session for every comparison (the combination of fixes, the steps of a
    search for the fix that fails it), so the original's calibration and seed band are paid once.
    """

    def __init__(self, original: RunSpec, settings: CompareSettings, *, run: RunFn = run_once,
                 progress: Progress | None = None) -> None:
        self.original = original
        self.settings = settings
        self.run_fn = run
        self.progress = progress or Progress()
        self.fixed = settings.warmup is not None and settings.steps is not None  # no calibration
        self.calibration: Calibration | None = None
        self.prepared = False
        self.calibration_failures: dict[str, RunResult] = {}
        self.needed: dict[str, int] = {}  # warm-up steps each calibrated variant ran in warmup_s
        self.settled: dict[str, int] = {}  # warm-up steps past its last slow step (compilation, lazy init)
        self.slow: dict[str, tuple[list[int], int]] = {}  # a compiled variant's slow steps, steps seen
        self.filled: dict[str, int] = {}  # steps each variant ran in window_s
        self.limits: list[int] = []  # steps of the variants that ended before the calibration window did
        self.a_losses: list[list] = []  # every timed run of the original, for the A/A baseline
        self._band: SeedBand | None = None
        self._original_calibration: RunResult | None = None
        self.env: Env | None = None  # interpreter, torch and device of the original's first good run
        self.device: Device | None = None
        self.time = TimePlan(original.name)
        self._last_window: Window | None = None  # the latest comparison's (the seed band runs it too)

    # ------------------------------------------------------------ plumbing
    def _plan(self, names: list[str]) -> None:
        self.time.add(names)
        self.progress.plan(len(names))

    def _unplan(self, names: list[str]) -> None:
        self.time.drop(names)
        self.progress.plan(-len(names))

    def _run(self, spec: RunSpec, config: RunConfig, what: str, *, typical: bool = True) -> RunResult:
        self.progress.start(f"{what}: {spec.name}")
        started = time.monotonic()
        result = self.run_fn(spec, config)
        self.time.ran(spec.name, time.monotonic() - started if typical else None)
        self.progress.expect(self.time.left() if self.time.pending else None)
        self.progress.finish(result)
        return result

    def _grace(self, spec: RunSpec) -> float:
        """Stopped as soon as its result is written, unless what it writes lands in the real cwd."""
        return self.settings.result_grace_s if runs_in_real_cwd(spec) else 0.0

    def window(self, names: list[str] | None = None) -> Window:
        """The warm-up and timed steps every variant of a comparison runs (``names``: its variants,
        default the original): the given ones, else sized by the slowest calibrated variant (see the
        module's docstring), shortened for a script that ends sooner."""
        s = self.settings
        names = [n for n in (names or [self.original.name]) if n in self.needed]
        steps = s.steps or min((self.filled[n] for n in names if n in self.filled), default=None)
        base = max(s.min_warmup_steps, min((self.needed[n] for n in names), default=0))
        warmup = s.warmup or quiet_warmup(base, steps or s.min_steps, [self.slow[n] for n in names if n in self.slow],
                                          max([base, *(self.settled[n] for n in names)]))
        if self.limits:
            # The script is shorter than the targets. Keep a 5% margin, so that a candidate whose
            # GradScaler skips a few more steps (fp16 scale calibration) still completes the window.
            shortest = min(self.limits)
            usable = shortest - max(1, shortest // 20)
            if warmup + (steps or usable) > usable:
                warmup = s.warmup or max(1, min(warmup, usable // 2))
                steps = s.steps or max(1, usable - warmup)
        return Window(warmup, steps or s.min_steps)

    @property
    def warmup(self) -> int | None:
        return self.window().warmup

    @property
    def steps(self) -> int | None:
        return self.window().steps

    def timed_config(self, spec: RunSpec | None = None, window: Window | None = None, **overrides) -> RunConfig:
        spec = spec or self.original
        window = window or self.window()
        return self.settings.run_config(warmup_steps=window.warmup, steps=window.steps,
                                        result_grace_s=self._grace(spec), **overrides)

    # ------------------------------------------------------------ phases
    def prepare(self, candidates: list[RunSpec] = ()) -> None:
        """Calibration of the original and the candidates (with a fixed window: one discarded run).

        Raises ComparisonError if the original cannot run. A candidate that fails its
        calibration run is recorded in ``calibration_failures`` and not run again.
        """
        s = self.settings
        self.prepared = True
        if self.fixed:
            if s.discard:
                self._plan([self.original.name])
                result = self._run(self.original, s.run_config(warmup_steps=1, steps=2,
                                                               result_grace_s=self._grace(self.original)),
                                   "discarded warm-up run", typical=False)
                if not result.measured:
                    raise ComparisonError(f"the original script failed: {result.message}", result)
                self.env, self.device = result.env, result.device
            return
        self._calibrate_new([self.original, *candidates])

    def _calibrate_new(self, variants: list[RunSpec]) -> None:
        """One calibration run of each variant not calibrated yet (none with a fixed window)."""
        if self.fixed:
            return
        new = [v for v in variants if v.name not in self.needed and v.name not in self.calibration_failures]
        self._plan([v.name for v in new])
        for spec in new:
            self._calibrate(spec)

    def _calibrate(self, spec: RunSpec) -> None:
        """W and N of one variant from the time targets: W is at least the minimum steps and
        ``warmup_s``, longer while the variant is still settling (a compiled one needs longer);
        N is the steps it runs in ``window_s`` (at least the minimum steps)."""
        s = self.settings
        config = s.run_config(
            warmup_steps=s.warmup or s.min_warmup_steps, warmup_s=0.0 if s.warmup else s.warmup_s,
            steps=s.steps or s.min_steps, window_s=0.0 if s.steps else s.window_s, record_all_steps=True,
            result_grace_s=self._grace(spec))
        result = self._run(spec, config, "calibration run")
        if not result.measured or result.observed_steps < 4:
            if spec.name == self.original.name:
                raise ComparisonError(f"the original script could not be calibrated ({result.status}): "
                                      f"{result.message}", result)
            self.calibration_failures[spec.name] = result
            return
        self.needed[spec.name] = max(s.min_warmup_steps, result.steps.warmup or 0)
        # Past the last slow step of a compiled variant (compilation, recompiles). An eager one's slow
        # steps after the minimum warm-up are the machine's (a busy phase), and would lengthen the
        # warm-up of every variant for nothing.
        compiled = bool(result.compile.compilations or result.compile.seconds)
        durations = result.timing.all_step_s or []
        self.settled[spec.name] = settled_after(durations) if compiled else 0
        if compiled:
            self.slow[spec.name] = (slow_steps(durations), len(durations) + 1)
        if result.ok:
            self.filled[spec.name] = result.timing.steps_timed
        if result.status == INCOMPLETE:
            self.limits.append(result.observed_steps)
        if spec.name == self.original.name:
            self._original_calibration = result
            if self.env is None:
                self.env, self.device = result.env, result.device
        first = self._original_calibration
        window = self.window(list(self.needed))
        note = None
        if self.limits:
            note = (f"the script runs only {min(self.limits)} optimizer steps: window shortened to "
                    f"{window.warmup} warm-up + {window.steps} timed steps")
        self.calibration = Calibration(status=first.status, steps_per_s=first.timing.steps_per_s,
                                       observed_steps=first.observed_steps, warmup=window.warmup, steps=window.steps,
                                       warmup_needed={n: max(self.needed[n], self.settled[n]) for n in self.needed},
                                       wall_s=first.runner.wall_s, note=note)

    def _ended_early(self, result: RunResult) -> bool:
        """The script ended before a window that no calibration run reached (the slowest variant's
        warm-up steps plus another's settling steps): its length is learnt, the window shortened."""
        if self.fixed or result.status != INCOMPLETE or not result.observed_steps:
            return False
        if self.limits and result.observed_steps >= min(self.limits):
            return False  # known already: the window fits it, this run ended short for its own reasons
        self.limits.append(result.observed_steps)
        return True

    @property
    def band_measured(self) -> bool:
        return self._band is not None

    def seed_band(self) -> SeedBand:
        """The original with other seeds (lazy, measured once per session)."""
        if self._band is None:
            others = []
            runs = self.settings.seed_band_runs
            self._plan([self.original.name] * runs)
            for offset in range(1, runs + 1):
                result = self._run(self.original, self.timed_config(window=self._last_window, seed_offset=offset),
                                   f"seed band (seed +{offset})")
                if result.ok:
                    others.append(result.losses)
            reference = self.a_losses[0] if self.a_losses else []
            self._band = numerics.seed_band(reference, others)
        return self._band

    def _band_reserve(self) -> float:
        """What the seed band's runs will cost if the loss check asks for it (0 once measured)."""
        if self.band_measured:
            return 0.0
        return self.settings.seed_band_runs * (self.time.cost(self.original.name) or 0.0)

    def rounds(self) -> tuple[int, int]:
        """(fewest, most) rounds a comparison runs."""
        most = max(1, self.settings.max_pairs)
        return min(max(1, self.settings.min_pairs), most), most

    def compare(self, candidates: list[RunSpec], *, kinds: dict[str, str] | None = None,
                budget_s: float | None = None) -> Comparison:
        """Rounds of original + candidates in alternating order; one speedup per candidate.

        The budget covers the whole comparison: the calibration runs it needs first, the rounds,
        and the seed band the loss check may still need at the end (kept free while it is not
        measured), so that a comparison stopped by its budget still ends in time with a report."""
        started = time.monotonic()
        s = self.settings
        variants = [self.original, *candidates]
        if len({v.name for v in variants}) != len(variants):
            raise ValueError(f"variants need distinct labels: {[v.name for v in variants]}")
        if not self.prepared:
            self.prepare(candidates)
        else:
            self._calibrate_new(candidates)
        budget = s.budget_s if budget_s is None else budget_s
        min_rounds, max_rounds = self.rounds()
        planned = [v.name for v in variants] * max_rounds
        self._plan(planned)
        self.progress.note(f"{len(candidates)} candidate(s) against the original: up to {max_rounds} pairs, "
                           f"{len(planned)} runs{about(self.time.seconds(planned))}")
        window = self._last_window = self.window([v.name for v in variants])
        configs = {v.name: self.timed_config(v, window) for v in variants}
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
            if rnd >= 1 and time.monotonic() - started + estimate + self._band_reserve() > budget:
                stop_reason = "budget"
                break
            t0 = time.monotonic()
            order = [self.original, *live]
            if rnd % 2:
                order.reverse()
            this_round: dict[str, RunResult] = {}
            for position, spec in enumerate(order):
                what = f"pair {rnd + 1}/{max_rounds}, run {position + 1}/{len(order)}"
                result = self._run(spec, configs[spec.name], what)
                if self._ended_early(result):  # run again, in a window that fits the script
                    window = self._last_window = self.window([v.name for v in variants])
                    configs = {v.name: self.timed_config(v, window) for v in variants}
                    self._plan([spec.name])
                    result = self._run(spec, configs[spec.name], f"{what} again, in a window that fits the script")
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
        # Unused planned runs must not linger in the progress total or the time left.
        self._unplan(list((Counter(planned) - Counter(n for n, rs in runs.items() for _ in rs)).elements()))
        every_run = [r for rs in runs.values() for r in rs]
        reports = [self._candidate_report(c, runs, ratios, failed, metric, (kinds or {}).get(c.name), window)
                   for c in candidates]  # the loss check's seed band runs here, inside the elapsed time
        return Comparison(
            original=ScriptRef(str(self.original.script), list(self.original.args), self.original.name),
            env=self.env, device=self.device, settings=replace(s), window=window,
            calibration=self.calibration, pairs=len(round_times), stop_reason=stop_reason,
            elapsed_s=time.monotonic() - started, original_runs=RunAggregate.of(runs[self.original.name]),
            candidates=reports,
            runs=log, load=_load(every_run), caveat=numerics.CAVEAT,
            real_files_modified=sorted({p for r in every_run for p in r.runner.real_files_modified}),
            original_runtime=first_runtime(runs[self.original.name], findings=True))

    def _candidate_report(self, cand: RunSpec, runs: dict[str, list[RunResult]], ratios: dict[str, list[float]],
                          failed: dict[str, RunResult], metric: dict[str, str], kind: str | None,
                          window: Window) -> CandidateResult:
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
            loss_candidate=b_runs[0].losses if b_runs else None, window=window,
            runtime=first_runtime(runs[cand.name], findings=True))


SLOW_STEP = 5.0  # a step this many times the settled median is still warming up
WARMUP_MARGIN = 10


def slow_steps(durations: list[float]) -> list[int]:
    """The steps of a calibration run that took many times the settled median (lazy init,
    torch.compile and its recompiles, cudnn.benchmark autotuning, an evaluation pass). Durations
    are between consecutive steps, so ``durations[i]`` belongs to step i + 2."""
    if len(durations) < 10:
        return []
    reference = statistics.median(durations[len(durations) // 2:])
    return [i + 2 for i, d in enumerate(durations) if d > SLOW_STEP * reference]


def settled_after(durations: list[float]) -> int:
    """Steps until the run has settled: past the last slow step in the first half of a calibration
    run (one in the second half is the workload, an epoch boundary, not warm-up)."""
    early = [step for step in slow_steps(durations) if step - 2 < len(durations) // 2]
    return early[-1] + WARMUP_MARGIN if early else 0


def quiet_warmup(base: int, steps: int, runs: list[tuple[list[int], int]], latest: int) -> int:
    """The earliest warm-up from ``base`` whose window of ``steps`` holds no slow step of the given
    calibration runs (their slow steps, and how many steps each saw), each slow step at least
    ``WARMUP_MARGIN`` steps before it; ``latest`` (past the last slow warm-up step) if no window the
    runs saw is quiet. A compiled model that recompiles at its first epoch end (a smaller last
    batch, the evaluation pass in eval mode) is so timed inside the first epoch, instead of every
    variant running past that epoch end and its evaluation as warm-up."""
    starts = sorted({base, *(step + WARMUP_MARGIN for slow, _ in runs for step in slow)})
    for start in (w for w in starts if base <= w < latest):
        if all(start + steps <= seen and not any(start - WARMUP_MARGIN < step <= start + steps for step in slow)
               for slow, seen in runs):
            return start
    return max(base, latest)


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
