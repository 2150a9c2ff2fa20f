"""Findings and fixes: what a rule reports and how it would change the code.

Only data: findings read back from the scan cache need no libcst (its node types are named in
annotations alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Callable, Union

if TYPE_CHECKING:
    import libcst as cst

    NodeResult = Union[cst.CSTNode, cst.RemovalSentinel, cst.FlattenSentinel]


class Severity(str, Enum):
    ERROR = "error"  # the code is wrong (a crash, broken numerics)
    WARNING = "warning"  # real speed left on the table
    INFO = "info"  # a smaller or situational gain


class Impact(str, Enum):
    """What a finding is worth for this script: the report leads with the high ones.

    High: a correctness bug, or one of the large wins (mixed precision, compile, a loader that
    starves the GPU, a host sync every step). Low: a small or situational gain (pinned memory for
    an evaluation loader, `set_to_none`, a fused optimizer on a small model, a deprecation). A rule
    declares its usual impact; its decision may move one finding up or down for what the script
    is (an evaluation-only loader, a tiny model), and a measurement of the script (`speedfix
    bench`) decides over both.
    """

    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"

    @property
    def order(self) -> int:
        """0 for high: the sort order of a report that leads with the biggest wins."""
        return _IMPACT_ORDER[self]

    def at_least(self, floor: Impact) -> bool:
        return self.order <= floor.order

    @classmethod
    def parse(cls, text: str) -> Impact:
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise ValueError(f"must be one of high, medium, low, not {text!r}") from None


_IMPACT_ORDER = {Impact.HIGH: 0, Impact.MEDIUM: 1, Impact.LOW: 2}
# SARIF `result.rank` (0-100, higher first): a measured impact outranks an estimated one of its level.
_RANK = {Impact.HIGH: 80, Impact.MEDIUM: 50, Impact.LOW: 20}
MEASURED_RANK_BONUS = 10


class Applicability(str, Enum):
    SAFE = "safe"  # behaviour and numerics identical: applied by default
    UNSAFE = "unsafe"  # numerics or behaviour may change: needs --unsafe-fixes (and a benchmark)


class Category(str, Enum):
    """What a finding is about; the Markdown report groups findings by it."""

    PERFORMANCE = "performance"  # speed left on the table
    CORRECTNESS = "correctness"  # the code is wrong or does not run
    DEPRECATION = "deprecation"  # an API on its way out; nothing to gain in speed


class LossCheck(str, Enum):
    """The numerics contract of a rule's fix: how `speedfix bench`/`apply --verify` judges the
    patched script's loss against the original's."""

    EXACT = "exact"  # the same loss values: bitwise, or within the original's own run-to-run noise
    NUMERICS = "numerics"  # floating-point results change (precision, fused or reordered kernels)
    RNG = "rng"  # the random draws change order: only the seed-to-seed spread can judge it


# ---------------------------------------------------------------- fix operations
@dataclass(frozen=True, eq=False)
class Transform:
    """Rewrite ``node``: ``func`` gets the node as already updated by nested fixes."""

    node: cst.CSTNode
    func: Callable[[cst.CSTNode], NodeResult]


@dataclass(frozen=True, eq=False)
class InsertStatements:
    """Insert statements next to ``anchor`` (a statement line in some block)."""

    anchor: cst.BaseStatement
    statements: tuple[cst.BaseStatement, ...]
    after: bool = True


@dataclass(frozen=True)
class AddImport:
    """Ensure ``import module`` / ``from module import obj [as asname]`` (added once, in the import block)."""

    module: str
    obj: str | None = None
    asname: str | None = None


@dataclass(frozen=True)
class RemoveImportIfUnused:
    module: str
    obj: str | None = None
    asname: str | None = None


FixOp = Union[Transform, InsertStatements, AddImport, RemoveImportIfUnused]


def replace(node: cst.CSTNode, new: cst.CSTNode) -> Transform:
    return Transform(node, lambda _updated: new)


@dataclass(frozen=True, eq=False)
class Fix:
    title: str
    applicability: Applicability
    ops: tuple[FixOp, ...]
    # A node whose statements this fix moves around (wrapping them in a `with`, say). Other
    # fixes inside it wait for the next pass, so the fix sees the statements it analysed.
    restructures: cst.CSTNode | None = None


@dataclass(frozen=True)
class Edit:
    """A text edit for machine consumers (JSON/SARIF): replace the range with ``content``.

    Lines are 1-based, columns 1-based; the end is exclusive.
    """

    line: int
    column: int
    end_line: int
    end_column: int
    content: str


@dataclass(eq=False)
class Finding:
    code: str
    name: str
    message: str
    severity: Severity
    node: cst.CSTNode | None
    path: str = ""
    line: int = 1
    column: int = 1  # 1-based
    end_line: int = 1
    end_column: int = 1
    fix: Fix | None = None
    no_fix_reason: str | None = None  # why a fixable rule has no fix here
    cell: int | None = None  # notebooks: 1-based cell number
    cell_line: int | None = None  # notebooks: line within the cell
    # A finding about a configuration file (YAML, JSON, a launch script) the script reads: its
    # absolute path; ``path``/``line``/``column`` are then that file's, as the report shows them.
    file: str | None = None
    edits: list[Edit] | None = field(default=None, repr=False)  # filled on demand
    diff: str | None = field(default=None, repr=False)  # filled on demand
    impact: Impact = Impact.MEDIUM
    impact_reason: str | None = None  # what moved the impact from the rule's usual one
    measure: str | None = None  # the benchmark measurement that can decide the impact (engine.impact)
    measured: bool = False  # the impact comes from a measurement of the script
    per_step: bool = False  # its rule gives one finding per training step (``Rule.one_per_step``)
    # ... and the script (as shown) whose step runs it, where that is another file's (a library's helper)
    step_of: str | None = None

    @property
    def fixable(self) -> bool:
        return self.fix is not None

    @property
    def location(self) -> str:
        """`path:line:col`, or `nb.ipynb:cell N:line:col` in a notebook (1-based)."""
        if self.cell is not None:
            return f"{self.path}:cell {self.cell}:{self.cell_line}:{self.column}"
        return f"{self.path}:{self.line}:{self.column}"

    @property
    def sort_key(self) -> tuple[str, int, int, str]:
        return (self.path, self.line, self.column, self.code)

    @property
    def rank(self) -> int:
        """0-100, higher first (SARIF's `rank`): the impact, a measured one above an estimated one."""
        return self.rank_of(self.impact) + (MEASURED_RANK_BONUS if self.measured else 0)

    @staticmethod
    def rank_of(impact: Impact) -> int:
        return _RANK[impact]

    @property
    def impact_key(self) -> tuple[int, str, int, int, str]:
        """The order of a report that leads: highest rank first, then by position."""
        return (-self.rank, *self.sort_key)


# ---------------------------------------------------------------- plain records
# Findings cross process boundaries (--jobs) and live in the scan cache as plain dicts: the
# libcst node and the fix's operations stay behind; what the reports need is kept.
def to_record(finding: Finding) -> dict:
    return {
        "code": finding.code,
        "name": finding.name,
        "message": finding.message,
        "severity": finding.severity.value,
        "path": finding.path,
        "line": finding.line,
        "column": finding.column,
        "end_line": finding.end_line,
        "end_column": finding.end_column,
        "fix": None if finding.fix is None else {"title": finding.fix.title, "applicability": finding.fix.applicability.value},
        "no_fix_reason": finding.no_fix_reason,
        "cell": finding.cell,
        "cell_line": finding.cell_line,
        "file": finding.file,
        "edits": None if finding.edits is None else [e.__dict__ for e in finding.edits],
        "diff": finding.diff,
        "impact": finding.impact.value,
        "impact_reason": finding.impact_reason,
        "measure": finding.measure,
        "measured": finding.measured,
        "per_step": finding.per_step,
        "step_of": finding.step_of,
    }


def from_record(record: dict) -> Finding:
    fix = record.get("fix")
    edits = record.get("edits")
    return Finding(
        code=record["code"],
        name=record["name"],
        message=record["message"],
        severity=Severity(record["severity"]),
        node=None,
        path=record["path"],
        line=record["line"],
        column=record["column"],
        end_line=record["end_line"],
        end_column=record["end_column"],
        fix=None if fix is None else Fix(fix["title"], Applicability(fix["applicability"]), ()),
        no_fix_reason=record.get("no_fix_reason"),
        cell=record.get("cell"),
        cell_line=record.get("cell_line"),
        file=record.get("file"),
        edits=None if edits is None else [Edit(**e) for e in edits],
        diff=record.get("diff"),
        impact=Impact(record["impact"]),  # a record of a version without impacts is analysed again
        impact_reason=record.get("impact_reason"),
        measure=record.get("measure"),
        measured=bool(record.get("measured", False)),
        per_step=bool(record.get("per_step", False)),
        step_of=record.get("step_of"),
    )


class Blocker(Enum):
    """Why a finding was left unfixed; the value is the summary's text unless a finding has its own."""

    NEEDS_UNSAFE = "unsafe fix: needs --unsafe-fixes"
    NO_FIX_HERE = "no fix in this case"  # the rule has a fix, this finding does not
    NO_FIX = "no automatic fix for this rule"
    SYNTAX = "the file does not parse"
    QUIET = "no longer reported after other fixes"  # gone without its own fix: not counted as fixed
