"""Apply fixes to a fixed point without ever losing the user's code.

Each pass analyses the current code, applies every selected fix in one libcst transform (fixes
on the same node compose: each gets the node as the others left it), then adds and removes
imports with libcst's ``AddImportsVisitor``/``RemoveImportsVisitor``. Passes repeat until
nothing changes (at most ``MAX_PASSES``). The result must parse again — with libcst and, if the
original did, with the interpreter — or nothing is returned. libcst round-trips every byte it
does not touch: comments, formatting, line endings, the coding cookie and a BOM stay as they were.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import AbstractSet as Set, Iterable, Sequence

import libcst as cst
from speedfix.engine.analysis import SyntaxProblem, analyze
from speedfix.engine.findings import (AddImport, Applicability, Blocker, Finding, Fix, Impact, InsertStatements,
                                      RemoveImportIfUnused, Transform)
from speedfix.engine.registry import select_rules
from speedfix.engine.results import SYNTAX_ERROR_CODE, Analysis
from speedfix.fixes.linemap import LineMap
from speedfix.engine.rule import Rule
from speedfix.fixes.width import wrap_long_lines
from speedfix.model.versions import TorchVersion, resolve_target
from speedfix.project import Links
from speedfix.model.project_files import ProjectFiles
from speedfix.syntax.comments import own_lines
from speedfix.syntax.nodes import walk_expression
from speedfix.syntax.parsing import newer_syntax, room_for_deep_trees
from speedfix.syntax.pyast import python_ast
from speedfix.syntax.roundtrip import Restorer, RoundTripError
from speedfix.syntax.source import SourceError, SourceFile, decode_source, read_bytes, write_atomic

MAX_PASSES = 6


class FixError(Exception):
    """A fix produced code that does not parse; nothing was written."""


@dataclass
class Unfixed:
    finding: Finding
    reason: str  # what the summary prints
    blocker: Blocker


@dataclass
class FixOutcome:
    code: str  # the fixed source text
    data: bytes  # the fixed source, encoded as the original was
    applied: dict[str, int] = field(default_factory=dict)  # rule code -> fixes applied
    unfixed: list[Unfixed] = field(default_factory=list)
    passes: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.applied)


class _Applier(cst.CSTTransformer):
    def __init__(self, fixes: Sequence[Fix], only: Set[int] | None = None) -> None:
        super().__init__()
        self.only = only  # ids of the nodes worth descending into (None: all)
        self.transforms: dict[cst.CSTNode, list[Transform]] = defaultdict(list)
        self.before: dict[cst.CSTNode, list[cst.BaseStatement]] = defaultdict(list)
        self.after: dict[cst.CSTNode, list[cst.BaseStatement]] = defaultdict(list)
        self.imports: list[AddImport] = []
        self.unused_imports: list[RemoveImportIfUnused] = []
        self._blocks: list[_Block] = []
        for fix in fixes:
            for op in fix.ops:
                if isinstance(op, Transform):
                    if op not in self.transforms[op.node]:  # an op shared by several findings
                        self.transforms[op.node].append(op)
                elif isinstance(op, InsertStatements):
                    target = self.after if op.after else self.before
                    if not any(_same_code(s, existing) for s in op.statements for existing in target[op.anchor]):
                        target[op.anchor].extend(op.statements)
                elif isinstance(op, AddImport):
                    if op not in self.imports:
                        self.imports.append(op)
                elif isinstance(op, RemoveImportIfUnused):
                    self.unused_imports.append(op)

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.Module, cst.IndentedBlock)):
            self._blocks.append(_Block())
        if self.only is not None and id(node) not in self.only:
            return False  # nothing to change below: libcst leaves the subtree as it is
        return super().on_visit(node)

    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        result = self._rewrite(original_node, updated_node)
        if isinstance(original_node, (cst.Module, cst.IndentedBlock)):
            return self._blocks.pop().carry_comments(result)
        if isinstance(original_node, cst.BaseStatement) and self._blocks:
            # Statements leave while their own block is the innermost one being visited.
            self._blocks[-1].left(updated_node, result)
        return result

    def _rewrite(self, original_node, updated_node):  # type: ignore[no-untyped-def]
        result = updated_node
        for transform in self.transforms.get(original_node, ()):
            if not isinstance(result, cst.CSTNode):
                break
            result = transform.func(result)
        before, after = self.before.get(original_node), self.after.get(original_node)
        if not before and not after:
            return result
        if isinstance(result, cst.RemovalSentinel):
            middle: list[cst.CSTNode] = []
        elif isinstance(result, cst.FlattenSentinel):
            middle = list(result.nodes)
        else:
            middle = [result]
        return cst.FlattenSentinel([*(before or ()), *middle, *(after or ())])


@dataclass
class _Block:
    """A module body or indented block being rewritten: how many statements each of its
    statements became, and the comments of those that were removed."""

    produced: list[int] = field(default_factory=list)
    orphans: dict[int, list[cst.EmptyLine]] = field(default_factory=dict)

    def left(self, before: cst.CSTNode, result: object) -> None:
        if isinstance(result, cst.RemovalSentinel):
            count = 0
        elif isinstance(result, cst.FlattenSentinel):
            count = len(result.nodes)
        else:
            count = 1
        if count == 0:
            lines = own_lines(before)
            if lines:
                self.orphans[len(self.produced)] = lines
        self.produced.append(count)

    def carry_comments(self, block):  # type: ignore[no-untyped-def]
        """``block`` with each removed statement's comments above the next statement that is
        still there, or at the end of the block (so that no comment a user wrote is lost)."""
        if not self.orphans or not isinstance(block, (cst.Module, cst.IndentedBlock)):
            return block
        body = list(block.body)
        footer: list[cst.EmptyLine] = []
        moved: dict[int, list[cst.EmptyLine]] = {}
        for index, lines in sorted(self.orphans.items()):
            later = next((j for j in range(index + 1, len(self.produced)) if self.produced[j]), None)
            if later is None:
                footer.extend(lines)
            else:
                moved.setdefault(sum(self.produced[:later]), []).extend(lines)
        for position, lines in moved.items():
            statement = body[position]
            body[position] = statement.with_changes(leading_lines=[*lines, *statement.leading_lines])
        return block.with_changes(body=body, footer=[*footer, *block.footer])


def _same_code(a: cst.CSTNode, b: cst.CSTNode) -> bool:
    return a.deep_equals(b)


def apply_fixes(module: cst.Module, fixes: Sequence[Fix], *, only: Set[int] | None = None) -> cst.Module:
    """One transform with all ``fixes``, then the import bookkeeping they asked for. With
    ``only`` (the ids of the changed nodes and of all their ancestors), the transform descends
    into those nodes alone (see ``speedfix.fixes.previews``)."""
    applier = _Applier(fixes, only)
    updated = module.visit(applier)
    if applier.imports or applier.unused_imports:
        # Imported here: libcst's codemod package builds hundreds of matcher classes on import.
        from libcst.codemod import CodemodContext
        from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor

        context = CodemodContext()
        for imp in applier.imports:
            AddImportsVisitor.add_needed_import(context, imp.module, imp.obj, imp.asname)
        for imp in applier.unused_imports:
            RemoveImportsVisitor.remove_unused_import(context, imp.module, imp.obj, imp.asname)
        if applier.unused_imports:
            updated = RemoveImportsVisitor(context).transform_module(updated)
        if applier.imports:
            updated = AddImportsVisitor(context).transform_module(updated)
    return wrap_long_lines(module, updated)


def this_pass(fixes: Sequence[Fix]) -> list[Fix]:
    """The fixes to apply together now: a fix that restructures a block goes alone in it.

    Its edit is computed from the block as analysed; an edit inside the same block (a removed or
    inserted statement) would shift what it moves, so those wait for the next pass. Of two
    restructuring fixes over the same nodes, the first goes now. Every pass applies something.
    """
    chosen: list[Fix] = []
    claimed: set[int] = set()  # nodes inside the blocks of restructuring fixes already chosen
    deferred: list[Fix] = []
    for fix in fixes:
        if fix.restructures is not None:
            region = {id(node) for node in walk_expression(fix.restructures)}
            if region & claimed:
                continue
            claimed |= region
            chosen.append(fix)
        else:
            deferred.append(fix)
    for fix in deferred:
        if not any(id(op_node(op)) in claimed for op in fix.ops):
            chosen.append(fix)
    return chosen


def op_node(op: object) -> cst.CSTNode | None:
    """The node a fix operation edits or inserts beside."""
    if isinstance(op, Transform):
        return op.node
    if isinstance(op, InsertStatements):
        return op.anchor
    return None


def allowed(finding: Finding, unsafe: bool) -> bool:
    return finding.fix is not None and (unsafe or finding.fix.applicability is Applicability.SAFE)


@room_for_deep_trees()
def preview(analysis: Analysis, finding: Finding) -> str | None:
    """The file's code with only ``finding``'s fix applied (for diffs and JSON edits)."""
    if finding.fix is None or analysis.module is None:
        return None
    try:
        return apply_fixes(analysis.module, [finding.fix]).code
    except Exception:  # a preview must never break a report
        return None


@room_for_deep_trees()
def fix_source(
    source: SourceFile,
    path: str,
    rules: Sequence[type[Rule]],
    target: TorchVersion,
    *,
    unsafe: bool,
    links: Links | None = None,
    project: ProjectFiles | None = None,
    min_impact: Impact = Impact.LOW,
) -> FixOutcome:
    """Fix ``source`` to a fixed point (``links``: what the other files of the project tell it;
    ``min_impact``: findings of a lower impact are neither fixed nor listed as left).
    Raises FixError when a fix breaks the code, and SyntaxProblem when the parser gives up on
    valid code; a syntax error in ``source`` comes back as an unfixed SF000 finding, with the
    code unchanged.

    ``applied`` counts what was written: per rule and pass, the fixes applied whose findings are
    gone in the next pass. A fix that changed nothing is not counted; a finding that went quiet
    without its own fix (another fix made its rule stop reporting it: mixed precision makes TF32
    advice moot, and a rule with a whole-file check may fall silent for the wrong reason) is not
    counted either, and stays listed as left, at its place in the fixed code, naming those fixes."""
    data = source.data
    passes = 0
    analysis: Analysis | None = None
    restorer: Restorer | None = None
    written: Counter[str] = Counter()
    quiet: list[tuple[Finding, str, list[str]]] = []  # gone without their fix: the code they were in, the fixes then

    def analyse(data: bytes, fixed: bool) -> Analysis:
        result = analyze(SourceFile(source.path, data, *decode_source(data)), path, rules, target, links, project)
        broken = result.error or result.syntax_error  # the parse runs the interpreter's ast too
        if broken is not None and fixed:  # the input parsed: our own fix broke it
            raise FixError(f"{path}: a fix produced code that does not parse ({broken.message}); nothing was written")
        return result

    def wanted(finding: Finding) -> bool:
        return finding.impact.at_least(min_impact)

    previous: tuple[list[Finding], set[int], str] | None = None  # the last pass's findings, those it fixed, its code
    for passes in range(1, MAX_PASSES + 1):
        analysis = analyse(data, fixed=passes > 1)
        if analysis.error is not None:
            raise SyntaxProblem(analysis.error)
        if previous is not None:
            _settle(previous, analysis.findings, written, quiet)
        candidates = [f for f in analysis.findings if allowed(f, unsafe) and f.fix is not None and wanted(f)]
        fixes = this_pass([f.fix for f in candidates if f.fix is not None])
        if not fixes or analysis.module is None:
            break
        if restorer is None:  # before the first fix: can every untouched byte be kept?
            try:
                restorer = Restorer(data, analysis.module.bytes)
            except RoundTripError as exc:
                raise FixError(f"{path}: {exc}; left unfixed") from None
        new_data = apply_fixes(analysis.module, fixes).bytes
        if new_data == data:
            break
        chosen = {id(fix) for fix in fixes}
        previous = (analysis.findings, {id(f) for f in candidates if id(f.fix) in chosen}, analysis.module.code)
        data = new_data
    else:  # still changing after MAX_PASSES: analyse the final state once more
        analysis = analyse(data, fixed=True)
        if previous is not None:
            _settle(previous, analysis.findings, written, quiet)
    assert analysis is not None
    if restorer is not None:  # every pass parsed its code; bytes put back afterwards get a look of their own
        restored = restorer.restore(data)
        if restored != data:
            _check_parses(restored, path)
        data = restored
    applied = {code: count for code, count in sorted(written.items()) if count > 0}
    if data == source.data:
        applied, quiet = {}, []
    text, _ = decode_source(data)
    final = analysis.module.code if analysis.module is not None else text
    left = [unfixed(f, unsafe) for f in analysis.findings if wanted(f)]
    for finding, code, fixes_then in quiet:  # where it was found, in the code as fixed
        LineMap(code, final).remap([finding])
        reason = f"no longer reported after the {', '.join(fixes_then)} fix{'es' if len(fixes_then) > 1 else ''}: not counted as fixed"
        left.append(Unfixed(finding, reason, Blocker.QUIET))
    return FixOutcome(
        code=text,
        data=data,
        applied=applied,
        unfixed=sorted(left, key=lambda item: item.finding.sort_key),
        passes=passes,
    )


def _settle(previous: tuple[list[Finding], set[int], str], now: list[Finding], written: Counter[str],
            quiet: list[tuple[Finding, str, list[str]]]) -> None:
    """What the last pass did, per rule: of the fixes it applied, as many as its findings went
    down by were written; if they went down by more, the findings it did not fix that are gone
    went quiet (another fix made the rule stop reporting them)."""
    before, fixed, code = previous
    fixes_then = sorted({f.code for f in before if id(f) in fixed})
    after = Counter(f.code for f in now)
    after_keys = Counter((f.code, f.message) for f in now)
    for rule in sorted({f.code for f in before}):
        mine = [f for f in before if f.code == rule]
        gone = max(0, len(mine) - after[rule])
        done = min(gone, sum(1 for f in mine if id(f) in fixed))
        written[rule] += done
        unfixed_ones = [f for f in mine if id(f) not in fixed]
        # the ones whose message is gone first: a message that changed (SF301 lists the step's other syncs) is not gone
        unfixed_ones.sort(key=lambda f: after_keys[(f.code, f.message)] > 0)
        quiet += [(f, code, fixes_then) for f in unfixed_ones[:gone - done]]


def unfixed(finding: Finding, unsafe: bool) -> Unfixed:
    """A finding left after the fixes, with why (a syntax error: the file is left alone)."""
    if finding.code == SYNTAX_ERROR_CODE:
        return Unfixed(finding, f"{finding.message} (the file is left as it is)", Blocker.SYNTAX)
    if finding.fix is not None and not unsafe and finding.fix.applicability is Applicability.UNSAFE:
        return Unfixed(finding, Blocker.NEEDS_UNSAFE.value, Blocker.NEEDS_UNSAFE)
    if finding.no_fix_reason:
        return Unfixed(finding, finding.no_fix_reason, Blocker.NO_FIX_HERE)
    return Unfixed(finding, Blocker.NO_FIX.value, Blocker.NO_FIX)


def _check_parses(data: bytes, path: str) -> None:
    """The fixed bytes parse for libcst and compile for the interpreter, or for libcst alone when
    they are written for a newer Python (the input did: a file that does not never gets here)."""
    try:
        cst.parse_module(data)
    except Exception as exc:
        raise FixError(f"{path}: the fixed code does not parse ({exc}); nothing was written") from None
    try:
        python_ast(data)
    except (SyntaxError, ValueError) as exc:
        if not (isinstance(exc, SyntaxError) and newer_syntax(data)):
            raise FixError(f"{path}: the fixed code does not compile ({exc}); nothing was written") from None


# ------------------------------------------------------------------ public helpers (bench, verify)
def _rules(select: Iterable[str] | None, ignore: Iterable[str] | None) -> tuple[type[Rule], ...]:
    return select_rules(list(select) if select is not None else None, list(ignore or ()))


def fix_code(
    code: str,
    *,
    path: str,
    select: Iterable[str] | None = None,
    unsafe: bool = True,
    torch_version: str | None = None,
    ignore: Iterable[str] | None = None,
) -> FixOutcome:
    """Fix a source string with the rules in ``select`` (codes or prefixes)."""
    data = code.encode("utf-8")
    source = SourceFile(Path(path), data, code, "utf-8")
    return fix_source(source, path, _rules(select, ignore), resolve_target(torch_version, None), unsafe=unsafe)


def fixable_codes(
    code: str,
    *,
    path: str,
    unsafe: bool = True,
    torch_version: str | None = None,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
) -> list[str]:
    """Rule codes with at least one applicable fix in ``code``."""
    data = code.encode("utf-8")
    analysis = analyze(
        SourceFile(Path(path), data, code, "utf-8"), path, _rules(select, ignore), resolve_target(torch_version, None)
    )
    return sorted({f.code for f in analysis.findings if allowed(f, unsafe)})


def write_fixed(path: Path, code: str, *, unchanged_since: bytes | None = None) -> None:
    """Write ``code`` over ``path`` atomically, in the file's own encoding (BOM included), with the
    rules of ``speedfix apply`` (``speedfix.syntax.source.write_atomic``): ``WriteRefused`` and nothing
    written for a read-only file, a symbolic link out of the script's folder, or an owner or
    extended attribute that cannot be kept.

    With ``unchanged_since`` (the bytes the caller read), nothing is written and ``FileChanged`` is
    raised when the file no longer holds them, checked right before the replace: a user's edit
    saved during a long run (``apply --verify``) is never overwritten."""
    path = Path(path)
    try:
        data = unchanged_since if unchanged_since is not None else read_bytes(path, None)
        encoding = decode_source(data)[1]
    except SourceError:
        encoding = "utf-8"
    write_atomic(path, code.encode(encoding), expected=unchanged_since, within=[path.absolute().parent])
