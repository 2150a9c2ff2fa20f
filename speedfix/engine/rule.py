"""The rule base class: mostly data, plus the checks.

A rule is one file in ``rules/``. Its class docstring is its documentation in fixed sections
(What it does / Why is this bad? / Example / Use instead / Fix safety / Impact / Measured
effect), its
``VALID`` and ``INVALID`` examples are its tests (an ``Invalid`` carries the expected fixed
code), and its class attributes are the metadata the engine, the report and ``apply`` use.

Rules are batchable libcst visitors that run in the same traversal as the file index
(``speedfix.model.index``). They may collect candidates in ``visit_*`` methods and decide in
``finish()``, once the whole file is known. Most rules only need ``finish()``: the index already
records calls, assignments, loops, functions and classes, and the model answers what they mean
(``speedfix.model``).
"""

from __future__ import annotations

import re
import textwrap
from functools import cached_property
from typing import ClassVar

import libcst as cst
from speedfix.engine.findings import Applicability, Category, Finding, Fix, FixOp, Impact, LossCheck, Severity
from speedfix.engine.impact import Estimate, Measure
from speedfix.engine.suppression import line_suppresses
from speedfix.model.context import FileContext
from speedfix.model.frameworks import GPU_MARKERS
from speedfix.model.versions import TorchRange, TorchVersion
from speedfix.model.project_files import Location
from speedfix.syntax.walk import Visitor

DOC_SECTIONS = (
    "What it does",
    "Why is this bad?",
    "Example",
    "Use instead",
    "Fix safety",
    "Impact",  # the rule's usual impact, and what moves a finding up or down
    "Measured effect",
)



def _clean(code: str) -> str:
    return textwrap.dedent(code).lstrip("\n")


# A rule's examples are written as indented triple-quoted strings, dedented when read: every scan
# imports the rules (six hundred examples), only the tests and the rule pages read the examples.
class Valid:
    """Code the rule must not report."""

    def __init__(self, code: str, torch: str | None = None) -> None:
        self.written = code
        self.torch = torch  # target torch version for this example

    @cached_property
    def code(self) -> str:
        return _clean(self.written)


class Invalid:
    """Code the rule must report; ``fixed`` is the exact result of its fixes (None: no fix)."""

    def __init__(self, code: str, fixed: str | None = None, torch: str | None = None, count: int = 1) -> None:
        self.written, self.fixed_written = code, fixed
        self.torch = torch
        self.count = count  # how many findings of this rule the example produces

    @cached_property
    def code(self) -> str:
        return _clean(self.written)

    @cached_property
    def fixed(self) -> str | None:
        return None if self.fixed_written is None else _clean(self.fixed_written)


class Rule(Visitor):
    code: ClassVar[str]
    name: ClassVar[str]  # kebab-case; names the pattern, not the fix
    summary: ClassVar[str]  # one line for `speedfix rules`
    severity: ClassVar[Severity] = Severity.WARNING
    # What a finding is usually worth ("high", "medium", "low"); ``impact_here`` moves one finding
    # up or down for what the script is, and a benchmark measurement of the kind ``measure``
    # ("data_wait", "host_sync") decides over both. Written as strings in the rule files.
    impact: ClassVar[Impact] = Impact.MEDIUM
    measure: ClassVar[Measure | None] = None
    category: ClassVar[Category] = Category.PERFORMANCE
    fix_applicability: ClassVar[Applicability | None] = None  # None: the rule has no fix
    # Required with a fix: how the benchmark judges the patched script's loss (no default, so a
    # new fix cannot silently get a looser check than it needs).
    loss_check: ClassVar[LossCheck | None] = None
    fix_title: ClassVar[str | None] = None
    gpu_only: ClassVar[bool] = False  # silent in scripts that never touch CUDA
    # Cheap prefilter: the rule only runs on files whose bytes contain one of these.
    requires: ClassVar[tuple[bytes, ...]] = ()
    # Also reads what the other scanned files define (a conv net in models.py): it runs on a
    # file that imports them even without its markers.
    reads_project: ClassVar[bool] = False
    min_torch: ClassVar[TorchVersion | None] = None  # advice applies from this version on
    max_torch: ClassVar[TorchVersion | None] = None  # ... and before this one
    # What the rule's advice needs from a newer torch ("autocast"), when it is worth upgrading
    # torch for: below ``min_torch`` the rule still runs and says so, without a fix.
    upgrade_for: ClassVar[str | None] = None
    effect: ClassVar[str] = ""  # expected gain, one sentence, with its source
    # One finding per training step, also where the step's helpers live in other files of the
    # scan: a library file's findings are folded into those of the script that trains with it.
    one_per_step: ClassVar[bool] = False
    VALID: ClassVar[list[Valid]] = []
    INVALID: ClassVar[list[Invalid]] = []

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.impact = Impact(cls.impact)
        cls.measure = Measure(cls.measure) if cls.measure is not None else None

    def __init__(self, ctx: FileContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.findings: list[Finding] = []

    # -------------------------------------------------------------- reporting
    def report(
        self,
        node: cst.CSTNode,
        message: str,
        *,
        fix_ops: list[FixOp] | tuple[FixOp, ...] | None = None,
        fix_title: str | None = None,
        no_fix_reason: str | None = None,
        severity: Severity | None = None,
        applicability: Applicability | None = None,
        restructures: cst.CSTNode | None = None,
    ) -> None:
        fix = None
        if fix_ops:
            applicability = applicability or self.fix_applicability
            assert applicability is not None, f"{self.code} reports a fix but declares none"
            fix = Fix(
                title=fix_title or self.fix_title or "",
                applicability=applicability,
                ops=tuple(fix_ops),
                restructures=restructures,
            )
        self.findings.append(self._finding(message, severity, node=node, fix=fix, no_fix_reason=None if fix else no_fix_reason))

    def _finding(self, message: str, severity: Severity | None, **fields: object) -> Finding:
        """A finding of this rule, with its impact for this script (``impact_here``)."""
        finding = Finding(code=self.code, name=self.name, message=message, severity=severity or self.severity,
                          impact=self.impact, measure=self.measure.value if self.measure is not None else None,
                          per_step=self.one_per_step, step_of=self._step_of(), **fields)  # type: ignore[arg-type]
        estimate = self.impact_here(finding)
        if estimate is not None:
            finding.impact = estimate.impact
            finding.impact_reason = estimate.reason if estimate.impact is not self.impact else None
            if not estimate.measurable:
                finding.measure = None
        return finding

    def _step_of(self) -> str | None:
        """The script whose training step runs this file's code, for a rule that gives one finding
        per step: a library file without a training loop of its own (its helpers run in the step
        of ``Links.trained_by``)."""
        if not self.one_per_step or self.ctx.step_loops:
            return None
        return self.ctx.links.trained_by

    def impact_here(self, finding: Finding) -> Estimate | None:
        """Override to move ``finding`` (its node, message, severity) from the rule's usual
        impact for what the script is (an evaluation-only loader, a small model): the rule's
        decision, from what the model says. None: the usual impact."""
        return None

    def report_at(
        self,
        where: Location,
        message: str,
        *,
        no_fix_reason: str | None = None,
        severity: Severity | None = None,
    ) -> None:
        """Report a value of a configuration file the script reads (a YAML or JSON line, a
        launch script's option) at its place in that file. speedfix rewrites Python only, so
        such a finding has no fix: ``no_fix_reason`` says what to change. A `# noqa` on that
        line (YAML and shell comments) suppresses it as in Python."""
        if line_suppresses(where.line_text, self.code):
            return
        self.findings.append(self._finding(
            message, severity, node=None, no_fix_reason=no_fix_reason, file=str(where.path),
            line=where.line, column=where.column, end_line=where.end_line, end_column=where.end_column,
        ))

    def finish(self) -> None:
        """Called once the whole file has been traversed."""

    # -------------------------------------------------------------- metadata
    @classmethod
    def may_apply(cls, data: bytes, *, cuda: bool = False, hot: bool = False, linked: bool = False) -> bool:
        """False when the file cannot contain what the rule looks for (no parse needed).
        Another file of the project can say that this one runs on CUDA (``cuda``), calls its
        functions on every training step (``hot``: the markers are in that other file), or
        defines what it imports (``linked``)."""
        if cls.gpu_only and not (cuda or b"cuda" in data or b"accelerator" in data
                                 or any(marker in data for marker in GPU_MARKERS)):
            return False
        return hot or (linked and cls.reads_project) or not cls.requires or any(marker in data for marker in cls.requires)

    @classmethod
    def torch_range(cls) -> TorchRange:
        return TorchRange(cls.min_torch, cls.max_torch, cls.upgrade_for)

    @classmethod
    def applies_to(cls, version: TorchVersion) -> bool:
        return cls.torch_range().applies_to(version)

    @classmethod
    def advises_upgrade(cls, version: TorchVersion) -> bool:
        """Does the rule run on ``version``, below its ``min_torch``, to advise upgrading torch?"""
        return cls.torch_range().advises_upgrade(version)

    def as_upgrade_advice(self, version: TorchVersion) -> None:
        """Turn the findings into advice to upgrade torch first: the fix would not run on ``version``."""
        needs = f"{self.upgrade_for} needs torch {self.min_torch} or newer and this code targets torch {version}"
        for finding in self.findings:
            finding.message += f" ({needs}: upgrade torch to use it)"
            finding.fix = None
            finding.no_fix_reason = f"{needs}; upgrade torch first"

    @classmethod
    def docs(cls) -> str:
        return textwrap.dedent(cls.__doc__ or "").strip()

    @classmethod
    def doc_sections(cls) -> dict[str, str]:
        """The docstring split at its `## Heading` lines."""
        sections: dict[str, str] = {}
        current: str | None = None
        lines: list[str] = []
        for line in cls.docs().splitlines():
            heading = re.match(r"^## (.+?)\s*$", line)
            if heading:
                if current is not None:
                    sections[current] = "\n".join(lines).strip()
                current, lines = heading.group(1), []
            elif current is not None:
                lines.append(line)
        if current is not None:
            sections[current] = "\n".join(lines).strip()
        return sections

    @classmethod
    def fix_availability(cls) -> str:
        return cls.fix_applicability.value if cls.fix_applicability else "none"
