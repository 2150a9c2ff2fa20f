"""Analyse one file: one parse, one batched traversal for all enabled rules.

The cheap steps come first: a file that never mentions ``torch`` (nor ``lightning`` or
``transformers``, which the framework rules read) is only checked for syntax errors with the
interpreter's own parser and then skipped. Positions are computed once, at the end, and only for
the reported nodes.

A file of a project (``speedfix.project``) gets ``Links``: what the other scanned files tell it
(they run it on CUDA, they call its functions on every step, the functions it imports hold the
training loop). A file whose training loop is nowhere to be seen gets a ``Note`` saying what
could not be checked, instead of silence.

A syntax error is a finding like any other, ``SF000 invalid-syntax`` (as ruff reports
``invalid-syntax``), with the interpreter's message and position. What is left as a
``FileError`` is a file that could not be analysed at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import libcst as cst
from libcst import ParserSyntaxError

from speedfix.engine.coverage import unchecked_loop_note
from speedfix.engine.findings import Finding
from speedfix.engine.results import Analysis, FileError, Note, syntax_finding
from speedfix.engine.rule import Rule
from speedfix.engine.suppression import FileSuppressions, line_suppresses
from speedfix.model.benchmarks import micro_benchmarks
from speedfix.model.context import FileContext
from speedfix.model.devices import uses_cuda
from speedfix.model.flow import every_step_guards
from speedfix.model.choices import classes_no_run_picks
from speedfix.model.launch import classes_off_the_run, launches, picked_by_no_run, self_test_block, trained_with
from speedfix.model.unused import self_test_functions, unreferenced_module, unused_functions, unused_library_functions
from speedfix.model.versions import TorchVersion
from speedfix.project import Links
from speedfix.model.project_files import ProjectFiles, display_path
from speedfix.syntax import deadline
from speedfix.syntax.parsing import NestingTooDeep, TooBigToParse, newer_syntax, parse_module, room_for_deep_trees
from speedfix.syntax.pyast import Measured, python_ast
from speedfix.syntax.positions import positions_for
from speedfix.syntax.source import SourceFile
from speedfix.syntax.walk import walk_batched

_RELEVANT = (b"torch", b"lightning", b"transformers", b"accelerate", b"deepspeed", b"trl")


class _Searched(bytes):
    """A file's bytes whose ``marker in data`` tests are each searched once: forty rules'
    ``may_apply`` test a few dozen markers, many of them shared, against the whole file."""

    def __init__(self, data: bytes) -> None:
        self._found: dict[bytes, bool] = {}

    def __contains__(self, marker: object) -> bool:
        found = self._found.get(marker)  # type: ignore[call-overload]
        if found is None:
            found = self._found[marker] = bytes.__contains__(self, marker)  # type: ignore[index, operator]
        return found


class SyntaxProblem(Exception):
    """The parser gave up: ``error.kind`` is ``syntax`` for invalid code, ``error`` otherwise."""

    def __init__(self, error: FileError) -> None:
        super().__init__(error.message)
        self.error = error


def parse(data: bytes | str, path: str, measured: Measured | None = None) -> cst.Module:
    try:
        return parse_module(data, between_chunks=deadline.check, measured=measured)  # linear in size, never hangs
    except ParserSyntaxError as exc:
        # The interpreter's own message ("'(' was never closed") is the one users know.
        native = _check_syntax_only_text(data, path, newer=False)  # the parse tried newer syntax
        if native is not None:
            raise SyntaxProblem(native) from None
        # Python accepts the code and libcst does not: a limit of this tool, not a syntax error.
        detail = str(getattr(exc, "message", "") or exc).strip().splitlines() or ["no details"]
        message = f"libcst cannot parse this file, although Python can: {detail[0].rstrip('.')}"
        raise SyntaxProblem(FileError(path, message, exc.raw_line, exc.raw_column + 1)) from None
    except (RecursionError, MemoryError) as exc:
        raise SyntaxProblem(_too_deep(path, exc)) from None
    except TooBigToParse as exc:
        raise SyntaxProblem(_too_big(path, exc)) from None


def _check_syntax_only(source: SourceFile, path: str) -> FileError | None:
    return _check_syntax_only_text(source.text, path)


def _check_syntax_only_text(text: str | bytes, path: str, *, newer: bool = True) -> FileError | None:
    """The interpreter's syntax error, unless ``newer`` and the code is written for a newer
    Python that libcst reads (then the file is fine)."""
    try:
        python_ast(text, filename=path)
        return None
    except SyntaxError as exc:  # IndentationError and TabError too: the name says which
        error = exc
    except ValueError as exc:  # null bytes, before Python 3.12 made that a SyntaxError
        return FileError(path, f"cannot parse: {exc}")
    except (RecursionError, MemoryError) as exc:
        return _too_deep(path, exc)
    try:
        if newer and newer_syntax(text):
            return None
    except NestingTooDeep as exc:
        return _too_deep(path, exc)
    except TooBigToParse as exc:
        return _too_big(path, exc)
    message = f"{type(error).__name__}: {error.msg or 'invalid syntax'}"
    return FileError(path, message, error.lineno, (error.offset or 0) or 1, "syntax")


def _too_deep(path: str, exc: BaseException) -> FileError:
    # Python's parser raises a bare MemoryError (no message) on deeply nested expressions.
    detail = str(exc).strip() or f"{type(exc).__name__} in the parser"
    line = getattr(exc, "line", None)  # NestingTooDeep knows where
    return FileError(path, f"cannot parse: the code is nested too deeply ({detail})", line, 1 if line else None)


def _too_big(path: str, exc: TooBigToParse) -> FileError:
    return FileError(path, f"skipped: {exc}", exc.line, 1)


def _failed(result: Analysis, error: FileError | None) -> Analysis:
    """Record a parse failure: a syntax error as its SF000 finding, anything else as the error."""
    if error is not None and error.kind == "syntax":
        result.findings = [syntax_finding(error)]
    else:
        result.error = error
    return result


@room_for_deep_trees()
def analyze(
    source: SourceFile,
    path: str,
    rule_classes: Sequence[type[Rule]],
    torch_version: TorchVersion,
    links: Links | None = None,
    project: ProjectFiles | None = None,
    measured: Measured | None = None,
) -> Analysis:
    """Run ``rule_classes`` on one file and return its findings (positions and noqa applied);
    ``links``: what the other files of the scan tell this one (None: a file on its own);
    ``project``: how to read the project's configuration files (None: the file's folder and
    the current one); ``measured``: what Python's parser measured of the file already."""
    result = Analysis(path)
    suppressions = FileSuppressions.parse(source.text) if b"noqa" in source.data else FileSuppressions(frozenset())
    if suppressions.skips_file:
        return result
    cuda = links is not None and links.cuda is not None
    hot = links is not None and bool(links.hot)  # a helper of another file's training loop
    linked = links is not None and bool(links.modules)  # imports another scanned file
    # the keywords other files pass into its functions' `**kwargs` count as written here (`num_workers`)
    data = _Searched(source.data + b" ".join(key.encode() for _, key, _ in links.kwargs) if links is not None else source.data)
    # A file of a CUDA project may reach torch only through what it is given (`self.device`).
    relevant = hot or cuda or any(marker in source.data for marker in _RELEVANT)
    candidates = [cls for cls in rule_classes if cls.may_apply(data, cuda=cuda, hot=hot, linked=linked)] if relevant else []
    if not candidates:
        return _failed(result, _check_syntax_only(source, path))
    try:
        module = parse(source.data, path, measured)
    except SyntaxProblem as problem:
        return _failed(result, problem.error)
    project = project or ProjectFiles.for_script(Path(source.path), (Path.cwd(),))
    context = FileContext(module, path, torch_version, links, project)
    rules = [cls(context) for cls in candidates if cls.applies_to(torch_version) or cls.advises_upgrade(torch_version)]
    top_of: dict[int, int] = {}
    walk_batched(module, [context, *rules], top_of)
    context.every_step_guards = every_step_guards(context)  # options the walk could not read
    findings: list[Finding] = []
    for rule in rules:
        if rule.gpu_only and not uses_cuda(context):
            continue
        deadline.check()
        rule.finish()
        if rule.advises_upgrade(torch_version):
            rule.as_upgrade_advice(torch_version)
        findings.extend(rule.findings)
    for rule in rules:
        # A fix's transform may call back into its rule: the rules letting go of their findings
        # leave no reference cycle, so the file's tree is freed as soon as the caller is done.
        rule.findings = []
    for leave_out in _OFF_THE_RUN:
        findings, skipped = leave_out(context, findings, top_of)
        if skipped is not None:
            result.notes.append(Note(path, skipped))
    result.module, result.context = module, context
    result.findings = locate(findings, module, source, path, suppressions, top_of)
    result.inputs = dict(project.inputs)
    result.notes.extend(Note(path, problem, shared=True) for problem in dict.fromkeys(project.problems))
    note = unchecked_loop_note(context, rule_classes)
    if note is not None:
        result.notes.append(Note(path, note))
    deadline.check()  # a rule that took the limit's time out and swallowed it must not count as done
    return result


def _outside_self_test(ctx: FileContext, findings: list[Finding], top_of: dict[int, int]) -> tuple[list[Finding], str | None]:
    """The findings outside the file's self-test block (``launch.self_test_block``), and a note
    saying why the others are left out (None when there were none)."""
    block = self_test_block(ctx) if findings else None
    if block is None:
        return findings, None
    index = next(i for i, statement in enumerate(ctx.module.body) if statement is block)
    functions = self_test_functions(ctx, block)
    kept, left_in = _apart(findings, top_of, {index, *functions})
    if not left_in:
        return findings, None
    left = len(left_in)
    block_text = '`if __name__ == "__main__":` block'
    called = [f"`{functions[i]}()`" for i in sorted(set(left_in) & set(functions))]
    shown = f"the {block_text}" if index in left_in else ""
    if called:
        shown += f"{' and in ' if shown else ''}{', '.join(called)}, which only {'it' if shown else 'the ' + block_text} calls,"
    return kept, (f"{left} finding{'s' if left > 1 else ''} in {shown} left out: {trained_with(ctx)} trains with "
                  "this module and no launch command runs it on its own (a self-test)")


def _outside_tests(ctx: FileContext, findings: list[Finding], top_of: dict[int, int]
                   ) -> tuple[list[Finding], str | None]:
    """No findings in a test of the project found in a walked folder (``Links.test``) that has no
    command-line options and that no launch command runs, and a note saying why (None when there
    were none)."""
    if not findings or not ctx.links.test or ctx.calls_to("argparse.ArgumentParser") \
            or (ctx.project is not None and launches(ctx)):
        return findings, None  # (TCN's `add_test.py`, with its options, is an experiment: a run)
    left = len(findings)
    return [], (f"{left} finding{'s' if left > 1 else ''} left out: a test (`test_*.py`, a `tests/` folder) "
                "exercises the project's code, no run trains with it (name the file to scan it)")


def _outside_unpicked_entries(ctx: FileContext, findings: list[Finding], top_of: dict[int, int]
                              ) -> tuple[list[Finding], str | None]:
    """No findings in a file that the scanned scripts reach only through entries of a model zoo
    that no run picks (``launch.picked_by_no_run``), and a note saying why (None otherwise)."""
    unpicked = picked_by_no_run(ctx) if findings and ctx.links.picked_by else None
    if unpicked is None:
        return findings, None
    left = len(findings)
    return [], f"{left} finding{'s' if left > 1 else ''} left out: the scanned scripts reach this file only through {unpicked}"


def _outside_unreferenced_module(ctx: FileContext, findings: list[Finding], top_of: dict[int, int]
                                 ) -> tuple[list[Finding], str | None]:
    """No findings in the classes of a library module that no file of the project imports or
    names (``unused.unreferenced_module``: a layer left over from another model, a copy no run
    uses), and a note saying why (None otherwise). Its functions keep theirs: a script written as
    functions only may be run in ways the scan does not see."""
    if not findings or not ctx.links.unreferenced or not unreferenced_module(ctx):
        return findings, None
    kept, left_in = _apart(findings, top_of, {index for index, statement in enumerate(ctx.module.body)
                                              if isinstance(statement, cst.ClassDef)})
    if not left_in:
        return findings, None
    left = len(left_in)
    return kept, (f"{left} finding{'s' if left > 1 else ''} in its classes left out: no file of the project imports "
                  "or names this module, while the scan holds code that trains (name the file to scan it)")


def _apart(findings: list[Finding], top_of: dict[int, int], indexes: set[int]) -> tuple[list[Finding], list[int]]:
    """The findings outside the module's top-level statements ``indexes``, and the statement of
    each finding left out."""
    kept: list[Finding] = []
    left: list[int] = []
    for finding in findings:
        index = top_of.get(id(finding.node)) if finding.node is not None else None
        if index is not None and index in indexes:
            left.append(index)
        else:
            kept.append(finding)
    return kept, left


def _outside_classes_off_the_run(ctx: FileContext, findings: list[Finding], top_of: dict[int, int]
                                 ) -> tuple[list[Finding], str | None]:
    """The findings outside the classes no run builds (``launch.classes_off_the_run``: only under
    an option that is off; ``choices.classes_no_run_picks``: only where a string option picks
    another variant), and a note saying which were left out and why (None when there were none)."""
    if not findings:
        return findings, None
    off = classes_off_the_run(ctx)
    off.update(classes_no_run_picks(ctx))
    if not off:
        return findings, None
    indexes = {i: statement.name.value for i, statement in enumerate(ctx.module.body)
               if isinstance(statement, cst.ClassDef) and statement.name.value in off}
    kept, left_in = _apart(findings, top_of, set(indexes))
    if not left_in:
        return findings, None
    left = len(left_in)
    classes = sorted({indexes[index] for index in left_in})
    shown = "; ".join(f"`{name}` ({off[name]})" for name in classes)
    return kept, f"{left} finding{'s' if left > 1 else ''} in {shown} left out: no run builds them"


def _outside_unused_functions(ctx: FileContext, findings: list[Finding], top_of: dict[int, int]
                              ) -> tuple[list[Finding], str | None]:
    """The findings outside the functions of an entry script, or of a library module, that
    nothing uses (``unused.unused_functions``, ``unused.unused_library_functions``), and a note
    saying which were left out (None when none were)."""
    indexes = {index for f in findings if f.node is not None and (index := top_of.get(id(f.node))) is not None}
    unused = (unused_functions(ctx, indexes) or unused_library_functions(ctx, indexes)) if indexes else {}
    if not unused:
        return findings, None
    kept, left_in = _apart(findings, top_of, set(unused))
    if not left_in:
        return findings, None
    left = len(left_in)
    shown = ", ".join(f"`{unused[index]}()`" for index in sorted(set(left_in)))
    return kept, (f"{left} finding{'s' if left > 1 else ''} in {shown} left out: nothing in the project calls "
                  "or names it")


def _outside_micro_benchmarks(ctx: FileContext, findings: list[Finding], top_of: dict[int, int]
                              ) -> tuple[list[Finding], str | None]:
    """The findings outside the functions that time a layer on inputs they make themselves
    (``benchmarks.micro_benchmarks``), and a note saying which were left out (None otherwise)."""
    timed = micro_benchmarks(ctx) if findings else {}
    kept, left_in = _apart(findings, top_of, set(timed))
    if not left_in:
        return findings, None
    left = len(left_in)
    shown = ", ".join(f"`{timed[index]}()`" for index in sorted(set(left_in)))
    each = "it times" if len(set(left_in)) == 1 else "each times"
    return kept, (f"{left} finding{'s' if left > 1 else ''} in {shown} left out: {each} a layer on inputs it "
                  "makes itself (a micro-benchmark, not a training run)")


# The findings in code that no run of the project takes are left out, each step with a note that
# says which and why: a test of the project, a library module's self-test (and the functions
# only it calls), classes built only under an option that is off, functions of an entry script or
# of a library module that nothing uses, model-zoo entries
# that no run picks, a library module nothing imports, and functions that time a layer rather
# than train.
_OFF_THE_RUN = (_outside_tests, _outside_self_test, _outside_classes_off_the_run, _outside_unused_functions,
                _outside_unpicked_entries, _outside_unreferenced_module, _outside_micro_benchmarks)


def locate(
    findings: list[Finding],
    module: cst.Module,
    source: SourceFile,
    path: str,
    suppressions: FileSuppressions,
    top_of: dict[int, int] | None = None,
) -> list[Finding]:
    """Give findings their positions, drop suppressed ones, and sort them."""
    nodes = [f.node for f in findings if f.node is not None]
    positions = positions_for(module, nodes, text=source.text, top_of=top_of)
    lines = source.text.splitlines()
    kept: list[Finding] = []
    suppressed: list[Finding] = []
    for finding in findings:
        where = positions.get(finding.node) if finding.node is not None else None
        if where is not None:
            finding.line, finding.column = where.start.line, where.start.column + 1
            finding.end_line, finding.end_column = where.end.line, where.end.column + 1
        if finding.file is not None:  # a line of a configuration file (`Rule.report_at`)
            finding.path = display_path(Path(finding.file))
            if suppressions.suppresses(finding.code):
                suppressed.append(finding)
            else:
                kept.append(finding)
            continue
        finding.path = path
        line_text = lines[finding.line - 1] if 0 < finding.line <= len(lines) else ""
        if suppressions.suppresses(finding.code) or line_suppresses(line_text, finding.code):
            suppressed.append(finding)
        else:
            kept.append(finding)
    _drop_fixes_sharing_ops(kept, suppressed)
    kept.sort(key=lambda f: f.sort_key)
    return _dedupe(kept)


def _drop_fixes_sharing_ops(kept: list[Finding], suppressed: list[Finding]) -> None:
    """A fix that shares an edit with a suppressed finding's fix (one import rewritten for
    several uses) would change the suppressed code too, so it is withdrawn."""
    shared = {id(op) for finding in suppressed if finding.fix for op in finding.fix.ops}
    if not shared:
        return
    for finding in kept:
        if finding.fix and any(id(op) in shared for op in finding.fix.ops):
            finding.fix = None
            finding.no_fix_reason = "another use of the same import is suppressed with noqa"


def _dedupe(findings: list[Finding]) -> list[Finding]:
    """One finding per (code, position, message): a rule may reach the same node twice (two
    different findings of one rule that start at one place, a framework call that is also its
    statement, are both kept)."""
    seen: set[tuple[str, str, int, int, str]] = set()
    unique = []
    for finding in findings:
        key = (finding.code, finding.path, finding.line, finding.column, finding.message)
        if key not in seen:
            seen.add(key)
            unique.append(finding)
    return unique
