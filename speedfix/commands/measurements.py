"""`speedfix bench` results a scan reads to decide its findings' impact.

A result is the JSON of `speedfix bench SCRIPT --json FILE`: given with `--bench-result FILE`,
or found beside the script as ``<script stem>.speedfix-bench.json`` (`train.py` ->
`train.speedfix-bench.json`). Its figures (the share of step time spent waiting for data, the
median step time, the device) decide the impact of the findings they bear on in the script and
in the modules of its folder that it imports (``speedfix.engine.impact``). A result that cannot
be read, or that names no scanned script, is said in a note and changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from speedfix.engine.results import Note
from speedfix.engine.findings import Finding
from speedfix.engine.impact import Measurements, judge
from speedfix.project.linker import imported_words
from speedfix.workspace.config import real_path

SUFFIX = ".speedfix-bench.json"
_MAX_BYTES = 16 * 1024 * 1024  # a run's JSON is a few hundred kilobytes at most


class BenchResultError(ValueError):
    """A result given on the command line that cannot be used; the message names the file."""


@dataclass(frozen=True)
class Bench:
    script: Path  # the scanned script it measured (real path)
    measurements: Measurements


def beside(script: Path) -> Path:
    """Where `speedfix scan` looks for a result of ``script``."""
    return script.with_name(script.stem + SUFFIX)


def read_result(path: Path, shown: str) -> tuple[Measurements, str]:
    """The figures of a run's JSON and the script it names. Raises BenchResultError."""
    from speedfix.bench.advice import figures as measured  # only when a result is at hand
    from speedfix.bench.results import RUN_SCHEMA, RunResult

    try:
        if path.stat().st_size > _MAX_BYTES:
            raise BenchResultError(f"{shown}: too big for a `speedfix bench` result")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BenchResultError(f"{shown}: cannot read a `speedfix bench` result: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != RUN_SCHEMA:
        raise BenchResultError(f"{shown}: not the result of one `speedfix bench SCRIPT --json` run "
                               f"(schema {RUN_SCHEMA})")
    try:
        run = RunResult.from_json(data)
        figures = measured(run, shown)
        steps = run.measured
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise BenchResultError(f"{shown}: a `speedfix bench` result with unexpected contents: {exc}") from None
    if not steps:
        raise BenchResultError(f"{shown}: the benchmark measured no steps (status {run.status!r})")
    return figures, str(run.script or "")


def find_benches(scripts: dict[Path, str], given: list[Path]) -> tuple[list[Bench], list[Note]]:
    """The results at hand for the scanned ``scripts`` (real path -> path as shown): those
    ``given`` on the command line (BenchResultError when one cannot be used), then those beside
    the scripts. A result beside a script that cannot be used is a note."""
    benches: dict[Path, Bench] = {}
    notes: list[Note] = []
    for path in given:
        figures, named = read_result(path, str(path))
        script = _named_script(named, path, scripts)
        if script is None:
            raise BenchResultError(f"{path}: it measured {named or 'a script'!s}, which is not among the scanned files")
        benches[script] = Bench(script, figures)
    for script, shown in scripts.items():
        candidate = beside(script)
        if script in benches or not candidate.is_file():
            continue
        label = str(Path(shown).with_name(candidate.name))
        try:
            figures, _ = read_result(candidate, label)
        except BenchResultError as exc:
            notes.append(Note(shown, f"{exc}; impacts are estimated from the code"))
            continue
        benches[script] = Bench(script, figures)
    return list(benches.values()), notes


def _named_script(named: str, result: Path, scripts: dict[Path, str]) -> Path | None:
    """The scanned script a result names: its path from the result's folder or the current one,
    else the only scanned file of that name, else the only scanned file."""
    if named:
        for base in (result.parent, Path.cwd()):
            candidate = real_path(base / named)
            if candidate in scripts:
                return candidate
        same_name = [script for script in scripts if script.name == Path(named).name]
        if len(same_name) == 1:
            return same_name[0]
    return next(iter(scripts)) if len(scripts) == 1 else None


def apply_benches(findings: list[Finding], benches: list[Bench], scripts: dict[Path, str]) -> None:
    """Let each result decide the impact of the findings of its script and of the modules of the
    script's folder that it imports (its loader may be built in data.py)."""
    by_shown = {shown: real for real, shown in scripts.items()}
    for bench in benches:
        covered = {bench.script} | _imported_siblings(bench.script, scripts)
        judge([f for f in findings if by_shown.get(f.path) in covered], bench.measurements)


def _imported_siblings(script: Path, scripts: dict[Path, str]) -> set[Path]:
    try:
        data = script.read_bytes()
    except OSError:
        return set()
    words = imported_words(data, modules_only=True)
    return {path for path in scripts if path.parent == script.parent and path.stem in words}
