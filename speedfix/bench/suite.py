"""``speedfix bench --suite``: every bundled workload, original vs speedfix's fixes vs an expert.

``fixtures/suite.toml`` lists the workloads::

    [[workload]]
    name = "cnn"
    kind = "cnn"
    script = "cnn_classifier.py"
    expert = "cnn_classifier_expert.py"
    tiny_args = ["--tiny"]
    gpu_args = []

For each one the fixtures are copied to a temporary directory (the installed package may be
read-only), ``speedfix apply --unsafe-fixes`` output is generated there as ``<stem>_speedfix.py``,
and the three versions are measured in counterbalanced rounds with the same seed and window.
"""

from __future__ import annotations

import os
import shutil
import tomllib
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console

from . import numerics, report
from .compare import ComparisonError, Session
from .results import SAMPLES_PER_S, CandidateResult, Load, SuiteResult, SuiteRow
from .runner import RunSpec, owned_tempdir, remove_tree, run_once
from .settings import CompareSettings
from .stats import FASTER

SUITE_FILE = "suite.toml"


@dataclass
class Workload:
    name: str
    kind: str
    script: str
    expert: str | None
    description: str = ""
    tiny_args: list[str] = field(default_factory=lambda: ["--tiny"])
    gpu_args: list[str] = field(default_factory=list)


_FIELDS = {f.name for f in fields(Workload)}


def installed_fixtures() -> Path | None:
    """The folder of the installed ``speedfix.fixtures`` package, None where it is not a folder.

    The package has no ``__init__.py`` (a namespace package): ``resources.files`` gives a
    ``MultiplexedPath`` whose ``str`` is its repr, not a path. Its child is a real file, though."""
    try:
        suite = resources.files("speedfix.fixtures").joinpath(SUITE_FILE)
    except (ModuleNotFoundError, TypeError):
        return None
    return suite.parent if isinstance(suite, Path) else None  # a zip import has no folder to run from


def fixtures_dir(explicit: Path | None = None) -> Path:
    """--fixtures DIR, else the installed ``speedfix.fixtures`` package, else the repo's fixtures/."""
    candidates = [Path(explicit)] if explicit else []
    installed = installed_fixtures()
    if installed is not None:
        candidates.append(installed)
    candidates.append(Path(__file__).resolve().parents[2] / "fixtures")
    for candidate in candidates:
        if (candidate / SUITE_FILE).is_file():
            return candidate
    raise FileNotFoundError(f"no {SUITE_FILE} found in: {', '.join(map(str, candidates))}")


def load_suite(directory: Path) -> list[Workload]:
    with open(directory / SUITE_FILE, "rb") as f:
        data = tomllib.load(f)
    workloads = []
    for entry in data.get("workload", []):
        known = {k: v for k, v in entry.items() if k in _FIELDS}
        known.setdefault("kind", known.get("name", "?"))
        known.setdefault("expert", None)
        workloads.append(Workload(**known))
    return workloads


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def run_suite(*, fixtures: Path | None = None, tiny: bool | None = None, only: list[str] | None = None,
              settings: CompareSettings | None = None, console: Console | None = None, fixer: Any = None,
              run=run_once) -> SuiteResult:
    """Measure every workload (``workloads`` holds the rows)."""
    console = console or Console()
    directory = fixtures_dir(fixtures)
    workloads = [w for w in load_suite(directory) if not only or w.name in only]
    # torch is imported here only to pick the sizes (seconds on a CPU box); the runs report it too
    has_cuda = cuda_available() if tiny is None else None
    tiny = (not has_cuda) if tiny is None else tiny
    # the scripts run in a temporary copy of the fixtures: stopped as soon as their result is written
    settings = replace(settings or CompareSettings(), result_grace_s=0.0)
    if fixer is None:
        from .verify import load_fixer

        fixer = load_fixer()
    rows, torch_version, device = [], "?", "cpu"
    tmp = owned_tempdir("speedfix-suite-")  # a killed suite's copy is swept at the next start
    try:
        work = tmp / "fixtures"
        shutil.copytree(directory, work, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        with report.RichProgress(console, "suite") as progress:
            for workload in workloads:
                row, measured_on = _run_workload(workload, work, tiny, settings, fixer, run, progress)
                rows.append(row)
                if measured_on is not None:
                    torch_version, device, cuda = measured_on
                    has_cuda = cuda if has_cuda is None else has_cuda
    finally:
        remove_tree(tmp)
    loads = [r.load.max_loadavg for r in rows if r.load and r.load.max_loadavg is not None]
    return SuiteResult(size="tiny" if tiny else "full", device=device, torch=torch_version, cuda_available=bool(has_cuda),
                       settings=settings, load=Load(max(loads) if loads else None, os.cpu_count()), workloads=rows,
                       caveat=numerics.CAVEAT)


def write_speedfix_variant(script: Path, fixer: Any) -> tuple[Path | None, dict[str, int]]:
    """``speedfix apply --unsafe-fixes`` output of ``script`` as ``<stem>_speedfix.py`` beside it:
    its path (None when nothing changed) and the fixes applied, by code."""
    source = script.read_text(encoding="utf-8")
    codes = list(fixer.fixable_codes(source, path=str(script), unsafe=True))
    if not codes:
        return None, {}
    outcome = fixer.fix_code(source, path=str(script), select=codes, unsafe=True)
    if outcome.code == source:
        return None, dict(outcome.applied)
    fixed_path = script.with_name(f"{script.stem}_speedfix.py")
    fixed_path.write_text(outcome.code, encoding="utf-8", newline="")
    return fixed_path, dict(outcome.applied)


def _run_workload(w: Workload, work: Path, tiny: bool, settings: CompareSettings, fixer: Any, run,
                  progress) -> tuple[SuiteRow, tuple[str, str, bool] | None]:
    """The workload's row, and the torch version, device and CUDA availability it was measured
    with (None: not measured)."""
    args = list(w.tiny_args if tiny else w.gpu_args)
    script = work / w.script
    candidates, kinds = [], {}
    fixed_path, applied = write_speedfix_variant(script, fixer)
    row = SuiteRow(name=w.name, kind=w.kind, description=w.description, script=w.script, expert_script=w.expert,
                   args=args, fixes=sorted(applied), applied=applied or None)
    if fixed_path is not None:
        candidates.append(RunSpec(fixed_path, args, work, label="speedfix", real_cwd=True))
        kinds["speedfix"] = numerics.class_of(row.fixes)
    if w.expert:
        candidates.append(RunSpec(work / w.expert, args, work, label="expert", real_cwd=True))
    session = Session(RunSpec(script, args, work, label="original", real_cwd=True), settings, run=run,
                      progress=progress)
    try:
        outcome = session.compare(candidates, kinds=kinds)
    except ComparisonError as err:
        return replace(row, error=str(err), failure=err.result.runner.stderr_tail[-2000:]), None
    fixed, expert = outcome.candidate("speedfix"), outcome.candidate("expert")
    metric = next((c.metric for c in outcome.candidates if c.metric), SAMPLES_PER_S)
    original = outcome.original_runs
    before = original.rate(metric)
    row = replace(
        row, metric=metric, window=outcome.window, pairs=outcome.pairs,
        before=before, after=fixed.runs.rate(metric) if fixed else before,
        speedup=fixed.speedup if fixed else None,
        expert=expert.runs.rate(metric) if expert else None, expert_speedup=expert.speedup if expert else None,
        loss_check=_loss_text(fixed) if fixed else "no fix applied",
        expert_loss_check=_loss_text(expert) if expert else "-",
        peak_before=original.peak_bytes, peak_after=(fixed.runs.peak_bytes if fixed else None) or original.peak_bytes,
        captured=_captured(fixed, expert), load=outcome.load, comparison=outcome,
        failures={c.label: c.failure for c in outcome.candidates if c.failure} or None)
    torch_version = outcome.env.torch if outcome.env and outcome.env.torch is not None else "?"
    device = (outcome.device.type if outcome.device else None) or "cpu"
    cuda = outcome.env.cuda_available if outcome.env and outcome.env.cuda_available is not None else None
    return row, (torch_version, device, device == "cuda" if cuda is None else cuda)


def _loss_text(cand: CandidateResult) -> str:
    if cand.failure:
        return f"run failed: {cand.failure.status}"
    check = cand.numerics
    return "-" if not check else ("ok: " if check.passed else "FAIL: ") + check.level


def _captured(fixed: CandidateResult | None, expert: CandidateResult | None) -> float | None:
    """Share of the expert's gain that the automatic fixes capture; only when the expert is
    measurably faster (otherwise there is no gain to share)."""
    if not expert or not expert.speedup or expert.speedup.verdict != FASTER:
        return None
    gain = expert.speedup.median - 1.0
    ours = fixed.speedup.median - 1.0 if fixed and fixed.speedup else 0.0
    return ours / gain
