"""How one run is measured (``RunConfig``) and how a comparison runs (``CompareSettings``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

from .stats import MIN_VERDICT_PAIRS


@dataclass
class RunConfig:
    """How long to warm up and measure. Steps and seconds are both minimums."""

    warmup_steps: int = 20
    warmup_s: float = 0.0
    steps: int = 50
    window_s: float = 0.0
    seed: int = 0
    seed_offset: int = 0
    record_all_steps: bool = False  # also every warm-up step's duration (calibration)
    timeout_s: float = 600.0
    result_grace_s: float = 5.0  # after the result appears: time for the script to unwind
    hard_grace_s: float = 20.0  # past timeout_s: for a child whose watchdog cannot run
    python: str = sys.executable


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
    discard: bool = True  # with a fixed window (no calibration run to warm the caches)
    # after the result appears: time for the script to unwind. Only where it runs in the real
    # working directory (what it writes there stays); in a scratch mirror it is stopped at once.
    result_grace_s: float = 5.0
    hard_grace_s: float = 20.0

    def run_config(self, **overrides) -> RunConfig:
        base = RunConfig(seed=self.seed, timeout_s=self.timeout_s, result_grace_s=self.result_grace_s,
                         hard_grace_s=self.hard_grace_s)
        return replace(base, **overrides)
