"""Shared helpers for the benchmark tests: tiny training scripts, a fake fixer, a CLI app.

Everything here is built for speed on a 2-core CPU box: tiny models, windows of a few steps.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import typer

from speedfix.bench.cli import CONTEXT_SETTINGS, bench
from speedfix.bench.results import RunResult
from speedfix.bench.runner import RunSpec
from speedfix.bench.settings import CompareSettings, RunConfig

# A minimal training loop; {before_loop} and {in_loop} are filled per test. Its parameters are
# updated by hand, so backward() is the clock: building a torch.optim optimizer imports Dynamo
# (about 2 s a run on a 2-core box). The optimizer clock has tests of its own (test_bench_harness).
TRAIN = """\
import os, sys, time
import torch

{before_loop}
model = torch.nn.Linear(8, 1)
x, y = torch.randn(64, 8), torch.randn(64, 1)
for step in range(STEPS):
    loss = torch.nn.functional.mse_loss(model(x), y)
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= LR * p.grad
{in_loop}
"""


def training_script(before_loop: str = "", in_loop: str = "", *, lr: float = 0.05, steps: int = 100_000) -> str:
    head = f"LR = {lr}\nSTEPS = {steps}\n" + textwrap.dedent(before_loop)
    return TRAIN.format(before_loop=head, in_loop=textwrap.indent(textwrap.dedent(in_loop), "    "))


@pytest.fixture
def tmp_path(tmp_path: Path) -> Path:
    """pytest's folder for the test, two levels down: a run mirrors the two levels above its
    script's folder and working directory as links to their entries, and pytest's own levels hold
    every earlier test's folder (hundreds of links, a second a run, late in a full test run)."""
    folder = tmp_path / "home" / "work"
    folder.mkdir(parents=True)
    return folder


@pytest.fixture
def train_source():
    """train_source(before_loop="", in_loop="", lr=0.05, steps=100_000) -> script text."""
    return training_script


@pytest.fixture
def write_script(tmp_path):
    """write_script(name, source, directory=None) -> Path of the written file."""

    def write(name: str, source: str, directory: Path | None = None) -> Path:
        directory = directory or tmp_path
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / name
        path.write_text(textwrap.dedent(source))
        return path

    return write


@pytest.fixture
def quick_config():
    """A tiny window: 3 warm-up + 10 timed steps, short timeouts and graces."""

    def make(**overrides) -> RunConfig:
        base = dict(warmup_steps=3, steps=10, timeout_s=60.0, result_grace_s=2.0, hard_grace_s=5.0)
        base.update(overrides)
        return RunConfig(**base)

    return make


@pytest.fixture
def quick_settings():
    def make(**overrides) -> CompareSettings:
        base = dict(warmup=3, steps=10, max_pairs=2, min_pairs=2, budget_s=300.0, timeout_s=60.0,
                    result_grace_s=2.0, hard_grace_s=5.0)
        base.update(overrides)
        return CompareSettings(**base)

    return make


class FakeRuns:
    """Returns made-up results: throughput per label, optional failures and loss overrides."""

    LOSSES = [2.0 - i * 0.01 for i in range(40)]  # what every run records unless overridden

    def __init__(self, speed: dict[str, float], *, losses: dict[str, list] | None = None,
                 fail: dict[str, str] | None = None, clock=None, total_steps: int | None = None,
                 slow_steps: dict[str, int] | None = None, slow_at: dict[str, list[int]] | None = None,
                 device: str = "cuda") -> None:
        self.speed, self.losses, self.fail = speed, losses or {}, fail or {}
        self.device = device  # a GPU box by default: verify decides GPU-only fixes only there
        self.slow_steps = slow_steps or {}  # label -> how many first steps are 100x slow (compile)
        self.slow_at = slow_at or {}  # label -> later steps that are 100x slow (a recompile at an epoch end)
        self.clock, self.total_steps = clock, total_steps
        self.calls: list[tuple[str, object]] = []

    def __call__(self, spec: RunSpec, config) -> RunResult:
        self.calls.append((spec.name, config))
        if self.clock is not None:
            self.clock[0] += 10.0
        if spec.name in self.fail:
            return RunResult.from_json({"status": self.fail[spec.name], "message": f"{spec.name} broke",
                                        "runner": {"stderr_tail": "Traceback ...\nRuntimeError: broke"}})
        rate = self.speed[spec.name]
        warmup, steps = config.warmup_steps, config.steps
        if config.warmup_s:  # calibration: enough steps to fill the time targets at this rate
            warmup = max(warmup, int(rate * config.warmup_s))
        if config.window_s:
            steps = max(steps, int(rate * config.window_s))
        status = "ok"
        if self.total_steps is not None and warmup + steps > self.total_steps:
            status, steps = "incomplete", max(0, self.total_steps - warmup)
        durations = None
        if config.record_all_steps:
            slow = self.slow_steps.get(spec.name, 0)
            durations = [1.0] * slow + [0.01] * (warmup + steps - 1 - slow)
            for step in self.slow_at.get(spec.name, []):
                if step - 2 < len(durations):
                    durations[step - 2] = 1.0  # durations[i] belongs to step i + 2
        values = list(self.losses.get(spec.name, self.LOSSES))
        if config.seed_offset:
            values = [v * (1 + 0.01 * config.seed_offset) for v in values]
        return RunResult.from_json({
            "status": status, "message": "", "env": {"torch": "fake"}, "device": {"type": self.device},
            "steps": {"warmup": warmup, "observed_primary": self.total_steps or warmup + steps},
            "timing": {"steps_per_s": rate, "steps_timed": steps, "window_s": steps / rate,
                       "step_time_s": {"p10": 0.9 / rate, "median": 1 / rate}, "all_step_s": durations},
            "data": {"samples_per_s": 8 * rate},
            "memory": {"vmhwm_window_kb": 1000, "children_rss_kb": 0},
            "compile": {"compilations": 1 if self.slow_steps.get(spec.name) or self.slow_at.get(spec.name) else 0},
            "loss": {"values": values, "nonfinite": sum(v is None for v in values)},
            "runner": {"wall_s": 1.0}})


@pytest.fixture
def fake_runs():
    """FakeRuns(speed={label: steps/s}, losses=..., fail={label: status}, clock=..., total_steps=...)."""
    return FakeRuns


@dataclass
class FixOutcome:
    code: str
    applied: dict[str, int] = field(default_factory=dict)


class FakeFixer:
    """Stands in for speedfix.fixes.fixer: each rule code is a plain text replacement."""

    def __init__(self, rewrites: dict[str, tuple[str, str]]) -> None:
        self.rewrites = rewrites
        self.written: list[tuple[Path, str]] = []

    def fixable_codes(self, code, *, path, unsafe=True, torch_version=None, select=None, ignore=None):
        return [c for c, (old, _) in self.rewrites.items()
                if old in code and (select is None or c in select) and c not in (ignore or ())]

    def fix_code(self, code, *, path, select, unsafe=True, torch_version=None):
        applied = {}
        for c in select:
            old, new = self.rewrites[c]
            if old in code:
                applied[c] = code.count(old)
                code = code.replace(old, new)
        return FixOutcome(code, applied)

    def write_fixed(self, path, code, *, unchanged_since=None):
        from speedfix.fixes.fixer import write_fixed  # the real write: atomic, checks for a changed file

        write_fixed(path, code, unchanged_since=unchanged_since)
        self.written.append((Path(path), code))


@pytest.fixture
def fake_fixer():
    return FakeFixer


@pytest.fixture
def cli_app():
    """The bench command on a throwaway typer app, as speedfix.cli registers it."""
    app = typer.Typer()
    app.command("bench", context_settings=CONTEXT_SETTINGS)(bench)

    @app.callback()
    def _root() -> None:
        """speedfix (test app)"""

    return app
