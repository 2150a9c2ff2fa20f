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
from dataclasses import asdict, dataclass, replace

from . import numerics
from .runner import RunConfig, RunSpec, run_once
from .stats import MIN_VERDICT_PAIRS, cv, precise_enough, summarize

RunFn = Callable[[RunSpec, RunConfig], dict]


@dataclass
class CompareSettings:
    seed: int = 0
    warmup: int | None = None  # fixed warm-up steps; None: calibrate
    steps: int | None = None  # fixed window steps; None: calibrate
    warmup_s: float = 2.0  # calibration targets (>= 20 steps and >= 2-5 s of warm-up)
    window_s: float = 5.0
    min_warmup_steps: int = 20
    min_steps: int = 20
    max_pairs: int = 10
    min_pairs: int = MIN_VERDICT_PAIRS
    budget_s: float = 900.0
    tolerance: float = 0.05
    seed_band_runs: int = 2
    timeout_s: float = 600.0
    discard: bool = True
    result_grace_s: float = 5.0
    hard_grace_s: float = 20.0

    def run_config(self, **overrides) -> RunConfig:
        base = RunConfig(seed=self.seed, timeout_s=self.timeout_s, result_grace_s=self.result_grace_s,
                         hard_grace_s=self.hard_grace_s)
        return replace(base, **overrides)


class Progress:
    """What a comparison reports while it runs; report.RichProgress draws it."""

    def plan(self, runs: int) -> None:
        """Up to this many more runs are coming."""

    def start(self, description: str) -> None:
        """A run starts."""

    def finish(self, result: dict) -> None:
        """The run that started last has ended."""


class ComparisonError(RuntimeError):
    """The original script cannot be benchmarked; ``result`` is its failed run."""

    def __init__(self, message: str, result: dict) -> None:
        super().__init__(message)
        self.result = result


def peak_memory(result: dict) -> tuple[float | None, str]:
    """Peak memory in the window: CUDA max allocated, else process + worker RSS (bytes)."""
    mem = result.get("memory") or {}
    if mem.get("cuda_max_allocated_window"):
        return float(mem["cuda_max_allocated_window"]), "cuda max allocated"
    if mem.get("vmhwm_window_kb"):
        return 1024.0 * (mem["vmhwm_window_kb"] + mem.get("children_rss_kb", 0)), "RSS (process + workers)"
    return None, ""


def run_summary(result: dict) -> dict:
    """The figures a report needs from one run."""
    timing, data, loss = result.get("timing") or {}, result.get("data") or {}, result.get("loss") or {}
    step = timing.get("step_time_s") or {}
    values = [v for v in loss.get("values") or [] if v is not None]
    peak, peak_kind = peak_memory(result)
    return {"status": result.get("status"), "message": result.get("message"),
            "steps_per_s": timing.get("steps_per_s"), "samples_per_s": data.get("samples_per_s"),
            "window_s": timing.get("window_s"), "steps_timed": timing.get("steps_timed"),
            "step_p10_s": step.get("p10"), "step_median_s": step.get("median"),
            "data_wait_fraction": data.get("data_wait_fraction"), "peak_bytes": peak, "peak_kind": peak_kind,
            "harness_share": timing.get("harness_share"), "compile_s": (result.get("compile") or {}).get("seconds"),
            "loss_first": values[0] if values else None, "loss_last": values[-1] if values else None,
            "nonfinite": loss.get("nonfinite"), "grad_scaler_skipped_steps": loss.get("grad_scaler_skipped_steps"),
            "wall_s": (result.get("runner") or {}).get("wall_s")}


def failure(result: dict) -> dict:
    runner = result.get("runner") or {}
    exc = result.get("exception") or {}
    return {"status": result.get("status"), "message": result.get("message"),
            "exception": exc.get("type"), "stderr_tail": runner.get("stderr_tail", "")[-2000:]}


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


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
        self.calibration: dict | None = None
        self.prepared = False
        self.calibration_failures: dict[str, dict] = {}
        self.a_losses: list[list] = []  # every timed run of the original, for the A/A baseline
        self._band: dict | None = None
        self.env: dict = {}  # interpreter, torch and device of the original's first good run
        self.device: dict = {}

    # ------------------------------------------------------------ plumbing
    def _run(self, spec: RunSpec, config: RunConfig, what: str) -> dict:
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
            if result["status"] not in ("ok", "incomplete"):
                raise ComparisonError(f"the original script failed: {result.get('message')}", result)
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
        status = result["status"]
        if status not in ("ok", "incomplete") or _observed(result) < 4:
            raise ComparisonError(f"the original script could not be calibrated ({status}): "
                                  f"{result.get('message')}", result)
        needed = {self.original.name: _needed_warmup(result)}
        # the largest window any variant filled: one calibration run caught in a busy phase of the
        # machine must not shrink every later window
        window = [result["timing"]["steps_timed"]] if status == "ok" else []
        limits = [_observed(result)] if status == "incomplete" else []
        for cand in candidates:
            res = self._run(cand, config, "calibration run")
            if res["status"] not in ("ok", "incomplete") or _observed(res) < 4:
                self.calibration_failures[cand.name] = res
                continue
            needed[cand.name] = _needed_warmup(res)
            if res["status"] == "ok":
                window.append(res["timing"]["steps_timed"])
            if res["status"] == "incomplete":
                limits.append(_observed(res))
        warmup = self.warmup or max(needed.values())
        steps = self.steps or (max(window) if window and status == "ok" else None)
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
        self.calibration = {"status": status, "steps_per_s": (result.get("timing") or {}).get("steps_per_s"),
                            "observed_steps": _observed(result), "warmup": self.warmup, "steps": self.steps,
                            "warmup_needed": needed, "wall_s": (result.get("runner") or {}).get("wall_s"),
                            "note": note}

    def seed_band(self) -> dict:
        """The original with other seeds (lazy, measured once per session)."""
        if self._band is None:
            others = []
            self.progress.plan(self.settings.seed_band_runs)
            for offset in range(1, self.settings.seed_band_runs + 1):
                result = self._run(self.original, self.timed_config(seed_offset=offset), f"seed band (seed +{offset})")
                if result["status"] == "ok":
                    others.append(numerics.losses(result))
            reference = self.a_losses[0] if self.a_losses else []
            self._band = numerics.seed_band(reference, others)
        return self._band

    def compare(self, candidates: list[RunSpec], *, kinds: dict[str, str] | None = None,
                budget_s: float | None = None) -> dict:
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
        runs: dict[str, list[dict]] = {v.name: [] for v in variants}
        failed = {c.name: self.calibration_failures[c.name] for c in candidates if c.name in self.calibration_failures}
        ratios: dict[str, list[float]] = {c.name: [] for c in candidates}
        metric: dict[str, str] = {}
        log: list[dict] = []
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
            this_round: dict[str, dict] = {}
            for position, spec in enumerate(order):
                result = self._run(spec, config, f"pair {rnd + 1}/{max_rounds}, run {position + 1}/{len(order)}")
                this_round[spec.name] = result
                runs[spec.name].append(result)
                log.append({"round": rnd, "position": position, "label": spec.name, **run_summary(result)})
            round_times.append(time.monotonic() - t0)
            base = this_round[self.original.name]
            if base["status"] != "ok":
                raise ComparisonError(f"the original script failed in pair {rnd + 1} ({base['status']}): "
                                      f"{base.get('message')}", base)
            self.a_losses.append(numerics.losses(base))
            if not self.env:
                self.env, self.device = base.get("env") or {}, base.get("device") or {}
            for cand in live:
                res = this_round[cand.name]
                if res["status"] != "ok":
                    failed[cand.name] = res
                    continue
                key = metric.setdefault(cand.name, _metric(base, res))
                ratios[cand.name].append(_rate(res, key) / _rate(base, key))
        # Unused planned runs must not linger in the progress total.
        self.progress.plan(-(max_rounds * len(variants) - sum(len(r) for r in runs.values())))
        outcome = {
            "schema": "speedfix.bench.compare/0.1",
            "original": {"script": str(self.original.script), "args": list(self.original.args),
                         "label": self.original.name},
            "env": self.env, "device": self.device, "settings": asdict(s), "window": {"warmup": self.warmup, "steps": self.steps},
            "calibration": self.calibration, "pairs": len(round_times), "stop_reason": stop_reason,
            "elapsed_s": time.monotonic() - started,
            "original_runs": _aggregate(runs[self.original.name]),
            "candidates": [self._candidate_report(c, runs, ratios, failed, metric, (kinds or {}).get(c.name))
                           for c in candidates],
            "runs": log, "load": _load([r for rs in runs.values() for r in rs]), "caveat": numerics.CAVEAT,
            "real_files_modified": sorted({p for rs in runs.values() for r in rs
                                           for p in (r.get("runner") or {}).get("real_files_modified") or []}),
        }
        return outcome

    def _candidate_report(self, cand: RunSpec, runs: dict, ratios: dict, failed: dict, metric: dict,
                          kind: str | None) -> dict:
        a_runs, b_runs = runs[self.original.name], [r for r in runs[cand.name] if r["status"] == "ok"]
        report = {"label": cand.name, "script": str(cand.script), "status": "ok", "kind": kind or numerics.AUTO,
                  "metric": metric.get(cand.name), "runs": _aggregate(runs[cand.name])}
        if cand.name in failed:
            report["status"] = failed[cand.name]["status"]
            report["failure"] = failure(failed[cand.name])
        pair_ratios = ratios[cand.name]
        if pair_ratios:
            summary = summarize(pair_ratios)
            report["speedup"] = {**summary.as_dict(), "per_pair": pair_ratios,
                                 "p10_step_time_ratio": _time_ratio(a_runs, b_runs, "p10"),
                                 "median_step_time_ratio": _time_ratio(a_runs, b_runs, "median"),
                                 "cv_a": cv([r["timing"]["steps_per_s"] for r in a_runs if r["status"] == "ok"]),
                                 "cv_b": cv([r["timing"]["steps_per_s"] for r in b_runs])}
            peak_a = _median([peak_memory(r)[0] for r in a_runs])
            peak_b = _median([peak_memory(r)[0] for r in b_runs])
            report["memory"] = {"peak_a_bytes": peak_a, "peak_b_bytes": peak_b,
                                "ratio": peak_b / peak_a if peak_a and peak_b else None,
                                "kind": peak_memory(a_runs[0])[1] if a_runs else ""}
        if b_runs:
            report["numerics"] = numerics.check(self.a_losses, numerics.losses(b_runs[0]),
                                                kind=kind or numerics.AUTO, band=self.seed_band)
            report["loss_original"] = self.a_losses[0] if self.a_losses else []
            report["loss_candidate"] = numerics.losses(b_runs[0])
        return report


def _observed(result: dict) -> int:
    return (result.get("steps") or {}).get("observed_primary") or 0


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


def _needed_warmup(result: dict) -> int:
    """The warm-up a variant needs: its time-based warm-up, or longer if it was still settling."""
    timed = (result.get("steps") or {}).get("warmup") or 0
    return max(timed, settled_after((result.get("timing") or {}).get("all_step_s") or []))


def _metric(a: dict, b: dict) -> str:
    """samples/s when both runs know their batch size (an expert version may change it)."""
    if (a.get("data") or {}).get("samples_per_s") and (b.get("data") or {}).get("samples_per_s"):
        return "samples_per_s"
    return "steps_per_s"


def _rate(result: dict, key: str) -> float:
    return result["timing" if key == "steps_per_s" else "data"][key]


def _time_ratio(a_runs: list[dict], b_runs: list[dict], key: str) -> float | None:
    """Cross-check estimator: median A step time over median B step time (>1: B faster)."""
    a = _median([(r.get("timing") or {}).get("step_time_s", {}).get(key) for r in a_runs if r["status"] == "ok"])
    b = _median([(r.get("timing") or {}).get("step_time_s", {}).get(key) for r in b_runs])
    return a / b if a and b else None


def _load(results: list[dict]) -> dict:
    """The highest 1-minute load average seen around the runs, against the CPU count."""
    loads = [v for r in results for v in (r.get("runner") or {}).get("loadavg") or []]
    return {"max_loadavg": max(loads) if loads else None, "cpus": os.cpu_count()}


def _aggregate(results: list[dict]) -> dict:
    ok = [run_summary(r) for r in results if r["status"] == "ok"]
    agg = {"runs": len(results), "ok": len(ok)}
    for key in ("steps_per_s", "samples_per_s", "data_wait_fraction", "peak_bytes", "window_s",
                "loss_last", "grad_scaler_skipped_steps"):
        agg[key] = _median([s[key] for s in ok])
    return agg
