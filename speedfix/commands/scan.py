"""Scan files and directories: discovery, reading, the project links, analysis, fix details for
the reports."""

from __future__ import annotations

import traceback
from contextlib import ExitStack, contextmanager
from functools import cache as cache_once, partial
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator

from speedfix.commands.measurements import apply_benches, find_benches
from speedfix.commands.pinned import pinned_torch_notes, read_torch_pins
from speedfix.commands.workers import Started, Workers
from speedfix.engine.findings import Finding, from_record, to_record
from speedfix.engine.catalog import rule_name
from speedfix.engine.results import SYNTAX_ERROR_CODE, SYNTAX_ERROR_NAME, Analysis, FileError, Note
from speedfix.model.versions import TorchVersion, project_target
from speedfix.project import Links, ModuleFacts, link
from speedfix.project.facts import facts_of
from speedfix.model.project_files import ProjectFiles, display_path, inputs_unchanged, listings_kept
from speedfix.project.linker import (imported_words, is_test_file, linked_candidates, star_imported_beside,
                                     unreferenced_modules)
from speedfix.syntax import deadline
from speedfix.syntax.collector import collector_paused, loaded_code_frozen
from speedfix.syntax.generated import generated_code_kept
from speedfix.syntax.pyast import Measured, parsed
from speedfix.syntax.source import SourceError, diff_labels, read_bytes, split_lines
from speedfix.workspace.cache import ScanCache, cache_enabled, content_key, file_digest
from speedfix.workspace.config import Settings, real_path, real_paths_kept
from speedfix.workspace.discovery import Target, in_distributed_package, iter_targets, superseded_folder
from speedfix.workspace.notebook import Notebook, NotebookError, is_notebook, read_cap, read_python


@dataclass
class ScanResult:
    findings: list[Finding] = field(default_factory=list)
    errors: list[FileError] = field(default_factory=list)
    files: int = 0
    notes: list[Note] = field(default_factory=list)  # what could not be checked, skipped cells

    @property
    def exit_code(self) -> int:
        if self.errors:
            return 2
        return 1 if self.findings else 0


def file_setup(settings: Settings, path: Path) -> tuple[ProjectFiles, TorchVersion]:
    """How the analysis of ``path`` reads its project's files (inside the scan's root, the
    current folder and the file's own folder), and the torch it targets: the one the user
    named, else the installed one moved into the range the project pins (`torch<2` in its
    requirements.txt makes it 1.13)."""
    project = ProjectFiles.for_script(path, (settings.root, Path.cwd()))
    if settings.torch_version:
        return project, settings.target
    return project, project_target(project, settings.target)


def scan_file(
    target: Target, settings: Settings, *, details: bool = False, links: Links | None = None,
    measured: Measured | None = None,
) -> Analysis:
    """Analyse one file (``links``: what the other files of the scan tell it; ``measured``: what
    Python's parser measured of it when its facts were read); errors are returned, never raised."""
    # The engine, the rules and libcst load with the first file the cache does not hold: a scan
    # of cached files never imports them.
    from speedfix.engine.analysis import analyze
    from speedfix.syntax.parsing import room_for_deep_trees

    shown = display_path(target.path)
    try:
        source, notebook = read_python(target.path, settings.max_file_size)
    except SourceError as exc:
        return Analysis(shown, error=FileError(shown, str(exc)))
    try:
        with deadline.time_limit(settings.file_time_limit), collector_paused(), room_for_deep_trees():
            project, version = file_setup(settings, target.path)
            analysis = analyze(source, shown, settings.rules_for(target.path), version, links, project, measured)
            if notebook is not None:
                notebook.locate(analysis.findings)
                analysis.notes[:0] = [Note(shown, message) for message in notebook.skipped()]
                if analysis.error is not None:
                    notebook.locate_error(analysis.error)
            if details:
                attach_fix_details(analysis, source.text, notebook)
            analysis.module = None  # keep memory flat on big trees
            analysis.context = None
    except RecursionError:
        return Analysis(shown, error=FileError(shown, TOO_DEEP))
    except deadline.TimeLimitExceeded as exc:
        return Analysis(shown, error=FileError(shown, time_limit_message(exc)))
    except Exception as exc:  # a bug of speedfix's: this file fails, the others are still scanned
        return Analysis(shown, error=FileError(shown, internal_error_message(exc)))
    return analysis


def internal_error_message(exc: Exception) -> str:
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ is not None else None
    at = f" at {Path(where.filename).name}:{where.lineno}" if where is not None else ""
    return (f"internal error: speedfix could not analyse this file ({type(exc).__name__}{at}: {exc}); "
            "the other files were scanned. Please report it with the file if you can share it")


# What a RecursionError in the analysis of a file says (the parser refuses the deepest code first).
TOO_DEEP = "the file is nested too deeply to analyse"


def time_limit_message(exc: deadline.TimeLimitExceeded) -> str:
    return f"skipped: analysing it {exc} (raise `file-time-limit` or pass --file-time-limit)"


def attach_fix_details(analysis: Analysis, original: str, notebook: Notebook | None = None) -> None:
    """Each fixable finding gets its own diff and text edits (for JSON, SARIF and Markdown).

    In a notebook the edits are on the lines of its code cells as one module, and the diff
    shows the changed cells. ``speedfix.fixes.previews`` keeps the cost proportional to what each fix
    changes; what it cannot vouch for is previewed on the whole module."""
    from speedfix.fixes.fixer import preview  # libcst's codemod machinery: only loaded when needed
    from speedfix.fixes.previews import Change, Previewer, apply_changes, diff

    fixable = [finding for finding in analysis.findings if finding.fix is not None]
    if not fixable or analysis.module is None:
        return
    previewer = Previewer(analysis.module, original, [finding.fix for finding in fixable if finding.fix])
    lines = previewer.lines
    for finding in fixable:
        deadline.check()
        assert finding.fix is not None
        changes = previewer.changes(finding.fix)
        if changes is None:
            fixed = preview(analysis, finding)
            if fixed is None or fixed == original:
                continue
            changes = [Change(0, lines, tuple(split_lines(fixed)))]
        if not changes:
            continue
        finding.edits = [edit for change in changes for edit in change.edits()]
        if notebook is not None:
            try:
                finding.diff = notebook.diff(apply_changes(lines, changes), analysis.path)
                continue
            except NotebookError:
                pass  # the fix crosses a cell boundary: show it on the code cells as one module
        finding.diff = diff(lines, changes, diff_labels(analysis.path))


def _record(analysis: Analysis) -> dict:
    error = analysis.error
    return {
        "error": None if error is None else error.__dict__,
        "findings": [to_record(f) for f in analysis.findings],
        "notes": [[note.message, True] if note.shared else note.message for note in analysis.notes],
        "inputs": analysis.inputs,
    }


def _from_record(record: dict) -> Analysis:
    error = record.get("error")
    return Analysis(
        path="",
        findings=[from_record(f) for f in record["findings"]],
        error=None if error is None else FileError(**error),
        notes=[Note("", str(note[0]), shared=True) if isinstance(note, list) and note else Note("", str(note))
               for note in record.get("notes", [])],
        inputs={str(k): str(v) for k, v in record.get("inputs", {}).items()},
    )


def _loaded(record: object) -> Analysis | None:
    """The cached analysis, or None for a damaged or forged entry (the cache is a file anyone
    can edit): every finding of a known rule, under its name, with text and numbers where
    speedfix writes them. Control characters in the text are escaped where reports print it."""
    try:
        analysis = _from_record(record)  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError):
        return None
    error = analysis.error
    if error is not None and not (_texts(error.path, error.message) and _numbers(error.line, error.column, optional=True)
                                  and error.kind in ("error", "syntax")):
        return None
    return analysis if all(map(_well_formed, analysis.findings)) else None


def _well_formed(finding: Finding) -> bool:
    code = finding.code if isinstance(finding.code, str) else ""
    name = SYNTAX_ERROR_NAME if code == SYNTAX_ERROR_CODE else rule_name(code)
    return (
        name is not None and finding.name == name and _texts(finding.message, finding.path)
        and _numbers(finding.line, finding.column, finding.end_line, finding.end_column)
        and _numbers(finding.cell, finding.cell_line, optional=True)
        and _texts(finding.no_fix_reason, finding.diff, optional=True)
        and (finding.fix is None or _texts(finding.fix.title))
        and all(_numbers(e.line, e.column, e.end_line, e.end_column) and _texts(e.content) for e in finding.edits or ())
    )


def _texts(*values: object, optional: bool = False) -> bool:
    return all(isinstance(value, str) or (optional and value is None) for value in values)


def _pinned_notes(paths: list[Path], settings: Settings, cache: ScanCache | None, seen: dict[str, str]) -> list[Note]:
    """``pinned_torch_notes``, reused from the cache while the scripts' folders, the current
    folder and every project file it looked at are unchanged (``seen``: digests computed already)."""
    key = file_digest(repr((sorted({str(path.parent) for path in paths}), str(Path.cwd()))).encode())
    kept = cache.get_record("pinned torch notes", key) if cache is not None else None
    if isinstance(kept, dict) and isinstance(kept.get("inputs"), dict) and isinstance(kept.get("notes"), list):
        try:
            if inputs_unchanged(kept["inputs"], seen):
                return [Note(str(path), str(message)) for path, message in kept["notes"]]
        except (TypeError, ValueError, AttributeError):
            pass  # a damaged entry: work them out again
    inputs: dict[str, str] = {}
    notes = pinned_torch_notes(paths, settings, inputs)
    if cache is not None:
        cache.put_record("pinned torch notes", key, {"notes": [[note.path, note.message] for note in notes], "inputs": inputs})
    return notes


def _numbers(*values: object, optional: bool = False) -> bool:
    return all((type(value) is int and value >= 0) or (optional and value is None) for value in values)


Job = tuple[Target, Settings, bool, "Links | None", "Measured | None"]
Mapper = Callable[[Callable, list], Iterable]


def _analyse_to_record(job: Job) -> dict:
    """Worker: analyse one file and return its plain record."""
    target, settings, details, links, measured = job
    return _record(scan_file(target, settings, details=details, links=links, measured=measured))


def _cache_key(settings: Settings, target: Target, details: bool, digest: str | None, links: Links | None) -> str | None:
    if digest is None:
        return None  # unreadable: analysing it reports why
    return content_key(digest, settings.codes_for(target.path), details, links.digest() if links is not None else "")


def project_links(
    targets: list[Target], paths: list[Path], settings: Settings, cache: ScanCache | None = None,
    run: Mapper = map, texts: dict[Path, bytes] | None = None, measured: dict[Path, Measured] | None = None,
) -> tuple[dict[Path, Links], dict[Path, str]]:
    """The links between the scanned Python files that import each other, by target path, and
    each readable file's digest. Only files that import, or are imported by, another scanned
    file are parsed for their facts (with Python's own parser; cached by content; ``run``: the
    ``map`` that reads them, the scan's ``Workers``). ``texts``: contents to use instead of what
    is on disk (an editor's unsaved buffer). ``measured`` receives, by target path, what Python's
    parser measured of the files whose facts were read (for their analysis)."""
    project = ProjectReading(targets, paths, settings, texts)
    facts = project.facts(cache, run, measured)
    alone, linked = project.split(targets)
    links = {**project.links([targets[i] for i in alone]), **project.links([targets[i] for i in linked], facts)}
    return links, project.digests


class ProjectReading:
    """The scanned files read for the project links (``project_links``), in the steps a scan
    takes them: the files that need no other file's facts have their links first, so that their
    analysis can start while the others' facts are linked."""

    def __init__(self, targets: list[Target], paths: list[Path], settings: Settings,
                 texts: dict[Path, bytes] | None = None) -> None:
        self.sources: dict[Path, bytes] = {}
        self.digests: dict[Path, str] = {}
        notebooks: dict[Path, bytes] = {}
        for target in targets:
            try:
                data = texts[target.path] if texts and target.path in texts else read_bytes(target.path, read_cap(target.path, settings.max_file_size))
            except SourceError:
                continue
            self.digests[target.path] = _digest(target.path, data)
            (notebooks if is_notebook(target.path) else self.sources)[target.path] = data
        self.roots = [real_path(p) if p.is_dir() else real_path(p).parent for p in paths]
        self.scanned = {real_path(path): path for path in self.sources}
        self.by_real = dict(self.scanned)
        _add_star_imported(self.sources, self.digests, self.by_real, self.roots, settings)
        self.texts = {**self.sources, **notebooks}
        self.candidates = linked_candidates({real: self.sources[path] for real, path in self.by_real.items()})

    def split(self, targets: list[Target]) -> tuple[list[int], list[int]]:
        """The indexes of the ``targets`` that need no other file's facts, and of the others."""
        linked = [index for index, target in enumerate(targets)
                  if target.path in self.sources and real_path(target.path) in self.candidates]
        chosen = set(linked)
        return [index for index in range(len(targets)) if index not in chosen], linked

    def facts(self, cache: ScanCache | None, run: Mapper = map,
              measured: dict[Path, Measured] | None = None) -> dict[Path, ModuleFacts]:
        """The facts of the files that import, or are imported by, another (``linked_candidates``)."""
        with collector_paused():  # the facts' syntax trees hold no cycle
            return _all_facts({real: self.by_real[real] for real in self.candidates}, self.sources, self.digests,
                              cache, run, measured)

    def links(self, targets: list[Target], facts: dict[Path, ModuleFacts] | None = None) -> dict[Path, Links]:
        """The links of ``targets``: all of them need other files' facts (``split``), and these
        are the ``facts``, or none of them does."""
        links: dict[Path, Links] = {}
        if facts is not None:
            linked = link(facts, self.roots, lambda real: display_path(self.by_real[real]))
            wanted = {real_path(target.path) for target in targets}
            links = {self.by_real[real]: found for real, found in linked.items() if real in self.scanned and real in wanted}
            unread = [self.sources[self.by_real[real]] for real in self.candidates if real not in facts]
            for path, found in links.items():  # a file Python cannot parse may build them too, unseen
                if found.built_under and unread:
                    links[path] = replace(found, built_under=(*found.built_under, *(
                        (name, ()) for name in {name for name, _ in found.built_under}
                        if any(name.encode() in text for text in unread))))
        for target in targets:
            data = self.sources.get(target.path)
            if data is not None and target.path not in links and real_path(target.path) in self.scanned:
                missing = _siblings_not_scanned(target.path, data, self.scanned)
                if missing:
                    links[target.path] = Links(missing=missing)
        for path in _unreferenced(targets, links, self.texts):
            links[path] = replace(links.get(path) or Links(), unreferenced=True)
        for target in targets:  # a test found in a walked folder; one named on the command line is scanned as it is
            if not target.explicit and target.path.suffix == ".py" and is_test_file(Path(display_path(target.path))):
                links[target.path] = replace(links.get(target.path) or Links(), test=True)
        return links


def _unreferenced(targets: list[Target], links: dict[Path, Links], texts: dict[Path, bytes]) -> set[Path]:
    """The modules found in the scanned folders that no other scanned file imports
    (``linker.unreferenced_modules``), outside a package the project distributes: each one's
    analysis then looks for its name in the project's other files (``unused.unreferenced_module``)."""
    imported = {path for path, found in links.items() if found.importers}
    candidates = unreferenced_modules(texts, [target.path for target in targets if not target.explicit
                                              and target.path.suffix == ".py" and target.path not in imported])
    return {path for path in candidates if not in_distributed_package(path)}  # a library's users import it


def _add_star_imported(sources: dict[Path, bytes], digests: dict[Path, str], by_real: dict[Path, Path],
                       roots: list[Path], settings: Settings) -> None:
    """Read the modules the scanned files star-import (`from conf import *`, and what those
    star-import in turn) that are not scanned themselves: for their facts only."""
    todo = list(sources.items())
    while todo:
        path, data = todo.pop()
        for found in star_imported_beside(path, data, roots):
            real = real_path(found)
            if real in by_real:
                continue
            try:
                text = read_bytes(found, read_cap(found, settings.max_file_size))
            except SourceError:
                continue
            by_real[real] = found
            sources[found] = text
            digests[found] = _digest(found, text)
            todo.append((found, text))


def _all_facts(
    candidates: dict[Path, Path], sources: dict[Path, bytes], digests: dict[Path, str],
    cache: ScanCache | None, run: Mapper, measured: dict[Path, Measured] | None = None,
) -> dict[Path, ModuleFacts]:
    """The facts of each candidate (real path -> target path): from the cache, else read in
    parallel with the analysis's workers."""
    facts: dict[Path, ModuleFacts | None] = {}
    todo: list[Path] = []
    for real, path in candidates.items():
        record = cache.get_facts(path, digests[path]) if cache is not None else None
        if record is not None:
            try:
                facts[real] = ModuleFacts.from_record(record)
                continue
            except (KeyError, TypeError, ValueError, AttributeError):
                pass  # a damaged entry: read the file again
        todo.append(real)
    todo.sort(key=lambda real: -len(sources[candidates[real]]))  # the biggest first: no process is left with one at the end
    for real, (found, measure) in zip(todo, run(_facts_and_measure, [sources[candidates[r]] for r in todo])):
        facts[real] = found
        path = candidates[real]
        if measured is not None and measure is not None:
            measured[path] = measure
        if cache is not None:
            cache.put_facts(path, digests[path], found.to_record() if found is not None else None)
    return {real: found for real, found in facts.items() if found is not None}


def _facts_and_measure(data: bytes) -> tuple[ModuleFacts | None, Measured | None]:
    """A file's project facts, and what Python's parser measures of it for its analysis's libcst
    parse: one `ast` parse for both."""
    tree, measure = parsed(data)
    return (facts_of(tree) if tree is not None else None), measure


def _biggest_first(indexes: list[int], targets: list[Target]) -> list[int]:
    """Biggest files first, so that no process is left with a large one while the others idle."""
    return sorted(indexes, key=lambda i: -_size(targets[i].path))


def _digest(path: Path, data: bytes) -> str:
    """The digest of a file's bytes. (What its findings read besides, the project's
    configuration files, is checked on a cache hit: ``Analysis.inputs``.)"""
    return file_digest(data)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # analysing it reports why


def _siblings_not_scanned(path: Path, data: bytes, scanned: dict[Path, Path]) -> tuple[str, ...]:
    """Modules a lone file imports that sit beside it but are not part of the scan."""
    folder = path.parent
    missing = []
    for word in sorted(imported_words(data, modules_only=True)):
        candidate = folder / f"{word}.py"
        if candidate != path and candidate.is_file() and real_path(candidate) not in scanned:
            missing.append(candidate.name)
    return tuple(missing)


def _cached(
    targets: list[Target], indexes: list[int], settings: Settings, cache: ScanCache | None, details: bool,
    links: dict[Path, Links], digests: dict[Path, str], seen: dict[str, str],
) -> tuple[dict[int, Analysis], dict[int, str | None], list[int]]:
    """Of the targets at ``indexes``: the analyses the cache holds (by target index), their cache
    keys, and the indexes of the targets to analyse (``seen``: the project files' digests,
    computed once per scan)."""
    analyses: dict[int, Analysis] = {}
    keys: dict[int, str | None] = {}
    todo: list[int] = []
    for index in indexes:
        target = targets[index]
        hit = None
        if cache is not None:
            # A file edited after this point is re-analysed next time: its hash will differ.
            keys[index] = _cache_key(settings, target, details, digests.get(target.path), links.get(target.path))
            hit = cache.get(target.path, keys[index]) if keys[index] is not None else None
            hit = _loaded(hit) if hit is not None else None  # a damaged entry is analysed again
            if hit is not None and not inputs_unchanged(hit.inputs, seen):
                hit = None  # a configuration file it read has changed
        if hit is not None:
            analyses[index] = hit
        else:
            todo.append(index)
    return analyses, keys, todo


@real_paths_kept()  # one scan resolves each path once
def scan_paths(
    paths: list[Path],
    settings: Settings,
    *,
    details: bool = False,
    jobs: int | None = None,
    use_cache: bool = True,
    progress: Callable[[int, int], None] | None = None,
    bench_results: list[Path] | None = None,
) -> ScanResult:
    """Scan ``paths``; results are the same whatever ``jobs`` and the cache state are.

    The impact of the findings is what the rules estimate, unless a `speedfix bench` result of
    a script is at hand (``bench_results``, or one beside it): its measurements decide
    (``speedfix.commands.measurements``). Findings below ``settings.min_impact`` are left out.
    Raises BenchResultError for a result in ``bench_results`` that cannot be used."""
    result = ScanResult()
    skipped: list[Path] = []
    targets = list(iter_targets(paths, settings, skipped))
    result.notes.extend(Note(display_path(path), f"not scanned: a `{path.suffix}` file is not Python (launch scripts and "
                             "configuration files are read with the scripts they run)") for path in skipped)
    cache = ScanCache(settings.root, settings.fingerprint()) if cache_enabled(use_cache) else None
    with ExitStack() as scope:
        # The engine and the rules load once, before the workers that analyse files are forked
        # (they share them; ``Workers``), or before the first file is analysed here. The torch
        # pins of the scripts' projects are read then too: every worker would read them again.
        def load_engine() -> None:
            scope.enter_context(_analysers_loaded(settings))
            read_torch_pins([target.path for target in targets], settings)

        load = cache_once(load_engine)
        workers = scope.enter_context(Workers(jobs, load=load))
        measured: dict[Path, Measured] = {}
        project = ProjectReading(targets, paths, settings)
        seen: dict[str, str] = {}  # project files' digests, computed once per scan
        links: dict[Path, Links] = {}
        analyses: dict[int, Analysis] = {}
        keys: dict[int, str | None] = {}
        todo: list[int] = []  # the targets to analyse, in the order they are handed out

        def plan(indexes: list[int], facts: dict[Path, ModuleFacts] | None = None) -> list[Job]:
            """The links of the targets at ``indexes``, their analyses from the cache, and the
            jobs of the others (added to ``todo``)."""
            links.update(project.links([targets[i] for i in indexes], facts))
            found, found_keys, left = _cached(targets, indexes, settings, cache, details, links, project.digests, seen)
            analyses.update(found)
            keys.update(found_keys)
            left = _biggest_first(left, targets)
            todo.extend(left)
            return [(targets[i], settings, details, links.get(targets[i].path), measured.get(targets[i].path)) for i in left]

        # The files that need no other file's facts are planned, and their analysis started,
        # while the facts are read (once the engine is loaded: ``Workers.map``'s ``meanwhile``);
        # the others are linked and handed out once the facts are in.
        alone, linked = project.split(targets)
        started: list[Started] = []

        def start_alone() -> list:
            if not started:
                started.append(workers.start(_analyse_to_record, plan(alone), done=None if progress is None else
                                             lambda n: progress(len(analyses) + n, len(targets))))
            return []  # no more facts to read

        facts = project.facts(cache, partial(workers.map, meanwhile=start_alone), measured)
        start_alone()  # (done already, unless no facts were to be read)
        records = started[0].finish(lambda: plan(linked, facts))
        for index, record in zip(todo, records):
            analyses[index] = _from_record(record)
            key = keys.get(index)
            if cache is not None and key is not None and record["error"] is None:
                cache.put(targets[index].path, key, record)
        if progress is not None:
            progress(len(targets), len(targets))
        with listings_kept():
            pinned = _pinned_notes([target.path for target in targets], settings, cache, seen)
    if cache is not None:
        cache.save()
    superseded = superseded_files(targets, paths, links)
    said: set[str] = set()  # the project's notes said already (a file no script could read)
    for index, target in enumerate(targets):
        analysis = analyses[index]
        shown = display_path(target.path)  # cached records may come from another folder
        folder = superseded.get(target.path)
        if folder is not None and analysis.findings:
            left = len(analysis.findings)
            analysis.findings = []
            analysis.notes.append(Note(shown, f"{left} finding{'s' if left > 1 else ''} left out: `{folder}` holds "
                                       "superseded code by its name and no file outside it imports this one (name "
                                       "the file to scan it)"))
        for finding in analysis.findings:
            finding.path = display_path(Path(finding.file)) if finding.file else shown
        if analysis.error is not None:
            analysis.error.path = shown
        for note in analysis.notes:
            note.path = shown
        result.files += 1
        if analysis.error is not None:
            result.errors.append(analysis.error)
        result.findings.extend(analysis.findings)
        result.notes.extend(note for note in analysis.notes if not note.shared or note.message not in said)
        said.update(note.message for note in analysis.notes if note.shared)
    result.notes.extend(pinned)
    result.findings = _one_per_place(result.findings)
    result.findings = _one_per_step(result.findings)
    scripts = {real_path(t.path): display_path(t.path) for t in targets if t.path.suffix == ".py"}
    benches, bench_notes = find_benches(scripts, list(bench_results or ()))
    result.notes.extend(bench_notes)
    apply_benches(result.findings, benches, scripts)
    result.findings = [f for f in result.findings if f.impact.at_least(settings.min_impact)]
    result.findings.sort(key=lambda f: f.sort_key)
    return result


def superseded_files(targets: list[Target], paths: list[Path], links: dict[Path, Links]) -> dict[Path, str]:
    """The files found in a folder of superseded code (``superseded_folder``: `old/`, `legacy/`)
    that no file outside such a folder imports, directly or through others: path -> the folder."""
    folders = [path for path in paths if path.is_dir()]
    named = {real_path(path) for path in paths if path not in folders}  # `scan . old/train.py`: found in `.` first
    found = {target.path: folder for target in targets if not target.explicit
             for folder in [superseded_folder(target.path, folders)]
             if folder is not None and real_path(target.path) not in named}
    if not found:
        return {}
    by_shown = {display_path(target.path): target.path for target in targets}
    reached = True
    while reached:  # a file some file outside those folders imports is part of the project's runs
        reached = False
        for path in list(found):
            importers = links[path].importers if path in links else ()
            if any(by_shown.get(shown) not in found for shown in importers):
                del found[path]
                reached = True
    return found


def _one_per_place(findings: list[Finding]) -> list[Finding]:
    """A configuration file two scripts read (hydra's trainer YAML for train.py and eval.py) is
    reported once per place and message."""
    seen: set[tuple[str, int, int, str, str]] = set()
    kept = []
    for finding in findings:
        if finding.file is not None:
            key = (finding.file, finding.line, finding.column, finding.code, finding.message)
            if key in seen:
                continue
            seen.add(key)
        kept.append(finding)
    return kept


def _one_per_step(findings: list[Finding]) -> list[Finding]:
    """The findings of a rule that gives one per training step (``Rule.one_per_step``), made in
    library files whose helpers run in one script's step (``Finding.step_of``), are that step's:
    the script's own first finding keeps the others' places in its message, else the first
    library file's, and the highest impact among them (a helper that syncs once per element of a
    loop makes the step wait many times). Findings with a fix stay as they are."""
    groups: dict[tuple[str, str], list[Finding]] = {}
    for finding in findings:
        if finding.per_step and finding.fix is None and finding.file is None:
            groups.setdefault((finding.code, finding.step_of or finding.path), []).append(finding)
    dropped: set[int] = set()
    for (_, script), members in groups.items():
        files = sorted({finding.path for finding in members}, key=lambda path: (path != script, path))
        if len(files) < 2:
            continue
        kept = min((f for f in members if f.path == files[0]), key=lambda f: f.sort_key)
        others = sorted((f for f in members if f.path != files[0]), key=lambda f: f.sort_key)
        dropped.update(id(f) for f in others)
        places = ", ".join(f"`{f.path}:{f.line}`" for f in others)
        kept.message += f"; helpers of the same step in other files sync too, at {places}"
        highest = max(others, key=lambda f: f.rank)
        if highest.rank > kept.rank:
            where = f"`{highest.path}:{highest.line}`"
            kept.impact = highest.impact
            kept.impact_reason = f"at {where}: {highest.impact_reason}" if highest.impact_reason else f"the helper at {where}"
    return [finding for finding in findings if id(finding) not in dropped]


@contextmanager
def _analysers_loaded(settings: Settings) -> Iterator[None]:
    """Load the engine and the rules and read the torch version once here, not once per forked
    worker (the methods `@dataclass` generates come compiled: `generated_code_kept`); what they
    load is then left out of the garbage collector's walks while files are analysed. Within it,
    each project folder is listed and each project file read once for all the scripts that look
    there (``listings_kept``)."""
    with ExitStack() as scope:
        # What is loaded lives as long as the process: no collection while it loads, and it is
        # frozen before the collector runs again (which would otherwise walk all of it at once).
        with collector_paused(), generated_code_kept():
            from speedfix.engine.analysis import analyze  # noqa: F401  (libcst, the model, the engine)

            settings.rules()
            settings.target  # noqa: B018
            scope.enter_context(loaded_code_frozen())
        with listings_kept():
            yield
