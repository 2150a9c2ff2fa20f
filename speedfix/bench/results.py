"""Typed results of the benchmark: one run, one comparison, one verify, one suite.

The bench modules pass these records between them instead of dicts. Each reads the JSON it
stands for with ``from_json`` (what ``child.py`` writes, or a saved report) and writes it back
with ``to_json``: the keys and values of ``speedfix bench --json`` and ``speedfix apply --verify``
reports are a public format, and a record's JSON is exactly what the modules wrote before they
were typed. The JSON key of a field is its name; fields are in the order of the keys.

``child.py`` runs inside the user's process and imports none of this: it writes plain JSON.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from enum import Enum
from typing import Any, TypeVar

from .settings import CompareSettings
from .stats import INCONCLUSIVE, SpeedupSummary

RUN_SCHEMA = "speedfix.bench/0.1"
COMPARE_SCHEMA = "speedfix.bench.compare/0.1"
VERIFY_SCHEMA = "speedfix.verify/0.1"
SUITE_SCHEMA = "speedfix.suite/0.1"

OK, INCOMPLETE = "ok", "incomplete"  # the run statuses that measured something (child.py writes them)
STEPS_PER_S, SAMPLES_PER_S = "steps_per_s", "samples_per_s"  # the speedup metrics

R = TypeVar("R", bound="Record")

# field metadata
_PARSE = "parse"  # JSON value (not null) -> field value
_OMIT_NONE = "omit_none"  # None: the key is not written
_NONE_AS = "none_as"  # None: written as this (a fresh copy)
_INTERNAL = "internal"  # not in the JSON


def _json(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, Enum):
        return value.value
    if is_dataclass(value) and not isinstance(value, type):  # CompareSettings
        return asdict(value)
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    return value


class Record:
    """Base of the records: the JSON mapping of a dataclass's fields."""

    @classmethod
    def from_json(cls: type[R], data: Mapping[str, Any]) -> R:
        """Missing keys take the field's default (older or hand-made results); unknown keys are ignored."""
        values = {}
        for f in fields(cls):  # type: ignore[arg-type]
            if f.name in data and not f.metadata.get(_INTERNAL):
                value, parse = data[f.name], f.metadata.get(_PARSE)
                values[f.name] = parse(value) if parse is not None and value is not None else value
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.metadata.get(_INTERNAL) or (value is None and f.metadata.get(_OMIT_NONE)):
                continue
            if value is None and _NONE_AS in f.metadata:
                out[f.name] = _json(f.metadata[_NONE_AS])
            else:
                out[f.name] = _json(value)
        return out


def _nested(cls: type[Record]) -> Any:
    """A section that is always there (empty when the JSON lacks it)."""
    return field(default_factory=cls, metadata={_PARSE: cls.from_json})


def _optional(cls: type[Record], *, omit: bool = False, empty: bool = False) -> Any:
    """A section that may be missing: None is not written (``omit``) or written as ``{}`` (``empty``,
    and ``{}`` reads as None)."""
    meta: dict[str, Any] = {_PARSE: (lambda d: cls.from_json(d) if d else None) if empty else cls.from_json}
    if omit:
        meta[_OMIT_NONE] = True
    if empty:
        meta[_NONE_AS] = {}
    return field(default=None, metadata=meta)


def _records(cls: type[Record]) -> Any:
    return field(default_factory=list, metadata={_PARSE: lambda items: [cls.from_json(i) for i in items]})


def _items() -> Any:
    return field(default_factory=list)


def _omitted() -> Any:
    return field(default=None, metadata={_OMIT_NONE: True})


def median_or_none(values: list[float | None]) -> float | None:
    """The median of the values that are not None (None: there are none)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


# ---------------------------------------------------------------- one run (child.py's JSON + the runner's)

@dataclass(frozen=True)
class Env(Record):
    python: str | None = None
    torch: str | None = None
    cuda_available: bool | None = None
    torch_num_threads: int | None = None
    cpu_count: int | None = None


@dataclass(frozen=True)
class Device(Record):
    """The device and dtype of the clock optimizer's first parameter (None before any step)."""

    type: str | None = None
    param_dtype: str | None = None
    index: int | None = None  # written once the device is known (None on a CPU)
    name: str | None = None  # the GPU (torch.cuda.get_device_name); None off CUDA
    driver_version: str | None = None  # the NVIDIA driver's
    cuda_version: str | None = None  # torch.version.cuda

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        if self.type is None:  # no step yet: child.py has not read a tensor's device
            del out["index"]
        return out

    def describe(self) -> str:
        """``cuda:0 NVIDIA H100 80GB HBM3 (driver 580.159.04, CUDA 13.0)``, ``cpu``, ``?``."""
        text = self.type or "?"
        if self.index is not None:
            text += f":{self.index}"
        if self.name:
            versions = [f"driver {self.driver_version}" if self.driver_version else "",
                        f"CUDA {self.cuda_version}" if self.cuda_version else ""]
            extra = ", ".join(v for v in versions if v)
            text += f" {self.name}" + (f" ({extra})" if extra else "")
        return text


@dataclass(frozen=True)
class CompileInfo(Record):
    """torch.compile's work in the run, seen through Dynamo's callbacks."""

    watched: bool | None = None
    compilations: int | None = None
    seconds: float | None = None
    in_window: int | None = None
    settled: bool | None = None  # False: still compiling when the window opened
    # each compilation inside the window threw it away: at_step, compilations, window_steps_dropped
    window_restarts: list[dict[str, int]] = _items()


@dataclass(frozen=True)
class Steps(Record):
    warmup: int | None = None  # the warm-up the run used (None: the window never opened)
    warmup_requested: int | None = None
    warmup_s_requested: float | None = None
    requested: int | None = None
    window_s_requested: float | None = None
    observed_primary: int | None = None  # steps of the clock optimizer
    optimizers: int | None = None
    per_optimizer: list[int] = _items()


@dataclass(frozen=True)
class Wall(Record):
    startup_to_first_step_s: float | None = None
    total_s: float | None = None


@dataclass(frozen=True)
class StepTimes(Record):
    mean: float | None = None
    median: float | None = None
    p10: float | None = None
    p90: float | None = None
    min: float | None = None
    max: float | None = None


@dataclass(frozen=True)
class Timing(Record):
    window_complete: bool | None = None
    steps_timed: int | None = None
    window_s: float | None = None
    steps_per_s: float | None = None
    step_time_s: StepTimes | None = _optional(StepTimes, empty=True)  # None: no timed step
    per_step_s: list[float] = _items()
    all_step_s: list[float] | None = None  # every step's duration (calibration runs)
    cpu_s: float | None = None
    warmup_s: float | None = None
    synchronized: bool | None = None
    harness_self_s: float | None = None
    harness_share: float | None = None


@dataclass(frozen=True)
class DataStats(Record):
    batch_size: int | None = None
    batch_size_source: str | None = None
    first_batch: list[Any] = _items()
    batches_in_window: int | None = None
    samples_in_window: int | None = None
    samples_per_s: float | None = None
    samples_per_step: float | None = None
    data_wait_s: float | None = None
    data_wait_fraction: float | None = None
    batches_fetched_total: int | None = None
    batches_fetched_no_grad: int | None = None


@dataclass(frozen=True)
class Memory(Record):
    vmhwm_window_kb: int | None = None
    ru_maxrss_kb: int | None = None
    children_rss_kb: int | None = None
    children: int | None = None
    cuda_max_allocated_window: int | None = None
    cuda_max_reserved_window: int | None = None


@dataclass(frozen=True)
class BetweenEpochs(Record):
    """The time from the end of an epoch (its training iterator ran out) to the next one's start,
    left out of the clock: evaluation, checkpoints, the recompiles they cause."""

    after_epoch: int = 0
    seconds: float = 0.0
    phase: str = ""  # warmup, window
    at_step: int = 0  # steps done when training went on
    compilations: int = 0


@dataclass(frozen=True)
class Epochs(Record):
    detected_by: str | None = None  # "dataloader": the training iterator's end; None: no DataLoader
    ended: int = 0
    between: list[BetweenEpochs] = _records(BetweenEpochs)
    between_in_window_s: float = 0.0


@dataclass(frozen=True)
class RefusedWrite(Record):
    event: str = ""  # the audit event: open, os.remove, os.rename, ...
    path: str = ""  # where it would have landed (links resolved)
    pid: int | None = None


@dataclass(frozen=True)
class GuardInfo(Record):
    """The write guard of the run (guard.py): active when the script ran in a scratch mirror."""

    active: bool = False
    refusals: int = 0
    refused: list[RefusedWrite] = _records(RefusedWrite)


@dataclass(frozen=True)
class LossTrace(Record):
    source: str | None = None
    values: list[float | None] = _items()  # one per backward(); NaN/inf as None
    step_index: list[int] = _items()
    backward_calls: int | None = None
    nonscalar_backward_calls: int | None = None
    nonfinite: int | None = None
    grad_scaler_seen: bool | None = None
    grad_scaler_step_calls: int | None = None
    grad_scaler_skipped_steps: int | None = None


@dataclass(frozen=True)
class ExceptionInfo(Record):
    type: str | None = None
    message: str | None = None
    traceback: str | None = None


_STARTED_ONLY = ("wall_s", "loadavg", "supervised", "scratch_cwd", "real_files_modified")


@dataclass(frozen=True)
class RunnerInfo(Record):
    """What the parent saw of the child process. A run that never started (its scratch folder
    could not be made) has no wall time, load, supervisor or mirror: those keys are left out."""

    returncode: int | None = None
    wall_s: float | None = None
    killed: str | None = None  # after_result_grace, hard_timeout
    loadavg: list[float] = _items()  # 1-minute load average before and after the run
    leftover_processes_at_exit: list[int] = _items()
    run_id: str | None = None
    supervised: bool | None = None
    scratch_cwd: str | None = None
    real_files_modified: list[str] = _items()
    stdout_tail: str = ""
    stderr_tail: str = ""

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        if self.wall_s is None:
            for key in _STARTED_ONLY:
                del out[key]
        return out


# ---------------------------------------------------------------- what the script configured (facts.py)

@dataclass(frozen=True)
class Site(Record):
    """The line of user code that made an object (None: only library code did); ``via``: the
    framework's line that made it for the script (a Trainer's DataLoader)."""

    file: str | None = None
    line: int | None = None
    via: str | None = None

    def where(self, root: str | None = None) -> str:
        """``data.py:7`` (relative to ``root`` where it is inside), or ``?``."""
        if not self.file:
            return "?"
        path = self.file
        if root and path.startswith(root.rstrip("/") + "/"):
            path = path[len(root.rstrip("/")) + 1:]
        return f"{path}:{self.line}" if self.line else path


@dataclass(frozen=True)
class LoaderFacts(Site):
    """A DataLoader as the script made it; the settings of the training loader are read again
    when the window opens (a script may set them after the call)."""

    type: str = ""
    dataset: str = ""
    iterable_dataset: bool = False
    trained_on: bool = False  # the steps of the window trained on its batches
    epochs: int = 0  # times it was iterated
    num_workers: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None
    batch_size: int | None = None


@dataclass(frozen=True)
class OptimizerFacts(Site):
    type: str = ""
    fused: bool | None = None
    foreach: bool | None = None
    differentiable: bool | None = None
    capturable: bool | None = None
    param_device: str | None = None
    param_dtype: str | None = None


@dataclass(frozen=True)
class CompileCall(Site):
    target: str = ""  # the module class or function compiled
    method: bool = False  # Module.compile() (in place)
    mode: str | None = None
    backend: str | None = None
    fullgraph: bool = False
    dynamic: bool | None = None


@dataclass(frozen=True)
class ModelFacts(Record):
    """The model the first training forward called."""

    type: str = ""
    compiled: bool = False
    wrapper: str | None = _omitted()  # DistributedDataParallel, FullyShardedDataParallel, DataParallel, DeepSpeedEngine
    ddp: dict[str, Any] | None = _omitted()
    fsdp: dict[str, Any] | None = _omitted()
    inner_type: str = ""
    parameters: int | None = None
    conv: bool | None = None
    gradient_checkpointing: bool | None = _omitted()  # Hugging Face's is_gradient_checkpointing
    seen_in: str | None = _omitted()  # "evaluation": read at a call with grad disabled (no training call seen)


@dataclass(frozen=True)
class AutocastFacts(Record):
    """The autocast around the first training forward (None: no forward was seen)."""

    enabled: bool = False
    device_type: str | None = _omitted()
    dtype: str | None = _omitted()


@dataclass(frozen=True)
class Flags(Record):
    """Global flags as the window ran with them."""

    float32_matmul_precision: str | None = None
    cuda_matmul_allow_tf32: bool | None = None
    cudnn_allow_tf32: bool | None = None
    cudnn_benchmark: bool | None = None
    cudnn_deterministic: bool | None = None
    deterministic_algorithms: bool | None = None
    anomaly_detection: bool | None = None
    gpu_capability: list[int] | None = None


@dataclass(frozen=True)
class RuntimeFinding(Record):
    """A finding from what the script configured at run time, with the rule code a scan uses.
    ``static``: a scan of ``file`` reports the same code at the same line (or, for a finding
    without a line, in the file): one finding, confirmed at run time. None: not compared."""

    code: str = ""
    name: str = ""
    message: str = ""
    severity: str = "warning"
    impact: str | None = None  # the rule's usual impact (high, medium, low) where the rule declares one
    file: str | None = None
    line: int | None = None
    device: str | None = None  # the device the advice was found on
    static: bool | None = None

    def where(self, root: str | None = None) -> str:
        return Site(self.file, self.line).where(root)


@dataclass(frozen=True)
class RuntimeFacts(Record):
    """What the measured script configured (``runtime`` in a run's JSON)."""

    loaders: list[LoaderFacts] = _records(LoaderFacts)
    optimizers: list[OptimizerFacts] = _records(OptimizerFacts)
    compiled: list[CompileCall] = _records(CompileCall)
    model: ModelFacts | None = _optional(ModelFacts)
    autocast: AutocastFacts | None = _optional(AutocastFacts)
    flags: Flags | None = _optional(Flags)
    frameworks: dict[str, dict[str, Any]] = field(default_factory=dict)  # lightning, transformers, deepspeed, accelerate
    reentrant_checkpoint: bool = False  # a backward ran inside a backward
    errors: list[str] = _items()  # facts that could not be read
    findings: list[RuntimeFinding] = _records(RuntimeFinding)  # added by the parent (advice.py)

    def training_loader(self) -> LoaderFacts | None:
        return next((loader for loader in self.loaders if loader.trained_on), None)


# the keys child.py writes; a result the runner made up for a child that wrote none has none of them
_CHILD_KEYS = ("seed", "seed_offset", "env", "device", "clock", "compile", "steps", "wall", "timing", "data",
               "memory", "epochs", "guard", "loss",
               "runtime")


@dataclass(frozen=True)
class RunResult(Record):
    """One measured child process (schema speedfix.bench/0.1)."""

    schema: str = RUN_SCHEMA
    status: str = ""  # ok, incomplete, error, timeout, no_steps
    message: str | None = None
    script: str = ""
    args: list[str] = _items()
    cwd: str | None = _omitted()  # the folder the script saw (a scratch mirror of it unless real_cwd)
    seed: int | None = None
    seed_offset: int | None = None
    env: Env = _nested(Env)
    device: Device = _nested(Device)
    clock: str | None = None  # optimizer.step, backward
    compile: CompileInfo = _nested(CompileInfo)
    steps: Steps = _nested(Steps)
    wall: Wall = _nested(Wall)
    timing: Timing = _nested(Timing)
    data: DataStats = _nested(DataStats)
    memory: Memory = _nested(Memory)
    epochs: Epochs = _nested(Epochs)
    guard: GuardInfo | None = _optional(GuardInfo)  # None: older results
    loss: LossTrace = _nested(LossTrace)
    runtime: RuntimeFacts | None = _optional(RuntimeFacts, omit=True)  # None: older results
    exception: ExceptionInfo | None = _optional(ExceptionInfo, omit=True)
    runner: RunnerInfo = _nested(RunnerInfo)
    # False: the child wrote no result, the runner made this one up (only the runner's keys are written)
    reported: bool = field(default=True, metadata={_INTERNAL: True})

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunResult:
        return replace(super().from_json(data), reported=any(key in data for key in _CHILD_KEYS))

    @classmethod
    def failed(cls, status: str, message: str, script: str, args: list[str]) -> RunResult:
        """A result for a child that wrote none (it crashed, timed out or never started)."""
        return cls(status=status, message=message, script=script, args=list(args), reported=False)

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        if not self.reported:
            for key in _CHILD_KEYS:
                out.pop(key, None)
        return out

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def measured(self) -> bool:
        """The script stepped: complete (ok) or shorter than the window (incomplete)."""
        return self.status in (OK, INCOMPLETE)

    @property
    def observed_steps(self) -> int:
        return self.steps.observed_primary or 0

    @property
    def losses(self) -> list[float | None]:
        return list(self.loss.values)

    def rate(self, metric: str) -> float | None:
        return self.data.samples_per_s if metric == SAMPLES_PER_S else self.timing.steps_per_s

    def peak_memory(self) -> tuple[float | None, str]:
        """Peak memory in the window: CUDA max allocated, else process + worker RSS (bytes)."""
        mem = self.memory
        if mem.cuda_max_allocated_window:
            return float(mem.cuda_max_allocated_window), "cuda max allocated"
        if mem.vmhwm_window_kb:
            return 1024.0 * (mem.vmhwm_window_kb + (mem.children_rss_kb or 0)), "RSS (process + workers)"
        return None, ""

    def summary(self) -> RunSummary:
        return RunSummary.of(self)

    def failure(self) -> Failure:
        return Failure(self.status, self.message, self.exception.type if self.exception else None,
                       self.runner.stderr_tail[-2000:])


@dataclass(frozen=True)
class RunSummary(Record):
    """The figures a report needs from one run."""

    status: str | None = None
    message: str | None = None
    steps_per_s: float | None = None
    samples_per_s: float | None = None
    window_s: float | None = None
    steps_timed: int | None = None
    step_p10_s: float | None = None
    step_median_s: float | None = None
    data_wait_fraction: float | None = None
    peak_bytes: float | None = None
    peak_kind: str = ""
    harness_share: float | None = None
    compile_s: float | None = None
    loss_first: float | None = None
    loss_last: float | None = None
    nonfinite: int | None = None
    grad_scaler_skipped_steps: int | None = None
    wall_s: float | None = None
    between_epochs_s: float | None = _omitted()  # inside the window, left out of it (None: older reports)
    # where a run's wall time goes besides its window: the child's start (its harness loaded) to the
    # first optimizer step (imports, the script's set-up, CUDA's start), then the warm-up
    startup_s: float | None = _omitted()
    warmup_s: float | None = _omitted()

    @classmethod
    def of(cls, result: RunResult) -> RunSummary:
        timing, data, loss = result.timing, result.data, result.loss
        step = timing.step_time_s or StepTimes()
        values = [v for v in loss.values if v is not None]
        peak, peak_kind = result.peak_memory()
        return cls(status=result.status, message=result.message, steps_per_s=timing.steps_per_s,
                   samples_per_s=data.samples_per_s, window_s=timing.window_s, steps_timed=timing.steps_timed,
                   step_p10_s=step.p10, step_median_s=step.median, data_wait_fraction=data.data_wait_fraction,
                   peak_bytes=peak, peak_kind=peak_kind, harness_share=timing.harness_share,
                   compile_s=result.compile.seconds, loss_first=values[0] if values else None,
                   loss_last=values[-1] if values else None, nonfinite=loss.nonfinite,
                   grad_scaler_skipped_steps=loss.grad_scaler_skipped_steps, wall_s=result.runner.wall_s,
                   between_epochs_s=result.epochs.between_in_window_s if result.reported else None,
                   startup_s=result.wall.startup_to_first_step_s, warmup_s=timing.warmup_s)


@dataclass(frozen=True)
class LoggedRun(Record):
    """One timed run of a comparison, in the order it ran; its summary's keys follow the position."""

    round: int = 0
    position: int = 0
    label: str = ""
    summary: RunSummary = field(default_factory=RunSummary)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LoggedRun:
        return cls(data.get("round", 0), data.get("position", 0), data.get("label", ""), RunSummary.from_json(data))

    def to_json(self) -> dict[str, Any]:
        return {"round": self.round, "position": self.position, "label": self.label, **self.summary.to_json()}


@dataclass(frozen=True)
class Failure(Record):
    """Why a run failed, for a report."""

    status: str | None = None
    message: str | None = None
    exception: str | None = None  # the exception's type name
    stderr_tail: str = ""


# ---------------------------------------------------------------- the loss check (numerics.py)

@dataclass(frozen=True)
class LossDiff(Record):
    """How far loss trajectory b is from trajectory a (position by position, up to the shorter)."""

    compared: int = 0
    length_a: int = 0
    length_b: int = 0
    bitwise: bool = False
    max_rel_diff: float | None = None
    step0_rel_diff: float | None = None
    first_divergent_index: int | None = None
    ema_final_rel_diff: float | None = None
    tail_mean_rel_diff: float | None = None


@dataclass(frozen=True)
class SeedBand(Record):
    """The original's spread across seeds, as thresholds for the smoothed and the tail loss."""

    runs: int = 0
    ema_spread: float = 0.0
    tail_spread: float = 0.0
    ema_threshold: float = 0.0
    tail_threshold: float = 0.0


@dataclass(frozen=True)
class LossCheck(Record):
    """The verdict of the loss check on one candidate. Without a loss to compare ("unchecked")
    there are no trajectories: ``ab`` is None and only kind, level, passed and reason are written."""

    kind: str = "auto"  # exact, numerics, rng, auto
    ab: LossDiff | None = _optional(LossDiff)
    aa: LossDiff | None = _optional(LossDiff)
    seed_band: SeedBand | None = _optional(SeedBand)
    nonfinite_a: int = 0
    nonfinite_b: int = 0
    level: str = "unchecked"
    passed: bool = True
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        if self.ab is None:
            for key in ("ab", "aa", "seed_band", "nonfinite_a", "nonfinite_b"):
                del out[key]
        return out


# ---------------------------------------------------------------- one comparison (compare.py)

@dataclass(frozen=True)
class RunAggregate(Record):
    """Medians over a variant's ok runs."""

    runs: int = 0
    ok: int = 0
    steps_per_s: float | None = None
    samples_per_s: float | None = None
    data_wait_fraction: float | None = None
    peak_bytes: float | None = None
    window_s: float | None = None
    loss_last: float | None = None
    grad_scaler_skipped_steps: float | None = None
    between_epochs_s: float | None = _omitted()  # left out of the window (None: older reports)

    @classmethod
    def of(cls, results: list[RunResult]) -> RunAggregate:
        ok = [r.summary() for r in results if r.ok]
        return cls(runs=len(results), ok=len(ok), steps_per_s=median_or_none([s.steps_per_s for s in ok]),
                   samples_per_s=median_or_none([s.samples_per_s for s in ok]),
                   data_wait_fraction=median_or_none([s.data_wait_fraction for s in ok]),
                   peak_bytes=median_or_none([s.peak_bytes for s in ok]), window_s=median_or_none([s.window_s for s in ok]),
                   loss_last=median_or_none([s.loss_last for s in ok]),
                   grad_scaler_skipped_steps=median_or_none([s.grad_scaler_skipped_steps for s in ok]),
                   between_epochs_s=median_or_none([s.between_epochs_s for s in ok]))

    def rate(self, metric: str) -> float | None:
        """The median throughput in ``metric``, or in steps/s where that is unknown."""
        return (self.samples_per_s if metric == SAMPLES_PER_S else self.steps_per_s) or self.steps_per_s


def _interval(ends: list[float | None]) -> tuple[float, float]:
    lo, hi = ends
    return (0.0 if lo is None else lo, math.inf if hi is None else hi)  # JSON reports write inf as null


@dataclass(frozen=True)
class Speedup(Record):
    """The speedup of a candidate over the original: median of the per-pair ratios (B/A) and its
    95% distribution-free interval (``(0, inf)``: too few pairs for one)."""

    pairs: int = 0
    median: float = 1.0
    ci95_median: tuple[float, float] = field(default=(0.0, math.inf), metadata={_PARSE: _interval})
    min: float | None = None
    max: float | None = None
    verdict: str = INCONCLUSIVE
    per_pair: list[float] = _items()
    p10_step_time_ratio: float | None = None
    median_step_time_ratio: float | None = None
    cv_a: float | None = None
    cv_b: float | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Speedup:
        if "pairs" not in data:  # older reports: one ratio per pair
            data = {**data, "pairs": len(data.get("per_pair") or ())}
        return super().from_json(data)

    @classmethod
    def of(cls, summary: SpeedupSummary, per_pair: list[float], **cross_checks: float | None) -> Speedup:
        return cls(pairs=summary.n, median=summary.median, ci95_median=(summary.lo, summary.hi), min=summary.min,
                   max=summary.max, verdict=summary.verdict, per_pair=list(per_pair), **cross_checks)

    @property
    def lo(self) -> float:
        return self.ci95_median[0]

    @property
    def hi(self) -> float:
        return self.ci95_median[1]


@dataclass(frozen=True)
class MemoryChange(Record):
    peak_a_bytes: float | None = None
    peak_b_bytes: float | None = None
    ratio: float | None = None  # B over A
    kind: str = ""


@dataclass(frozen=True)
class Window(Record):
    warmup: int | None = None
    steps: int | None = None


@dataclass(frozen=True)
class CandidateResult(Record):
    """One candidate against the original: status, speedup, memory, loss check."""

    label: str = ""
    script: str = ""
    status: str = OK
    kind: str = "auto"  # the loss check's class
    metric: str | None = None  # samples_per_s or steps_per_s
    runs: RunAggregate = _nested(RunAggregate)
    failure: Failure | None = _optional(Failure, omit=True)
    speedup: Speedup | None = _optional(Speedup, omit=True)
    memory: MemoryChange | None = _optional(MemoryChange, omit=True)
    numerics: LossCheck | None = _optional(LossCheck, omit=True)
    loss_original: list[float | None] | None = _omitted()
    loss_candidate: list[float | None] | None = _omitted()
    window: Window | None = _optional(Window, omit=True)  # the comparison's warm-up and timed steps
    runtime: RuntimeFacts | None = _optional(RuntimeFacts, omit=True)  # what its first measured run configured


@dataclass(frozen=True)
class Calibration(Record):
    status: str | None = None
    steps_per_s: float | None = None
    observed_steps: int = 0
    warmup: int | None = None
    steps: int | None = None
    warmup_needed: dict[str, int] = field(default_factory=dict)  # per variant label
    wall_s: float | None = None
    note: str | None = None  # the window was shortened for a short script


@dataclass(frozen=True)
class Load(Record):
    """The highest 1-minute load average seen around the runs, against the CPU count."""

    max_loadavg: float | None = None
    cpus: int | None = None


@dataclass(frozen=True)
class ScriptRef(Record):
    script: str = ""
    args: list[str] = _items()
    label: str = ""


def _settings(data: Mapping[str, Any]) -> CompareSettings:
    known = {f.name for f in fields(CompareSettings)}
    return CompareSettings(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Comparison(Record):
    """An original and its candidates in counterbalanced rounds (schema speedfix.bench.compare/0.1)."""

    schema: str = COMPARE_SCHEMA
    original: ScriptRef = _nested(ScriptRef)
    env: Env | None = _optional(Env, empty=True)  # of the original's first good run; {}: none
    device: Device | None = _optional(Device, empty=True)
    settings: CompareSettings | None = field(default=None, metadata={_PARSE: _settings})
    window: Window = _nested(Window)
    calibration: Calibration | None = _optional(Calibration)  # None: the window was given
    pairs: int = 0
    stop_reason: str = ""
    elapsed_s: float = 0.0
    original_runs: RunAggregate = _nested(RunAggregate)
    candidates: list[CandidateResult] = _records(CandidateResult)
    runs: list[LoggedRun] = _records(LoggedRun)
    load: Load = _nested(Load)
    caveat: str = ""
    real_files_modified: list[str] = _items()
    # what the original's first measured run configured, with its run-time findings
    original_runtime: RuntimeFacts | None = _optional(RuntimeFacts, omit=True)

    def candidate(self, label: str) -> CandidateResult | None:
        return next((c for c in self.candidates if c.label == label), None)


# ---------------------------------------------------------------- apply --verify (verify.py)

class Decision(Enum):
    """What verify did with one fix (or one combination of fixes)."""

    KEPT = "kept"
    REJECTED = "rejected"
    UNMEASURED = "not measured enough"
    NEEDS_GPU = "needs a GPU to verify"
    SKIPPED = "skipped"  # the fix changed nothing in this script


@dataclass(frozen=True)
class FixDecision(Record):
    """The measurement of one fix (or, with ``codes``, of several together) and the decision."""

    label: str = ""
    kept: bool = False
    decision: Decision = field(default=Decision.REJECTED, metadata={_PARSE: Decision})
    measured: bool = False
    reason: str = ""
    applied: dict[str, int] = field(default_factory=dict)  # rule code -> fixes applied
    metric: str | None = None
    speedup: Speedup | None = _optional(Speedup)
    numerics: LossCheck | None = _optional(LossCheck)
    memory: MemoryChange | None = _optional(MemoryChange)
    failure: Failure | None = _optional(Failure)
    codes: list[str] | None = _omitted()  # a combination's fixes
    measured_as: str | None = _omitted()  # the figures are those of this set of fixes (not the fix alone)
    window: Window | None = _optional(Window, omit=True)  # the warm-up and timed steps it was measured over

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FixDecision:
        if "decision" not in data:  # older reports: kept or not
            data = {**data, "decision": (Decision.KEPT if data.get("kept") else Decision.REJECTED).value}
        return super().from_json(data)

    @classmethod
    def skipped(cls, label: str, reason: str) -> FixDecision:
        return cls(label, kept=False, decision=Decision.SKIPPED, reason=reason)

    @classmethod
    def of(cls, cand: CandidateResult, decision: Decision, reason: str, applied: dict[str, int],
           codes: list[str] | None = None) -> FixDecision:
        return cls(cand.label, kept=decision is Decision.KEPT, decision=decision,
                   measured=decision is not Decision.UNMEASURED, reason=reason, applied=dict(applied),
                   metric=cand.metric, speedup=cand.speedup, numerics=cand.numerics, memory=cand.memory,
                   failure=cand.failure, codes=codes, window=cand.window)

    def to_json(self) -> dict[str, Any]:
        if self.decision is Decision.SKIPPED:
            return {"label": self.label, "kept": self.kept, "decision": self.decision.value, "skipped": True,
                    "reason": self.reason}
        return super().to_json()


@dataclass(frozen=True)
class VerifyReport(Record):
    """``speedfix apply --verify``'s report (schema speedfix.verify/0.1)."""

    schema: str = VERIFY_SCHEMA
    script: str = ""
    args: list[str] = _items()
    date: str = ""
    seed: int = 0
    torch: str = "?"
    device: str = "?"
    verified_on: str = "?"
    window: Window = _nested(Window)
    calibration: Calibration | None = _optional(Calibration)
    fixes: list[FixDecision] = _records(FixDecision)
    combinations: list[FixDecision] = _records(FixDecision)
    kept: list[str] = _items()
    written: bool = False
    summary: str = ""
    load: Load = _nested(Load)
    caveat: str = ""
    comparison: Comparison = _nested(Comparison)  # the first comparison (the combination, or the single fixes)
    mode: str = ""  # "combination first" or "per-fix"

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        del out["comparison"]["candidates"]
        return out

    def with_decision(self, decision: Decision) -> list[FixDecision]:
        return [f for f in self.fixes if f.decision is decision]


@dataclass(frozen=True)
class VerifyFailure(Record):
    """The report when the original script cannot be benchmarked."""

    schema: str = VERIFY_SCHEMA
    script: str = ""
    args: list[str] = _items()
    error: str = ""
    failure: Failure = _nested(Failure)
    fixes: list[FixDecision] = _records(FixDecision)
    kept: list[str] = _items()
    written: bool = False


# ---------------------------------------------------------------- the suite (suite.py)

def _failures(data: Mapping[str, Any]) -> dict[str, Failure] | None:
    return {label: Failure.from_json(f) for label, f in data.items()} or None


@dataclass(frozen=True)
class SuiteRow(Record):
    """One workload: original vs speedfix's fixes vs an expert version. A workload whose original
    cannot run has ``error`` and ``failure`` (its stderr tail) instead of the figures."""

    name: str = ""
    kind: str = ""
    description: str = ""
    script: str = ""
    expert_script: str | None = None
    args: list[str] = _items()
    fixes: list[str] = _items()
    applied: dict[str, int] | None = _omitted()  # None: no fix applied
    error: str | None = _omitted()
    failure: str | None = _omitted()
    metric: str | None = None
    window: Window | None = _optional(Window)
    pairs: int | None = None
    before: float | None = None
    after: float | None = None
    speedup: Speedup | None = _optional(Speedup)
    expert: float | None = None
    expert_speedup: Speedup | None = _optional(Speedup)
    loss_check: str = ""
    expert_loss_check: str = ""
    peak_before: float | None = None
    peak_after: float | None = None
    captured: float | None = None
    load: Load | None = _optional(Load)
    comparison: Comparison | None = _optional(Comparison)
    failures: dict[str, Failure] | None = field(default=None, metadata={_PARSE: _failures, _OMIT_NONE: True})

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        if self.error is None:
            return out
        return {k: out[k] for k in _ERROR_ROW if k in out}

    @property
    def loss_check_failed(self) -> bool:
        """The speedfix variant ran and its loss check failed."""
        fixed = self.comparison.candidate("speedfix") if self.comparison else None
        return bool(fixed and fixed.failure is None and fixed.numerics and not fixed.numerics.passed)


_ERROR_ROW = ("name", "kind", "description", "script", "expert_script", "args", "fixes", "applied", "error", "failure")


@dataclass(frozen=True)
class SuiteResult(Record):
    """``speedfix bench --suite``'s result (schema speedfix.suite/0.1)."""

    schema: str = SUITE_SCHEMA
    size: str = "tiny"
    device: str = "cpu"
    torch: str = "?"
    cuda_available: bool = False
    settings: CompareSettings | None = field(default=None, metadata={_PARSE: _settings})
    load: Load = _nested(Load)
    workloads: list[SuiteRow] = _records(SuiteRow)
    caveat: str = ""

