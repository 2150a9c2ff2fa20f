"""``speedfix apply SCRIPT --verify``: benchmark the fixes, keep only the ones that hold up.

A "fix" here is every instance of one rule code. Policy (``fixsets``):

1. **The combination first.** All applicable fixes together are measured against the original
   (6 pairs by default). When the combination is not slower and passes the loss check, every fix
   in it is kept. Only when it fails (slower, loss check, crash) does verify look for the fixes
   that fail it, by bisection, each step its own comparison with its own interval, and keep the
   largest passing set it found. ``per_fix`` (``--per-fix``) measures every fix alone instead,
   then the kept ones together.
2. A set is **rejected** when the patched script fails or the loss check fails (``numerics``: the
   required level depends on the rules - exact rewrites must leave the loss bitwise/A-A
   identical). Otherwise a decision on speed needs at least ``stats.MIN_VERDICT_PAIRS`` pairs:
   with fewer (the budget or ``--max-pairs`` ran out) it is **not measured enough** - not written,
   never reported as verified; the static advice stands. With enough pairs it is rejected when
   measurably slower (95% interval below 0.98) or inconclusive with a median below 0.98
   ("probably slower"), and **kept** otherwise.
3. On a machine without a CUDA GPU, fixes whose effect exists only on CUDA are "needs a GPU to
   verify": not written.
4. The kept set is written to the script with ``speedfix.fixes.fixer.write_fixed``; a Markdown and a
   JSON report say, per fix, the decision and why, with the figures of the set that decided it
   (speedup with its interval, loss check, memory change), and every set measured.

Nothing is written into the user's tree but the kept fixes and the two reports. Every variant -
the original too, so that A and B are treated alike - runs as a file with the script's own name in
a scratch mirror of the script's folder (``runner.mirror_tree``: the same sibling modules, data
folders and ``Path(__file__).parents[n]`` resolve) inside ``$TMPDIR/speedfix-verify-<owner>-*``,
removed at the end, on SIGTERM/SIGINT/SIGHUP, or by the next speedfix run if this one was killed.
Hidden ``.speedfix-verify-*`` siblings left by older versions are removed at the start. The runs
see the caller's working directory through a scratch mirror of it too, unless ``real_cwd``.
"""

from __future__ import annotations

import datetime as _dt
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.console import Console

from speedfix.syntax.source import WriteRefused, read_source

from . import numerics, report, stats
from .compare import ComparisonError, Session
from .fixsets import FixSets
from .results import Comparison, Decision, FixDecision, Load, VerifyFailure, VerifyReport
from .runner import (RunSpec, mirror_tree, owned_tempdir, remove_tree, run_once, shielded, sweep_stale_tempdirs,
                     terminate_cleanly)
from .settings import CompareSettings

EXIT_OK, EXIT_REJECTED, EXIT_ERROR = 0, 1, 2
REJECTED, UNMEASURED, NEEDS_GPU = Decision.REJECTED, Decision.UNMEASURED, Decision.NEEDS_GPU
# hidden sibling variants written by versions before the scratch mirrors
LEGACY_VARIANT = re.compile(r"^\.speedfix-verify-(?:SF\d+|combined\d+)-.+\.py$")


def load_fixer() -> Any:
    """The fixer module (``fix_code``, ``fixable_codes``, ``write_fixed``); tests pass a fake."""
    from speedfix.fixes import fixer

    return fixer


class _Variants:
    """Copies of the script (the original and the patched versions), each as ``<its name>`` in a
    scratch mirror of the script's folder under ``$TMPDIR/speedfix-verify-<owner>-*``; removed on exit."""

    def __init__(self, script: Path, encoding: str) -> None:
        self.script, self.encoding = script.resolve(), encoding
        self.root: Path | None = None

    def _place(self, tag: str) -> Path:
        assert self.root is not None, "use _Variants as a context manager"
        leaf = mirror_tree(self.script.parent, self.root / tag, skip={self.script.name}).leaf
        return leaf / self.script.name

    def write(self, tag: str, code: str) -> Path:
        path = self._place(tag)
        path.write_text(code, encoding=self.encoding, newline="")
        return path

    def original(self) -> Path:
        path = self._place("original")
        shutil.copy2(self.script, path)  # byte for byte
        return path

    def __enter__(self) -> "_Variants":
        self.root = owned_tempdir("speedfix-verify-")
        return self

    def __exit__(self, *exc) -> None:
        with shielded():
            remove_tree(self.root)


def remove_legacy_variants(script: Path) -> list[Path]:
    """Hidden ``.speedfix-verify-*.py`` siblings that an interrupted older version left behind."""
    removed = []
    try:
        entries = list(script.parent.iterdir())
    except OSError:
        return removed
    for path in entries:
        if LEGACY_VARIANT.match(path.name) and path.is_file() and not path.is_symlink():
            try:
                path.unlink()
                removed.append(path)
            except OSError:
                pass
    return removed


def verify_script(script: Path, script_args: list[str], *, settings: Any = None,
                  select: Iterable[str] | None = None, ignore: Iterable[str] | None = None,
                  torch_version: str | None = None, unsafe: bool | None = None,
                  report_md: Path | None = None, report_json: Path | None = None, write: bool = True,
                  max_pairs: int = stats.MIN_VERDICT_PAIRS, min_pairs: int = stats.MIN_VERDICT_PAIRS,
                  budget_s: float = 900.0, warmup: int | None = None, steps: int | None = None,
                  timeout_s: float = 600.0, seed: int = 0, cwd: Path | None = None, real_cwd: bool = False,
                  per_fix: bool = False, console: Console | None = None,
                  compare_settings: CompareSettings | None = None, fixer: Any = None, run=run_once) -> int:
    """Measure the applicable fixes (together first, or each alone with ``per_fix``); write the
    kept fixes and a report.

    ``settings`` is speedfix's configuration (``speedfix.workspace.config.Settings``): its enabled rules for
    this file, target torch version and unsafe-fixes choice are used unless ``select``,
    ``ignore``, ``torch_version`` or ``unsafe`` are given. ``budget_s`` and ``max_pairs`` apply
    to each comparison (by default exactly 6 pairs each); ``compare_settings`` replaces all the
    timing options at once. The runs see ``cwd`` (default: the current folder) through a scratch
    mirror of it, unless ``real_cwd``.

    Returns 0 when every applicable fix was kept (or none applied), 1 when at least one was
    rejected, not measured enough or needs a GPU, 2 when the original script cannot be benchmarked
    or the input is unusable.
    """
    console = console or Console()
    script = Path(script)
    if not script.is_file() or script.suffix != ".py":
        console.print(f"[red]error:[/] {script} is not a Python script")
        return EXIT_ERROR
    fixer = fixer or load_fixer()
    if settings is not None:
        if select is None and hasattr(settings, "rules_for"):  # select + extend-select - ignores
            select = [rule.code for rule in settings.rules_for(script)]
        torch_version = torch_version if torch_version is not None else getattr(settings, "torch_version", None)
        unsafe = unsafe if unsafe is not None else getattr(settings, "unsafe_fixes", False)
    unsafe = bool(unsafe)
    compare_settings = compare_settings or CompareSettings(
        seed=seed, warmup=warmup, steps=steps, max_pairs=max_pairs, min_pairs=min(min_pairs, max_pairs),
        budget_s=budget_s, timeout_s=timeout_s)
    sweep_stale_tempdirs()  # the mirrors of a verify that was killed
    for leftover in remove_legacy_variants(script):
        console.print(f"removed {leftover}, a variant left by an interrupted speedfix apply --verify")
    if compare_settings.max_pairs < stats.MIN_VERDICT_PAIRS:
        console.print(f"[yellow]warning:[/] --max-pairs {compare_settings.max_pairs} is below the "
                      f"{stats.MIN_VERDICT_PAIRS} pairs a decision needs: every fix will be reported as not "
                      "measured enough and none written")
    # line endings kept (CRLF stays CRLF when the fixes are written), decoded as the interpreter would
    read = read_source(script, max_bytes=None)
    source, encoding = read.text, read.encoding
    path = str(script)
    codes = list(fixer.fixable_codes(source, path=path, unsafe=unsafe, torch_version=torch_version,
                                     select=select, ignore=ignore))
    if not codes:
        console.print(f"{script}: no applicable fixes, nothing to verify")
        return EXIT_OK

    def fixed(selected: list[str]):
        return fixer.fix_code(source, path=path, select=selected, unsafe=unsafe, torch_version=torch_version)

    report_md = Path(report_md) if report_md else script.with_name(f"{script.stem}.speedfix-verify.md")
    report_json = Path(report_json) if report_json else script.with_name(f"{script.stem}.speedfix-verify.json")
    with terminate_cleanly(), _Variants(script, encoding) as variants, \
            report.RichProgress(console, "verifying") as progress:
        original = RunSpec(variants.original(), list(script_args), cwd, label="original", real_cwd=real_cwd)
        applied, skipped = {}, []
        for code in codes:
            outcome = fixed([code])
            if outcome.code == source or not outcome.applied:
                skipped.append(FixDecision.skipped(code, "the fix changed nothing in this script"))
            else:
                applied[code] = dict(outcome.applied)
        if not applied:
            console.print(f"{script}: the applicable fixes change nothing, nothing to verify")
            return EXIT_OK
        session = Session(original, compare_settings, run=run, progress=progress)
        sets = FixSets(session, original, lambda tag, selected: variants.write(tag, fixed(selected).code), applied)
        try:
            if per_fix:
                specs = [RunSpec(variants.write(code, fixed([code]).code), list(script_args), cwd, label=code,
                                 real_cwd=real_cwd) for code in applied]
                kept_codes = sets.per_fix(specs)
            else:
                kept_codes = sets.combination_first(list(applied))
        except ComparisonError as err:
            return _original_failed(err, script, script_args, report_md, report_json, console)
    fixes = skipped + sets.fixes
    final = fixed(kept_codes).code if kept_codes else source
    changed_meanwhile = None
    if write and kept_codes:
        try:  # never over an edit the user saved while the benchmark ran
            fixer.write_fixed(script, final, unchanged_since=read.data)
        except WriteRefused as err:  # changed meanwhile, read-only, owner or attributes not keepable
            changed_meanwhile = str(err)
            console.print(f"[red]error:[/] {err}")
            write = False
    labels = {decision: [f.label for f in fixes if f.decision is decision]
              for decision in (REJECTED, UNMEASURED, NEEDS_GPU)}
    rejected, unmeasured, needs_gpu = labels[REJECTED], labels[UNMEASURED], labels[NEEDS_GPU]
    summary = (f"kept {len(kept_codes)} of {len(fixes)} fixes ({', '.join(kept_codes) or 'none'})"
               + (f"; rejected {', '.join(rejected)}" if rejected else "")
               + (f"; not measured enough {', '.join(unmeasured)} (static advice only, not written)"
                  if unmeasured else "")
               + (f"; {', '.join(needs_gpu)} need a GPU to verify (not written)" if needs_gpu else "")
               + ("; written to the script" if write and kept_codes else "; script left unchanged"))
    first = sets.first
    verified_on = sets.device
    measured_torch = session.env.torch if session.env and session.env.torch is not None else "?"
    result = VerifyReport(script=str(script), args=list(script_args),
                          date=_dt.datetime.now().isoformat(timespec="seconds"), seed=compare_settings.seed,
                          torch=measured_torch, device=verified_on, verified_on=verified_on,
                          window=first.window if first else session.window(), calibration=session.calibration, fixes=fixes,
                          combinations=sets.combos, kept=kept_codes, written=bool(write and kept_codes),
                          summary=summary, load=first.load if first else Load(), caveat=numerics.CAVEAT,
                          comparison=first or Comparison(), mode="per-fix" if per_fix else "combination first")
    report.write_json(report_json, result.to_json())
    report.write_text(report_md, report.verify_markdown(result))
    report.render_verify(result, console)
    console.print(f"report: {report_md} and {report_json}")
    if changed_meanwhile:
        return EXIT_ERROR
    return EXIT_REJECTED if rejected or unmeasured or needs_gpu else EXIT_OK


def _original_failed(err: ComparisonError, script: Path, args: list[str], report_md: Path, report_json: Path,
                     console: Console) -> int:
    f = err.result.failure()
    console.print(f"[red]error:[/] {err}")
    if f.stderr_tail:
        console.print(f.stderr_tail, markup=False, highlight=False)
    report.write_json(report_json, VerifyFailure(script=str(script), args=list(args), error=str(err), failure=f).to_json())
    report.write_text(report_md, f"# speedfix apply --verify: `{script}`\n\nThe original script could not be "
                      f"benchmarked: {err}\n\n```\n{f.stderr_tail.strip()}\n```\n")
    return EXIT_ERROR
