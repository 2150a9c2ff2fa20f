"""Rendering: rich tables for the terminal, Markdown for a reviewer, JSON for machines.

Rich prints plain text when the output is not a terminal, so the same calls serve CI logs.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from . import compare, numerics, stats
from .results import (OK, Comparison, Decision, FixDecision, Load, LossCheck, MemoryChange, RunResult, RuntimeFacts, Speedup,
                      SuiteResult, VerifyReport, Window)
from .timeplan import fmt_duration

SPARKS = "▁▂▃▄▅▆▇█"


# ---------------------------------------------------------------- formatting helpers
def fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def fmt_bytes(value: float | None) -> str:
    if not value:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return "-"


def fmt_seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s (not timed)"


def fmt_speedup(speedup: Speedup | None) -> str:
    if not speedup:
        return "-"
    if not math.isfinite(speedup.hi):  # too few pairs for any 95% interval
        pairs = speedup.pairs or len(speedup.per_pair)
        return f"{speedup.median:.2f}x (no interval: {pairs} pair{'s' if pairs != 1 else ''})"
    return f"{speedup.median:.2f}x [{speedup.lo:.2f}, {speedup.hi:.2f}]"


def fmt_window(window: Window) -> str:
    return f"{window.warmup} warm-up + {window.steps} timed steps"


def not_on_gpu_note(report: VerifyReport) -> str | None:
    """What a verify report measured without a CUDA GPU cannot show."""
    device = report.verified_on
    if device in (None, "cuda"):
        return None
    return (f"verified on {device}, not on a CUDA GPU: fixes for CUDA scripts are not verified here "
            "(their speed and their failures show only on the GPU)")


def sparkline(values: list, width: int = 40) -> str:
    finite = [v for v in values if v is not None]
    if not finite:
        return ""
    if len(finite) > width:  # average into buckets
        size = len(finite) / width
        finite = [sum(b) / len(b) for i in range(width) if (b := finite[int(i * size):int((i + 1) * size)] or finite[-1:])]
    lo, hi = min(finite), max(finite)
    span = (hi - lo) or 1.0
    return "".join(SPARKS[int((v - lo) / span * (len(SPARKS) - 1))] for v in finite)


def write_text(path: Path, text: str) -> None:
    """Atomic (a reader never sees half a report), with the usual umask-derived permissions."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _finite(obj):
    """NaN/inf as null: strict JSON readers reject them, and a long run must not die on writing."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write_json(path: Path, data: dict) -> None:
    write_text(path, json.dumps(_finite(data), indent=2, allow_nan=False, default=str) + "\n")


def print_table(console: Console, table: Table) -> None:
    """Logs and pipes get 80 columns by default, which folds every cell; tables need room."""
    console.print(table, width=None if console.is_terminal else max(console.width, 160))


def load_note(load: Load | None) -> str | None:
    """A warning when other work competed for the CPUs during the measurement."""
    if not load or load.max_loadavg is None or not load.cpus:
        return None
    if load.max_loadavg <= 0.75 * load.cpus + 1:
        return None
    return (f"warning: the machine was busy (1-minute load average up to {load.max_loadavg:.1f} on "
            f"{load.cpus} CPUs); expect wide intervals and treat the figures with care")


# ---------------------------------------------------------------- one run
def warn_real_files_modified(paths: list[str], console: Console) -> None:
    """Files too large to copy into the scratch mirror are linked: say when a run changed one."""
    if paths:
        console.print(f"[yellow]warning: the script changed {len(paths)} file(s) in your folder through the "
                      f"scratch mirror's links to files too large to copy: {', '.join(paths[:5])}"
                      f"{' ...' if len(paths) > 5 else ''}[/]")


def warn_refused_writes(result: RunResult, console: Console) -> None:
    """The write guard refused changes to the user's files: say which (the script may have failed on it)."""
    guard = result.guard
    if guard and guard.refusals:
        paths = sorted({f"{r.event} {r.path}" for r in guard.refused})
        console.print(f"[yellow]the benchmark kept your files unchanged: it refused {guard.refusals} change(s) the "
                      f"script tried to make to them ({'; '.join(paths[:5])}{' ...' if len(paths) > 5 else ''}); "
                      "--real-cwd lets the script change your files[/]", highlight=False)


def epochs_text(result: RunResult) -> str | None:
    """How epochs were found, and the time between them that the window left out."""
    epochs = result.epochs
    if not result.reported or not result.observed_steps:
        return None
    if epochs.detected_by is None:
        return "not seen (no DataLoader in the training loop): the window is continuous time"
    warmup = result.steps.warmup or 0
    between = [b for b in epochs.between if b.phase == "window" and b.at_step >= warmup]
    how = "an epoch ends where the training DataLoader runs out"
    if not between:
        return (f"{epochs.ended} ended, none inside the window ({how})" if epochs.ended
                else f"none ended while the script ran ({how})")
    parts = [f"{b.seconds:.1f} s after epoch {b.after_epoch}" + (f" ({b.compilations} compilation(s))"
                                                                 if b.compilations else "") for b in between[:4]]
    more = f", and {len(between) - 4} more" if len(between) > 4 else ""
    return f"between epochs: {', '.join(parts)}{more}; measured apart, not in the window ({how})"


def render_run(result: RunResult, console: Console) -> None:
    s = result.summary()
    env, device, steps = result.env, result.device, result.steps
    data, loss, compiled = result.data, result.loss, result.compile
    table = Table(title=f"speedfix bench: {Path(result.script or '?').name}", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    style = "green" if s.status == OK else "red"
    table.add_row("status", f"[{style}]{s.status}[/]: {s.message}")
    table.add_row("device", f"{device.describe()} ({device.param_dtype or '?'} parameters), "
                  f"torch {_or_unknown(env.torch)}, python {_or_unknown(env.python)}")
    table.add_row("steps", f"{steps.warmup or 0} warm-up + {s.steps_timed or 0} timed "
                  f"({steps.observed_primary or 0} observed, {steps.optimizers or 0} optimizer(s))")
    if result.clock == "backward":
        table.add_row("clock", "backward() calls: the script steps no torch.optim optimizer "
                      "(hand-written parameter updates)")
    if compiled.compilations:
        settled = "" if compiled.settled is not False else "; [yellow]still compiling when the window opened[/]"
        in_window = compiled.in_window or 0
        restarts = compiled.window_restarts
        again = (f"; the window was measured again after compiling inside it at step "
                 f"{', '.join(str(r.get('at_step')) for r in restarts)} (warm-up extended)" if restarts else "")
        table.add_row("compile", f"{compiled.seconds:.1f} s in {compiled.compilations} compilation(s), "
                      f"paid once per run; {in_window or 'none'} inside the window{settled}{again}")
    if s.window_s:
        table.add_row("window", f"{s.window_s:.2f} s of training")
    if epochs := epochs_text(result):
        table.add_row("epochs", epochs)
    table.add_row("steps/s", fmt_rate(s.steps_per_s))
    source = data.batch_size_source
    table.add_row("samples/s", fmt_rate(s.samples_per_s) +
                  (f" (batch {data.batch_size} from the {source.replace('_', ' ')})" if source else ""))
    table.add_row("data wait", fmt_pct(s.data_wait_fraction) + (" of step time" if s.data_wait_fraction is not None else ""))
    if s.step_median_s and result.timing.step_time_s:
        table.add_row("step time", f"median {s.step_median_s * 1e3:.2f} ms, p10 {s.step_p10_s * 1e3:.2f} ms, "
                      f"max {result.timing.step_time_s.max * 1e3:.2f} ms")
    table.add_row("peak memory", f"{fmt_bytes(s.peak_bytes)} {s.peak_kind}".strip())
    if s.harness_share is not None:
        table.add_row("harness", f"{s.harness_share:.2%} of the window spent in speedfix's own hooks")
    values = loss.values
    if values:
        table.add_row("loss", f"{s.loss_first:.4g} -> {s.loss_last:.4g} over {len(values)} backward() calls "
                      f"{sparkline(values)}")
        if loss.nonfinite:
            table.add_row("non-finite", f"[red]{loss.nonfinite} NaN/inf losses[/]")
        if loss.grad_scaler_seen:
            table.add_row("GradScaler", f"{loss.grad_scaler_skipped_steps or 0} skipped steps of "
                          f"{loss.grad_scaler_step_calls or 0}")
    for name, value in runtime_rows(result):
        table.add_row(name, value)
    print_table(console, table)
    render_runtime_findings(result, console)
    warn_real_files_modified(result.runner.real_files_modified, console)
    warn_refused_writes(result, console)
    if s.status != OK:
        tail = result.runner.stderr_tail.strip()
        if tail:
            console.print("[bold]stderr (tail):[/]")
            console.print(tail[-3000:], markup=False, highlight=False)


def _onoff(value: object) -> str:
    return "?" if value is None else ("on" if value else "off")


def runtime_rows(result: RunResult) -> list[tuple[str, str]]:
    """What the script configured, as the run saw it: one row per object that decides speed."""
    facts = result.runtime
    if facts is None:
        return []
    root = str(Path(result.script).parent)
    rows = []
    for loader in facts.loaders[:4]:
        role = "training" if loader.trained_on else ("iterated" if loader.epochs else "not iterated")
        rows.append(("DataLoader", f"{loader.where(root)} ({role}): num_workers={loader.num_workers}, "
                     f"pin_memory={loader.pin_memory}, persistent_workers={loader.persistent_workers}, "
                     f"batch_size={loader.batch_size}" + (f", made by {loader.via}" if loader.via else "")))
    for opt in facts.optimizers[:3]:
        rows.append(("optimizer", f"{opt.type.rsplit('.', 1)[-1]} at {opt.where(root)}: fused={opt.fused}, "
                     f"foreach={opt.foreach} ({opt.param_dtype or '?'} parameters on {opt.param_device or '?'})"))
    if facts.autocast is not None:
        ac = facts.autocast
        rows.append(("autocast", f"{ac.dtype} on {ac.device_type}" if ac.enabled else "off around the training forward"))
    for call in facts.compiled[:3]:
        rows.append(("torch.compile", f"{call.target.rsplit('.', 1)[-1]} at {call.where(root)} (backend={call.backend}"
                     + (f", mode={call.mode}" if call.mode else "") + ")"))
    model = facts.model
    if model is not None:
        extra = [f"{model.parameters:,} parameters" if model.parameters is not None else "",
                 f"under {model.wrapper}" if model.wrapper else "", "compiled" if model.compiled else "",
                 f"DDP {model.ddp}" if model.ddp else "", f"FSDP {model.fsdp}" if model.fsdp else "",
                 "gradient checkpointing" if model.gradient_checkpointing else ""]
        rows.append(("model", f"{(model.inner_type or model.type).rsplit('.', 1)[-1]}"
                     + (f" ({', '.join(e for e in extra if e)})" if any(extra) else "")))
    if facts.reentrant_checkpoint:
        rows.append(("checkpointing", "reentrant torch.utils.checkpoint (a backward inside the backward)"))
    if facts.flags is not None:
        f = facts.flags
        rows.append(("flags", f"float32 matmul precision {f.float32_matmul_precision}, cuDNN TF32 "
                     f"{_onoff(f.cudnn_allow_tf32)}, cudnn.benchmark {_onoff(f.cudnn_benchmark)}, deterministic "
                     f"{_onoff(f.deterministic_algorithms or f.cudnn_deterministic)}, anomaly detection "
                     f"{_onoff(f.anomaly_detection)}"))
    for name, settings in facts.frameworks.items():
        shown = ", ".join(f"{k}={v}" for k, v in settings.items() if v is not None)
        rows.append((name, shown or "-"))
    return rows


def _codes(facts: RuntimeFacts | None) -> str:
    """The codes of a variant's run-time findings (``SF101, SF401``), ``none`` or ``-`` (not known)."""
    if facts is None:
        return "-"
    return ", ".join(dict.fromkeys(f.code for f in facts.findings)) or "none"


def runtime_finding_lines(result: RunResult) -> list[str]:
    """``SF101 data.py:18: ...`` for each run-time finding, and whether a scan reports it too."""
    facts = result.runtime
    if facts is None:
        return []
    root = str(Path(result.script).parent)
    lines = []
    for f in facts.findings:
        how = {True: "confirmed at run time (speedfix scan reports it too)",
               False: "found at run time (speedfix scan does not see it)", None: "found at run time"}[f.static]
        impact = f", {f.impact} impact" if f.impact else ""
        lines.append(f"{f.code} {f.name} {f.where(root)}: {f.message} [{how}{impact}]")
    return lines


def render_runtime_findings(result: RunResult, console: Console) -> None:
    lines = runtime_finding_lines(result)
    if lines:
        device = result.device.type or "?"
        console.print(f"[bold]found at run time[/] (on {device}; `speedfix rule CODE` tells more):")
        for line in lines:
            console.print(f"  {line}", markup=False, highlight=False)


# ---------------------------------------------------------------- A/B
def _or_unknown(value: object) -> object:
    return "?" if value is None else value


def _numerics_text(check: LossCheck | None) -> str:
    if not check:
        return "-"
    mark = "ok" if check.passed else "FAIL"
    return f"{mark}: {check.level}"


def render_compare(outcome: Comparison, console: Console) -> None:
    window = outcome.window
    orig, cands = outcome.original_runs, outcome.candidates
    table = Table(title="speedfix bench: A/B comparison")
    table.add_column("")
    table.add_column(f"{outcome.original.label} (original)")
    for cand in cands:
        table.add_column(cand.label)
    rows = [("status", "ok", [c.status for c in cands]),
            ("steps/s", fmt_rate(orig.steps_per_s), [fmt_rate(c.runs.steps_per_s) for c in cands]),
            ("samples/s", fmt_rate(orig.samples_per_s), [fmt_rate(c.runs.samples_per_s) for c in cands]),
            ("data wait", fmt_pct(orig.data_wait_fraction), [fmt_pct(c.runs.data_wait_fraction) for c in cands]),
            ("peak memory", fmt_bytes(orig.peak_bytes), [fmt_bytes(c.runs.peak_bytes) for c in cands]),
            *([("between epochs", fmt_seconds(orig.between_epochs_s), [fmt_seconds(c.runs.between_epochs_s)
                                                                        for c in cands])]
              if any(r.between_epochs_s for r in (orig, *(c.runs for c in cands))) else []),
            ("speedup [95% CI]", "1.00x", [fmt_speedup(c.speedup) for c in cands]),
            ("verdict", "", [c.speedup.verdict if c.speedup else "-" for c in cands]),
            ("loss check", "", [_numerics_text(c.numerics) for c in cands])]
    if outcome.original_runtime is not None:
        rows.append(("found at run time", _codes(outcome.original_runtime), [_codes(c.runtime) for c in cands]))
    for name, first, rest in rows:
        table.add_row(name, first, *rest)
    print_table(console, table)
    warn_real_files_modified(outcome.real_files_modified, console)
    console.print(f"{outcome.pairs} pairs in alternating order (ABBA), every run {fmt_window(window)} "
                  f"(the original's window ~{(orig.window_s or 0):.1f} s); stopped: "
                  f"{outcome.stop_reason}; speedup metric: "
                  f"{', '.join(sorted({c.metric or '-' for c in cands}))}.")
    note = load_note(outcome.load)
    if note:
        console.print(f"[yellow]{note}[/]")
    for cand in cands:
        if cand.failure:
            f = cand.failure
            console.print(f"[red]{cand.label} failed ({f.status}): {f.message}[/]")
            if f.stderr_tail:
                console.print(f.stderr_tail[-2000:], markup=False, highlight=False)
        if cand.numerics:
            console.print(f"loss check, {cand.label}: {cand.numerics.reason}")
    console.print(f"[dim]{outcome.caveat}[/]")


# ---------------------------------------------------------------- suite
def render_suite(suite: SuiteResult, console: Console) -> None:
    table = Table(title=f"speedfix bench --suite ({suite.size} sizes, {suite.device}, torch {suite.torch})")
    for col in ("workload", "samples/s before", "after (speedfix)", "speedup [95% CI]", "expert", "expert speedup",
                "share of expert gain", "loss check", "peak memory before -> after"):
        table.add_column(col)
    for row in suite.workloads:
        if row.error:
            table.add_row(row.name, f"[red]error: {row.error}[/]", *[""] * 7)
            continue
        table.add_row(row.name, fmt_rate(row.before), fmt_rate(row.after), fmt_speedup(row.speedup),
                      fmt_rate(row.expert), fmt_speedup(row.expert_speedup), fmt_pct(row.captured),
                      row.loss_check, f"{fmt_bytes(row.peak_before)} -> {fmt_bytes(row.peak_after)}")
    print_table(console, table)
    note = load_note(suite.load)
    if note:
        console.print(f"[yellow]{note}[/]")
    console.print("[dim]samples/s are medians over the timed pairs; the interval is the 95% distribution-free interval "
                  "of the median speedup. Share of expert gain = (speedup - 1) / (expert speedup - 1), shown "
                  f"when the expert is measurably faster. {numerics.CAVEAT}[/]")


def suite_markdown(suite: SuiteResult) -> str:
    lines = ["| workload | fixes applied | samples/s before | after | speedup [95% CI] | expert samples/s | "
             "expert speedup | share of expert gain | loss check | peak memory before -> after |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in suite.workloads:
        if row.error:
            lines.append(f"| {row.name} | error: {row.error} |" + " |" * 8)
            continue
        lines.append(f"| {row.name} | {', '.join(row.fixes) or '-'} | {fmt_rate(row.before)} | "
                     f"{fmt_rate(row.after)} | {fmt_speedup(row.speedup)} | {fmt_rate(row.expert)} | "
                     f"{fmt_speedup(row.expert_speedup)} | {fmt_pct(row.captured)} | {row.loss_check} | "
                     f"{fmt_bytes(row.peak_before)} -> {fmt_bytes(row.peak_after)} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- verify
def render_verify(report: VerifyReport, console: Console) -> None:
    table = Table(title=f"speedfix apply --verify: {Path(report.script).name}")
    for col in ("fix", "measured as", "speedup [95% CI]", "verdict", "loss check", "memory", "decision"):
        table.add_column(col)
    for fix in report.fixes:
        style = "green" if fix.kept else ("red" if fix.decision is Decision.REJECTED else "yellow")
        table.add_row(fix.label, _measured_as(fix), fmt_speedup(fix.speedup),
                      fix.speedup.verdict if fix.speedup else "-", _numerics_text(fix.numerics), _fmt_mem(fix.memory),
                      f"[{style}]{fix.decision.value}[/]")
    if note := not_on_gpu_note(report):
        console.print(f"[yellow]{note}[/]")
    print_table(console, table)
    warn_real_files_modified(report.comparison.real_files_modified, console)
    for fix in report.fixes:
        console.print(f"{fix.label}: {fix.decision.value}, {fix.reason}", highlight=False)
    console.print(report.summary)
    note = load_note(report.load)
    if note:
        console.print(f"[yellow]{note}[/]")
    console.print(f"[dim]{numerics.CAVEAT}[/]")


def _measured_as(fix: FixDecision) -> str:
    """Whose figures a fix's row shows: its own, or those of the set of fixes that decided it."""
    if not fix.speedup and not fix.numerics:
        return "-"
    return fix.measured_as or "alone"


def _fmt_mem(memory: MemoryChange | None) -> str:
    if not memory or not memory.ratio:
        return "-"
    return f"{memory.ratio - 1:+.1%}"


def verify_markdown(report: VerifyReport) -> str:
    out = [f"# speedfix apply --verify: `{report.script}`", "",
           f"- date: {report.date}", f"- device: {report.device}, torch {report.torch}",
           *([f"- **{note}**"] if (note := not_on_gpu_note(report)) else []),
           f"- arguments: `{' '.join(report.args) or '(none)'}`",
           f"- window: {fmt_window(report.window)} (the first comparison's; every set's is in its details), "
           f"seed {report.seed}, the same for every run of a comparison",
           f"- mode: {report.mode or 'per-fix'}",
           f"- result: {report.summary}",
           *([f"- {note}"] if (note := load_note(report.load)) else []), "",
           "| fix | measured as | speedup [95% CI] | verdict | pairs | loss check | peak memory | decision |",
           "|---|---|---|---|---|---|---|---|"]
    for fix in report.fixes:
        speed = fix.speedup
        out.append(f"| {fix.label} | {_measured_as(fix)} | {fmt_speedup(speed)} | {speed.verdict if speed else '-'} | "
                   f"{speed.pairs if speed else '-'} | {_numerics_text(fix.numerics)} | {_fmt_mem(fix.memory)} | "
                   f"{fix.decision.value}: {fix.reason} |")
    if report.combinations:
        out += ["", "## Sets of fixes measured", "", "| set | speedup [95% CI] | verdict | loss check | decision |",
                "|---|---|---|---|---|"]
        for combo in report.combinations:
            speed = combo.speedup
            out.append(f"| {combo.label} | {fmt_speedup(speed)} | {speed.verdict if speed else '-'} | "
                       f"{_numerics_text(combo.numerics)} | {combo.decision.value}: {combo.reason} |")
    out += ["", "## Details", ""]
    for fix in report.fixes:
        out += _fix_details(fix)
    if report.mode == "per-fix":
        strategy = ("Every fix was measured alone against the original, all in one set of rounds, then the kept "
                    "ones together.")
    else:
        strategy = ("All the fixes were measured together first; only when that combination failed, a bisection "
                    "added halves of the fixes to the set that passed so far, each step its own comparison, down "
                    "to the single fix that fails, and the largest passing set found was kept.")
    out += ["## Method", "",
            f"{strategy} Each variant runs in a fresh process with the same seed, warm-up and window (the same "
            "steps of the script), sized by a calibration run of each so that the slowest variant's runs take "
            "about the time targets; rates are compared. Runs alternate in counterbalanced order (original "
            "first, then reversed). A decision needs at least "
            f"{stats.MIN_VERDICT_PAIRS} pairs (the fewest with a 95% distribution-free interval); with fewer a "
            "set is not measured enough. A set is kept unless it is measurably slower (the interval below 0.98), "
            "inconclusive with a median below 0.98, or fails the loss check (over the steps both variants ran); a "
            "fix for a CUDA script measured without a CUDA GPU is never called verified. Each comparison calls an "
            "identical script faster or slower at most 2/2^n of the time with n pairs; m comparisons at most m "
            "times that.", "", numerics.CAVEAT, ""]
    return "\n".join(out)


def _fix_details(fix: FixDecision) -> list[str]:
    out = [f"### {fix.label}", ""]
    if fix.applied:
        out.append(f"- fixes applied: {', '.join(f'{k} x{v}' for k, v in fix.applied.items())}")
    if fix.measured_as:
        out.append(f"- measured as part of {fix.measured_as} (the figures below are that set's)")
    speed = fix.speedup
    if speed:
        out.append(f"- speedup ({fix.metric}): {fmt_speedup(speed)}, "
                   f"min {speed.min:.3f}, max {speed.max:.3f} over {speed.pairs} pairs")
    if fix.window:
        out.append(f"- window: {fmt_window(fix.window)}")
    if fix.numerics:
        out.append(f"- loss check ({fix.numerics.kind} rewrite): {fix.numerics.reason}")
    if fix.failure:
        f = fix.failure
        out += [f"- the patched script failed ({f.status}): {f.message}", "", "```", f.stderr_tail.strip(), "```"]
    out += [f"- decision: {fix.decision.value} - {fix.reason}", ""]
    return out


# ---------------------------------------------------------------- progress
class RichProgress(compare.Progress):
    """A progress bar (run n of at most m, time left) on a terminal; one line per run otherwise."""

    def __init__(self, console: Console, title: str) -> None:
        self.console = console
        self.live = console.is_terminal
        self.total = 0
        self.started = 0.0
        self.left: float | None = None  # the planned runs' expected time (compare.Progress.expect)
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                            console=console, transient=True, disable=not self.live)
        self.task = self.bar.add_task(title, total=0)

    def __enter__(self) -> "RichProgress":
        self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.stop()

    def plan(self, runs: int) -> None:
        self.total = max(0, self.total + runs)
        self.bar.update(self.task, total=self.total)

    def start(self, description: str) -> None:
        self.started = time.monotonic()
        self.bar.update(self.task, description=description)
        if not self.live:
            done = int(self.bar.tasks[0].completed)
            self.console.print(f"[{done + 1}/{self.total}] {description} ...", highlight=False)

    def expect(self, seconds_left: float | None) -> None:
        self.left = seconds_left

    def finish(self, result: RunResult) -> None:
        self.bar.advance(self.task)
        if not self.live:
            s = result.summary()
            left = f", about {fmt_duration(self.left)} left" if self.left is not None else ""
            self.console.print(f"    {s.status}, {fmt_rate(s.steps_per_s)} steps/s, "
                               f"{time.monotonic() - self.started:.1f} s{left}", highlight=False)

    def note(self, text: str) -> None:
        self.console.print(text, highlight=False)
