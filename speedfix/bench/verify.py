"""``speedfix apply SCRIPT --verify``: benchmark every fix, keep only the ones that hold up.

A "fix" here is every instance of one rule code. Policy:

1. Each applicable fix alone is measured against the original, all in one set of counterbalanced
   rounds (original, fix 1, fix 2, ... then reversed), so the original's runs are shared.
2. A fix is **kept** unless the patched script fails, the loss check fails (``numerics``: the
   required level depends on the rule - exact rewrites must leave the loss bitwise/A-A identical),
   it is measurably slower (95% interval below 0.98), or it is inconclusive with a median below
   0.98 ("probably slower"). Inconclusive fixes with a median >= 0.98 are kept and flagged: the
   static advice stands and the numbers do not contradict it.
3. The kept fixes together are measured again (fixes can interact). If the combination fails the
   same test, the kept fix with the smallest median speedup is dropped and the rest re-measured,
   at most ``MAX_COMBINATION_RETRIES`` times; after that only the single best fix is kept.
4. The kept set is written to the script with ``speedfix.fixer.write_fixed``; a Markdown and a
   JSON report say, per fix, the speedup with its interval, the loss check, the memory change,
   and kept or rejected and why.

Patched variants run as hidden sibling files (``.speedfix-verify-<code>-<name>.py``) in the
script's own directory, so sibling imports and ``__file__``-relative paths behave as in the
original; they are removed afterwards. The runs use the caller's working directory, as the
original would.
"""

from __future__ import annotations

import datetime as _dt
import tokenize
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.console import Console

from . import numerics, report
from .compare import CompareSettings, ComparisonError, Session, failure
from .runner import RunSpec, run_once, terminate_cleanly
from .stats import INCONCLUSIVE, SLOWER, SLOWER_BELOW

MAX_COMBINATION_RETRIES = 2
EXIT_OK, EXIT_REJECTED, EXIT_ERROR = 0, 1, 2


def load_fixer() -> Any:
    """The fixer module (``fix_code``, ``fixable_codes``, ``write_fixed``); tests pass a fake."""
    from speedfix import fixer

    return fixer


def decide(cand: dict) -> tuple[bool, str]:
    """Keep or reject one measured variant, with the reason a reviewer reads."""
    if cand["status"] != "ok":
        f = cand.get("failure") or {}
        return False, f"the patched script failed ({cand['status']}): {f.get('message')}"
    check = cand.get("numerics") or {}
    if check and not check.get("passed", True):
        return False, f"loss check failed: {check['reason']}"
    speed = cand.get("speedup")
    if not speed:
        return False, "no speed measurement"
    lo, hi = speed["bootstrap95_median"]
    figure = f"{speed['median']:.2f}x [{lo:.2f}, {hi:.2f}]"
    pairs = len(speed.get("per_pair") or ())
    undecided = f"no verdict from {pairs} pair{'s' if pairs != 1 else ''}" if pairs else "no verdict"
    if speed["verdict"] == SLOWER:
        return False, f"measurably slower: {figure}"
    if speed["verdict"] == INCONCLUSIVE and speed["median"] < SLOWER_BELOW:
        return False, f"probably slower: median below {SLOWER_BELOW:.2f}x, {figure} ({undecided})"
    if speed["verdict"] == INCONCLUSIVE:
        return True, f"not slower as far as measured: {figure} ({undecided}); loss check passed"
    return True, f"{speed['verdict']} ({figure}); loss check passed"


def _read_source(path: Path) -> tuple[str, str]:
    with tokenize.open(path) as f:  # honours a PEP 263 coding line and a BOM
        return f.read(), f.encoding


class _Variants:
    """Hidden sibling files for patched versions of the script; removed on exit."""

    def __init__(self, script: Path, encoding: str) -> None:
        self.script, self.encoding, self.paths = script, encoding, []

    def write(self, tag: str, code: str) -> Path:
        path = self.script.with_name(f".speedfix-verify-{tag}-{self.script.name}")
        path.write_text(code, encoding=self.encoding, newline="")
        self.paths.append(path)
        return path

    def __enter__(self) -> "_Variants":
        return self

    def __exit__(self, *exc) -> None:
        for path in self.paths:
            path.unlink(missing_ok=True)


def verify_script(script: Path, script_args: list[str], *, settings: Any = None,
                  select: Iterable[str] | None = None, ignore: Iterable[str] | None = None,
                  torch_version: str | None = None, unsafe: bool | None = None,
                  report_md: Path | None = None, report_json: Path | None = None, write: bool = True,
                  max_pairs: int = 10, min_pairs: int = 5, budget_s: float = 900.0, warmup: int | None = None,
                  steps: int | None = None, timeout_s: float = 600.0, seed: int = 0, cwd: Path | None = None,
                  console: Console | None = None, compare_settings: CompareSettings | None = None,
                  fixer: Any = None, run=run_once) -> int:
    """Measure each applicable fix and the kept ones together; write the kept fixes and a report.

    ``settings`` is speedfix's configuration (``speedfix.config.Settings``): its enabled rules for
    this file, target torch version and unsafe-fixes choice are used unless ``select``,
    ``ignore``, ``torch_version`` or ``unsafe`` are given. ``budget_s`` and ``max_pairs`` apply
    to each comparison (the single fixes, then each combination attempt); ``compare_settings``
    replaces all the timing options at once.

    Returns 0 when every applicable fix was kept (or none applied), 1 when at least one was
    rejected, 2 when the original script cannot be benchmarked or the input is unusable.
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
    source, encoding = _read_source(script)
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
    original = RunSpec(script, list(script_args), cwd, label="original")
    with terminate_cleanly(), _Variants(script, encoding) as variants, \
            report.RichProgress(console, "verifying") as progress:
        specs, applied, fixes = [], {}, []
        for code in codes:
            outcome = fixed([code])
            if outcome.code == source or not outcome.applied:
                fixes.append({"label": code, "kept": False, "skipped": True,
                              "reason": "the fix changed nothing in this script"})
                continue
            applied[code] = dict(outcome.applied)
            specs.append(RunSpec(variants.write(code, outcome.code), list(script_args), cwd, label=code))
        if not specs:
            console.print(f"{script}: the applicable fixes change nothing, nothing to verify")
            return EXIT_OK
        session = Session(original, compare_settings, run=run, progress=progress)
        try:
            session.prepare(specs)
            singles = session.compare(specs, kinds={s.name: numerics.class_of([s.name]) for s in specs})
        except ComparisonError as err:
            return _original_failed(err, script, script_args, report_md, report_json, console)
        for cand in singles["candidates"]:
            kept, reason = decide(cand)
            fixes.append(_fix_entry(cand, kept, reason, applied))
        kept_codes = [f["label"] for f in fixes if f["kept"]]
        combos = []
        if len(kept_codes) > 1:
            kept_codes = _verify_combination(session, kept_codes, fixes, fixed, variants, original, combos)
    final = fixed(kept_codes).code if kept_codes else source
    if write and kept_codes:
        fixer.write_fixed(script, final)
    rejected = [f for f in fixes if not f["kept"] and not f.get("skipped")]
    summary = (f"kept {len(kept_codes)} of {len(fixes)} fixes ({', '.join(kept_codes) or 'none'})"
               + (f"; rejected {', '.join(f['label'] for f in rejected)}" if rejected else "")
               + ("; written to the script" if write and kept_codes else "; script left unchanged"))
    env = singles.get("env") or {}
    result = {"schema": "speedfix.verify/0.1", "script": str(script), "args": list(script_args),
              "date": _dt.datetime.now().isoformat(timespec="seconds"), "seed": compare_settings.seed,
              "torch": env.get("torch", "?"), "device": (singles.get("device") or {}).get("type") or "?",
              "window": singles["window"], "calibration": singles["calibration"], "fixes": fixes,
              "combinations": combos, "kept": kept_codes, "written": bool(write and kept_codes),
              "summary": summary, "load": singles.get("load"), "caveat": numerics.CAVEAT, "comparison": _strip(singles)}
    report.write_json(report_json, result)
    report.write_text(report_md, report.verify_markdown(result))
    report.render_verify(result, console)
    console.print(f"report: {report_md} and {report_json}")
    return EXIT_REJECTED if rejected else EXIT_OK


def _fix_entry(cand: dict, kept: bool, reason: str, applied: dict) -> dict:
    return {"label": cand["label"], "kept": kept, "reason": reason, "applied": applied.get(cand["label"], {}),
            "metric": cand.get("metric"), "speedup": cand.get("speedup"), "numerics": cand.get("numerics"),
            "memory": cand.get("memory"), "failure": cand.get("failure")}


def _verify_combination(session: Session, kept: list[str], fixes: list[dict], fixed, variants: _Variants,
                        original: RunSpec, combos: list[dict]) -> list[str]:
    """Measure the kept fixes together; drop the weakest while the combination fails."""
    speed = {f["label"]: (f.get("speedup") or {}).get("median", 0.0) for f in fixes}
    final = None
    for attempt in range(MAX_COMBINATION_RETRIES + 1):
        label = "+".join(kept)
        spec = RunSpec(variants.write(f"combined{attempt}", fixed(kept).code), list(original.args), original.cwd,
                       label=label)
        cand = session.compare([spec], kinds={label: numerics.class_of(kept)})["candidates"][0]
        ok, reason = decide(cand)
        combos.append({**_fix_entry(cand, ok, reason, {}), "codes": list(kept)})
        if ok:
            final = kept
            break
        if len(kept) == 2 or attempt == MAX_COMBINATION_RETRIES:
            final = [max(kept, key=speed.__getitem__)]
            break
        weakest = min(kept, key=speed.__getitem__)
        kept = [c for c in kept if c != weakest]
    failed = next((c for c in reversed(combos) if not c["kept"]), None)
    for f in fixes:
        if f["kept"] and f["label"] not in final:  # only when a combination failed
            f["kept"] = False
            f["reason"] = (f"passed alone, but the combination with it failed ({failed['reason']}); "
                           f"kept {'+'.join(final)}")
    return final


def _strip(outcome: dict) -> dict:
    """The comparison for the JSON report, without the per-run trajectories (they stay per fix)."""
    return {k: v for k, v in outcome.items() if k not in ("candidates",)}


def _original_failed(err: ComparisonError, script: Path, args: list[str], report_md: Path, report_json: Path,
                     console: Console) -> int:
    f = failure(err.result)
    console.print(f"[red]error:[/] {err}")
    if f["stderr_tail"]:
        console.print(f["stderr_tail"], markup=False, highlight=False)
    result = {"schema": "speedfix.verify/0.1", "script": str(script), "args": list(args), "error": str(err),
              "failure": f, "fixes": [], "kept": [], "written": False}
    report.write_json(report_json, result)
    report.write_text(report_md, f"# speedfix apply --verify: `{script}`\n\nThe original script could not be "
                      f"benchmarked: {err}\n\n```\n{f['stderr_tail'].strip()}\n```\n")
    return EXIT_ERROR
