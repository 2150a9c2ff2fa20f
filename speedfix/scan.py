"""Scan files and directories: discovery, reading, analysis, fix details for the reports."""

from __future__ import annotations

import difflib
import multiprocessing
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from speedfix.config import Settings
from speedfix.discovery import Target, iter_targets
from speedfix.engine import Analysis, FileError, analyze
from speedfix.cache import ScanCache, cache_enabled, content_key
from speedfix.findings import Edit, Finding, from_record, to_record
from speedfix.notebook import Notebook, NotebookError, read_python
from speedfix.source import SourceError, diff_labels


@dataclass
class ScanResult:
    findings: list[Finding] = field(default_factory=list)
    errors: list[FileError] = field(default_factory=list)
    files: int = 0

    @property
    def exit_code(self) -> int:
        if self.errors:
            return 2
        return 1 if self.findings else 0


def display_path(path: Path) -> str:
    """Paths relative to the current folder when they are below it (as ruff prints them)."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if relative.startswith("..") else relative


def scan_file(target: Target, settings: Settings, *, details: bool = False) -> Analysis:
    """Analyse one file; errors are returned, never raised."""
    shown = display_path(target.path)
    try:
        source, notebook = read_python(target.path)
    except SourceError as exc:
        return Analysis(shown, error=FileError(shown, str(exc)))
    try:
        analysis = analyze(source, shown, settings.rules_for(target.path), settings.target)
    except RecursionError:
        return Analysis(shown, error=FileError(shown, "the file is nested too deeply to analyse"))
    if notebook is not None:
        notebook.locate(analysis.findings)
        if analysis.error is not None:
            notebook.locate_error(analysis.error)
    if details:
        attach_fix_details(analysis, source.text, notebook)
    analysis.module = None  # keep memory flat on big trees
    analysis.context = None
    return analysis


def attach_fix_details(analysis: Analysis, original: str, notebook: Notebook | None = None) -> None:
    """Each fixable finding gets its own diff and text edits (for JSON, SARIF and Markdown).

    In a notebook the edits are on the lines of its code cells as one module, and the diff
    shows the changed cells."""
    from speedfix.fixer import preview  # libcst's codemod machinery: only loaded when needed

    for finding in analysis.findings:
        if finding.fix is None:
            continue
        fixed = preview(analysis, finding)
        if fixed is None or fixed == original:
            continue
        finding.edits = line_edits(original, fixed)
        if notebook is not None:
            try:
                finding.diff = notebook.diff(fixed, analysis.path)
                continue
            except NotebookError:
                pass  # the fix crosses a cell boundary: show it on the code cells as one module
        finding.diff = "".join(
            difflib.unified_diff(
                original.splitlines(keepends=True),
                fixed.splitlines(keepends=True),
                *diff_labels(analysis.path),
            )
        )


def line_edits(original: str, fixed: str) -> list[Edit]:
    """Whole-line edits that turn ``original`` into ``fixed``."""
    old = original.splitlines(keepends=True)
    new = fixed.splitlines(keepends=True)
    edits = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag != "equal":
            edits.append(Edit(line=i1 + 1, column=1, end_line=i2 + 1, end_column=1, content="".join(new[j1:j2])))
    return edits


def _record(analysis: Analysis) -> dict:
    error = analysis.error
    return {
        "error": None if error is None else error.__dict__,
        "findings": [to_record(f) for f in analysis.findings],
    }


def _from_record(record: dict) -> Analysis:
    error = record.get("error")
    return Analysis(
        path="",
        findings=[from_record(f) for f in record["findings"]],
        error=None if error is None else FileError(**error),
    )


def _analyse_to_record(job: tuple[Target, Settings, bool]) -> dict:
    """Worker: analyse one file and return its plain record."""
    target, settings, details = job
    return _record(scan_file(target, settings, details=details))


def _cache_key(settings: Settings, target: Target, details: bool) -> str | None:
    try:
        data = target.path.read_bytes()
    except OSError:
        return None
    return content_key(data, tuple(rule.code for rule in settings.rules_for(target.path)), details)


def scan_paths(
    paths: list[Path],
    settings: Settings,
    *,
    details: bool = False,
    jobs: int | None = None,
    use_cache: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> ScanResult:
    """Scan ``paths``; results are the same whatever ``jobs`` and the cache state are."""
    result = ScanResult()
    targets = list(iter_targets(paths, settings))
    cache = ScanCache(settings.root, settings.fingerprint()) if cache_enabled(use_cache) else None
    records: dict[int, dict] = {}
    keys: dict[int, str | None] = {}
    todo: list[int] = []
    for index, target in enumerate(targets):
        hit = None
        if cache is not None:
            # A file edited after this point is re-analysed next time: its hash will differ.
            keys[index] = _cache_key(settings, target, details)
            hit = cache.get(target.path, keys[index]) if keys[index] is not None else None
        if hit is not None:
            records[index] = hit
        else:
            todo.append(index)
    done = len(records)
    if progress is not None:
        progress(done, len(targets))
    for index, record in zip(todo, _run([(targets[i], settings, details) for i in todo], jobs)):
        records[index] = record
        key = keys.get(index)
        if cache is not None and key is not None and record["error"] is None:
            cache.put(targets[index].path, key, record)
        done += 1
        if progress is not None:
            progress(done, len(targets))
    if cache is not None:
        cache.save()
    for index, target in enumerate(targets):
        analysis = _from_record(records[index])
        shown = display_path(target.path)  # cached records may come from another folder
        for finding in analysis.findings:
            finding.path = shown
        if analysis.error is not None:
            analysis.error.path = shown
        result.files += 1
        if analysis.error is not None:
            result.errors.append(analysis.error)
        result.findings.extend(analysis.findings)
    result.findings.sort(key=lambda f: f.sort_key)
    return result


# Below this many files a process pool costs more than it saves.
_PARALLEL_FROM = 8


def _run(jobs_list: list[tuple[Target, Settings, bool]], jobs: int | None) -> Iterator[dict]:
    workers = min(jobs or os.cpu_count() or 1, len(jobs_list))
    if workers <= 1 or len(jobs_list) < _PARALLEL_FROM:
        yield from map(_analyse_to_record, jobs_list)
        return
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    context = multiprocessing.get_context(method)
    chunk = max(1, len(jobs_list) // (workers * 8))
    with context.Pool(workers) as pool:
        yield from pool.imap(_analyse_to_record, jobs_list, chunksize=chunk)
