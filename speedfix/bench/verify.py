"""``speedfix apply SCRIPT --verify``: benchmark every fix, keep only the ones that hold up.

A "fix" here is every instance of one rule code. Policy:

1. Each applicable fix alone is measured against the original, all in one set of counterbalanced
   rounds (original, fix 1, fix 2, ... then reversed), so the original's runs are shared.
2. A fix is **rejected** when the patched script fails or the loss check fails (``numerics``: the
   required level depends on the rule - exact rewrites must leave the loss bitwise/A-A identical).
   Otherwise a decision on speed needs at least ``stats.MIN_VERDICT_PAIRS`` pairs: with fewer (the
   budget or ``--max-pairs`` ran out) the fix is **not measured enough** - not written, never
   reported as verified, flagged with the figures so far; the static advice stands. With enough
   pairs it is rejected when measurably slower (95% interval below 0.98) or inconclusive with a
   median below 0.98 ("probably slower"), and **kept** otherwise; inconclusive fixes with a median
   >= 0.98 are kept and flagged: the static advice stands and the numbers do not contradict it.
3. The kept fixes together are measured again (fixes can interact). If the combination fails the
   same test, the kept fix with the smallest median speedup is dropped and the rest re-measured,
   at most ``MAX_COMBINATION_RETRIES`` times; after that only the single best fix is kept. A
   combination that was not measured enough keeps only the single best fix (measured alone).
4. The kept set is written to the script with ``speedfix.fixes.fixer.write_fixed``; a Markdown and a
   JSON report say, per fix, the speedup with its interval, the loss check, the memory change,
   and kept or rejected and why.

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
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from speedfix.syntax.source import WriteRefused, read_source

from . import numerics, report, stats
from .compare import ComparisonError, Session
from .results import CandidateResult, Decision, FixDecision, VerifyFailure, VerifyReport
from .runner import (RunSpec, mirror_tree, owned_tempdir, remove_tree, run_once, shielded, sweep_stale_tempdirs,
                     terminate_cleanly)
from .settings import CompareSettings
from .stats import INCONCLUSIVE, SLOWER, SLOWER_BELOW

MAX_COMBINATION_RETRIES = 2
EXIT_OK, EXIT_REJECTED, EXIT_ERROR = 0, 1, 2
KEPT, REJECTED, UNMEASURED, NEEDS_GPU = Decision.KEPT, Decision.REJECTED, Decision.UNMEASURED, Decision.NEEDS_GPU
# hidden sibling variants written by versions before the scratch mirrors
LEGACY_VARIANT = re.compile(r"^\.speedfix-verify-(?:SF\d+|combined\d+)-.+\.py$")


def load_fixer() -> Any:
    """The fixer module (``fix_code``, ``fixable_codes``, ``write_fixed``); tests pass a fake."""
    from speedfix.fixes import fixer

    return fixer


def decide(cand: CandidateResult) -> tuple[Decision, str]:
    """KEPT, REJECTED or UNMEASURED for one measured variant, with the reason a reviewer reads."""
    if cand.status != "ok":
        return REJECTED, f"the patched script failed ({cand.status}): {cand.failure.message if cand.failure else None}"
    check = cand.numerics
    if check and not check.passed:
        return REJECTED, f"loss check failed: {check.reason}"
    speed = cand.speedup
    needed = stats.MIN_VERDICT_PAIRS
    if not speed:
        return UNMEASURED, (f"not measured enough: no speed measurement ({needed} pairs needed); not applied, "
                            "the static advice stands")
    pairs = speed.pairs
    figure = f"{speed.median:.2f}x [{speed.lo:.2f}, {speed.hi:.2f}]"
    if pairs < needed:
        return UNMEASURED, (f"not measured enough: {pairs} pair{'s' if pairs != 1 else ''} of the {needed} a "
                            f"decision needs (the time budget or --max-pairs ran out), {figure} so far; not "
                            "applied, the static advice stands (raise --budget-s/--max-pairs to measure it)")
    undecided = f"no verdict from {pairs} pairs"
    if speed.verdict == SLOWER:
        return REJECTED, f"measurably slower: {figure}"
    if speed.verdict == INCONCLUSIVE and speed.median < SLOWER_BELOW:
        return REJECTED, f"probably slower: median below {SLOWER_BELOW:.2f}x, {figure} ({undecided})"
    if speed.verdict == INCONCLUSIVE:
        return KEPT, f"not slower as far as measured: {figure} ({undecided}); loss check passed"
    return KEPT, f"{speed.verdict} ({figure}); loss check passed"




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
                  max_pairs: int = 10, min_pairs: int = stats.MIN_VERDICT_PAIRS, budget_s: float = 900.0, warmup: int | None = None,
                  steps: int | None = None, timeout_s: float = 600.0, seed: int = 0, cwd: Path | None = None,
                  real_cwd: bool = False, console: Console | None = None,
                  compare_settings: CompareSettings | None = None, fixer: Any = None, run=run_once) -> int:
    """Measure each applicable fix and the kept ones together; write the kept fixes and a report.

    ``settings`` is speedfix's configuration (``speedfix.workspace.config.Settings``): its enabled rules for
    this file, target torch version and unsafe-fixes choice are used unless ``select``,
    ``ignore``, ``torch_version`` or ``unsafe`` are given. ``budget_s`` and ``max_pairs`` apply
    to each comparison (the single fixes, then each combination attempt); ``compare_settings``
    replaces all the timing options at once. The runs see ``cwd`` (default: the current folder)
    through a scratch mirror of it, unless ``real_cwd``.

    Returns 0 when every applicable fix was kept (or none applied), 1 when at least one was
    rejected or not measured enough, 2 when the original script cannot be benchmarked or the input
    is unusable.
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
        seed=seed, warmup=warmup, steps=steps, max_pairs=max_pairs, min_pairs=min_pairs, budget_s=budget_s,
        timeout_s=timeout_s)
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
        specs, applied, fixes = [], {}, []
        for code in codes:
            outcome = fixed([code])
            if outcome.code == source or not outcome.applied:
                fixes.append(FixDecision.skipped(code, "the fix changed nothing in this script"))
                continue
            applied[code] = dict(outcome.applied)
            specs.append(RunSpec(variants.write(code, outcome.code), list(script_args), cwd, label=code,
                                 real_cwd=real_cwd))
        if not specs:
            console.print(f"{script}: the applicable fixes change nothing, nothing to verify")
            return EXIT_OK
        session = Session(original, compare_settings, run=run, progress=progress)
        try:
            session.prepare(specs)
            singles = session.compare(specs, kinds={s.name: numerics.class_of([s.name]) for s in specs})
        except ComparisonError as err:
            return _original_failed(err, script, script_args, report_md, report_json, console)
        verified_on = (singles.device.type if singles.device else None) or "?"
        for cand in singles.candidates:
            decision, reason = decide(cand)
            if verified_on != "cuda" and decision is KEPT and _gpu_only(cand.label):
                decision, reason = NEEDS_GPU, gpu_only_reason(verified_on, reason)
            fixes.append(FixDecision.of(cand, decision, reason, applied.get(cand.label, {})))
        kept_codes = [f.label for f in fixes if f.kept]
        combos: list[FixDecision] = []
        if len(kept_codes) > 1:
            kept_codes = _verify_combination(session, kept_codes, fixes, fixed, variants, original, combos)
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
    measured_torch = singles.env.torch if singles.env and singles.env.torch is not None else "?"
    result = VerifyReport(script=str(script), args=list(script_args),
                          date=_dt.datetime.now().isoformat(timespec="seconds"), seed=compare_settings.seed,
                          torch=measured_torch, device=verified_on, verified_on=verified_on, window=singles.window,
                          calibration=singles.calibration, fixes=fixes, combinations=combos, kept=kept_codes,
                          written=bool(write and kept_codes), summary=summary, load=singles.load,
                          caveat=numerics.CAVEAT, comparison=singles)
    report.write_json(report_json, result.to_json())
    report.write_text(report_md, report.verify_markdown(result))
    report.render_verify(result, console)
    console.print(f"report: {report_md} and {report_json}")
    if changed_meanwhile:
        return EXIT_ERROR
    return EXIT_REJECTED if rejected or unmeasured or needs_gpu else EXIT_OK


def _gpu_only(label: str) -> bool:
    """The fix's rule fires only on scripts that target CUDA: its effect exists only there."""
    from speedfix.engine.registry import rule_by_code

    rule = rule_by_code(label)
    return bool(rule and rule.gpu_only)


def gpu_only_reason(device: str, measured: str) -> str:
    return (f"measured on {device}, where this fix's effect cannot show: it targets CUDA, and so do its ways to "
            f"fail (pin_memory=True raises on CUDA tensors, yet passes bit-identically on a CPU); "
            f"the {device} figures: {measured}. Not applied: run --verify on a machine with a CUDA GPU")


def _verify_combination(session: Session, kept: list[str], fixes: list[FixDecision], fixed, variants: _Variants,
                        original: RunSpec, combos: list[FixDecision]) -> list[str]:
    """Measure the kept fixes together; drop the weakest while the combination fails.

    A combination that was not measured enough (budget or --max-pairs) proves nothing either way,
    and a smaller one would run out the same way: only the best single fix is kept.
    """
    speed = {f.label: f.speedup.median if f.speedup else 0.0 for f in fixes}
    final: list[str] = []
    decision = KEPT
    for attempt in range(MAX_COMBINATION_RETRIES + 1):
        label = "+".join(kept)
        spec = RunSpec(variants.write(f"combined{attempt}", fixed(kept).code), list(original.args), original.cwd,
                       label=label, real_cwd=original.real_cwd)
        cand = session.compare([spec], kinds={label: numerics.class_of(kept)}).candidates[0]
        decision, reason = decide(cand)
        combos.append(FixDecision.of(cand, decision, reason, {}, codes=list(kept)))
        if decision is KEPT:
            final = kept
            break
        if decision is UNMEASURED or len(kept) == 2 or attempt == MAX_COMBINATION_RETRIES:
            final = [max(kept, key=speed.__getitem__)]
            break
        weakest = min(kept, key=speed.__getitem__)
        kept = [c for c in kept if c != weakest]
    last = combos[-1]
    for i, f in enumerate(fixes):
        if f.kept and f.label not in final:  # only when a combination failed or was not measured enough
            if decision is UNMEASURED:
                reason = (f"kept alone, but the combination {last.label} was {last.reason}; "
                          f"only {'+'.join(final)}, the best alone, written")
                fixes[i] = replace(f, kept=False, decision=UNMEASURED, reason=reason)
            else:
                failed = next(c for c in reversed(combos) if not c.kept)
                reason = (f"passed alone, but the combination with it failed ({failed.reason}); "
                          f"kept {'+'.join(final)}")
                fixes[i] = replace(f, kept=False, decision=REJECTED, reason=reason)
    return final


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
