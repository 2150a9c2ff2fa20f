"""The ``speedfix bench`` command (registered by speedfix.cli) and its exit codes.

Script arguments come after ``--``; speedfix's ``main()`` splits them off and passes them as
``ctx.obj["script_args"]``.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from .stats import MIN_VERDICT_PAIRS  # pure python: cheap to import with the CLI

# The measuring machinery is imported inside the command: registering `bench` with the CLI must
# not slow down `speedfix scan` (and the pre-commit hook).

if TYPE_CHECKING:
    from rich.console import Console

    from .runner import RunSpec
    from .settings import CompareSettings

EXIT_OK, EXIT_CHECK_FAILED, EXIT_ERROR = 0, 1, 2
# How speedfix.cli registers the command: an unknown option before `--` reaches SCRIPTS, where
# ``_misplaced_script_args`` refuses it with the command line that passes it to the script.
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "ignore_unknown_options": True}


def _script_args(ctx: typer.Context) -> list[str]:
    obj = ctx.obj if isinstance(ctx.obj, dict) else {}
    return list(obj.get("script_args") or [])


def _misplaced_script_args(scripts: list[Path], script_args: list[str], suite_only: list[list[str]]) -> str | None:
    """The message for script arguments given before ``--`` (they would not reach the script):
    unknown options among SCRIPTS, or ``suite_only`` options (each with its values) without --suite."""
    names = [str(s) for s in scripts]
    first = next((i for i, name in enumerate(names) if name.startswith("-") and name != "-"), None)
    if first is None and not suite_only:
        return None
    positional = names if first is None else names[:first]
    moved = [*(word for option in suite_only for word in option), *(names[first:] if first is not None else []),
             *script_args]
    flags = "/".join(option[0] for option in suite_only)
    what = (f"{names[first]} is not an option of speedfix bench" if first is not None
            else f"{flags} {'is an option' if len(suite_only) == 1 else 'are options'} of speedfix bench --suite only")
    command = " ".join(["speedfix bench", *positional, "--", *moved])
    return f"{what}: arguments for the script go after `--`, as in: {command}"


def _require_torch(console: Console) -> None:
    if importlib.util.find_spec("torch") is None:
        console.print("[red]error:[/] the benchmark runs scripts with torch; install it with "
                      "pip install 'speedfix[bench]'")
        raise typer.Exit(EXIT_ERROR)


def bench(
    ctx: typer.Context,
    scripts: list[Path] = typer.Argument(None, help="SCRIPT to measure, or A.py B.py to compare.",
                                         show_default=False),
    suite: bool = typer.Option(False, "--suite", help="Run the bundled benchmark suite."),
    json_file: Path | None = typer.Option(None, "--json", help="Also write the full result as JSON to FILE."),
    markdown: Path | None = typer.Option(None, "--markdown", help="Suite: also write the table as Markdown."),
    max_pairs: int = typer.Option(10, "--max-pairs", min=1, help="Comparison: at most this many ABBA pairs."),
    min_pairs: int = typer.Option(MIN_VERDICT_PAIRS, "--min-pairs", min=1, help="Comparison: at least this many pairs."),
    budget_s: float = typer.Option(900.0, "--budget-s", min=1, help="Comparison: time budget per comparison (seconds; its calibration runs and seed band included)."),
    warmup: int | None = typer.Option(None, "--warmup", min=1, show_default=False,
                                      help="Warm-up optimizer steps (default: at least 20 steps and --warmup-s seconds)."),
    steps: int | None = typer.Option(None, "--steps", min=1, show_default=False,
                                     help="Timed optimizer steps (default: at least 20 steps and --window-s seconds)."),
    warmup_s: float = typer.Option(2.0, "--warmup-s", min=0, help="Minimum warm-up time (seconds)."),
    window_s: float = typer.Option(5.0, "--window-s", min=0, help="Minimum timed window (seconds)."),
    timeout_s: float = typer.Option(600.0, "--timeout-s", min=1, help="Per-run time limit (seconds)."),
    seed: int = typer.Option(0, "--seed", help="Seed for python, numpy and torch (the same for every run)."),
    tiny: bool | None = typer.Option(None, "--tiny/--full", show_default=False,
                                     help="Suite: tiny CPU sizes or the real sizes (default: tiny when CUDA is unavailable)."),
    fixtures: Path | None = typer.Option(None, "--fixtures", help="Suite: directory holding suite.toml."),
    workload: list[str] = typer.Option(None, "--workload", help="Suite: run only this workload (repeatable)."),
    cwd: Path | None = typer.Option(None, "--cwd", help="The folder the scripts see as their working directory (default: the current one); they run in a scratch mirror of it unless --real-cwd."),
    real_cwd: bool = typer.Option(False, "--real-cwd", help="Run the script from its real folder in the real working "
                                  "directory, where it may change your files. Default: from a scratch mirror of both, "
                                  "and changes to your files (through the mirror's links to large files and crowded "
                                  "folders, or by absolute path) are refused."),
) -> None:
    """Run training scripts unchanged and measure them: steps/s, samples/s, data-wait share, peak memory and the loss trajectory.

    speedfix bench train.py [-- script args]: measure one script.

    speedfix bench A.py B.py [-- script args]: compare B against A in ABBA pairs.

    speedfix bench --suite: the bundled workloads, original vs speedfix's fixes vs an expert version.

    Exit codes: 0 ok; 1 a check failed (single run: the window did not complete, or torch.compile kept compiling inside it; comparison or suite: slower, or the loss check failed); 2 usage error, or a script that cannot be benchmarked (crash, timeout, no optimizer steps).
    """
    from rich.console import Console

    console = Console()
    scripts = list(scripts or [])
    if not suite:
        given = ([["--tiny" if tiny else "--full"]] if tiny is not None else []) + \
                [["--workload", name] for name in workload or ()] + \
                [[flag, str(value)] for flag, value in (("--fixtures", fixtures), ("--markdown", markdown)) if value]
        misplaced = _misplaced_script_args(scripts, _script_args(ctx), given)
        if misplaced:
            console.print(f"[red]error:[/] {misplaced}", highlight=False)
            raise typer.Exit(EXIT_ERROR)
    if suite == bool(scripts) or len(scripts) > 2:
        console.print("[red]usage:[/] speedfix bench SCRIPT | A.py B.py | --suite  [-- script args]")
        raise typer.Exit(EXIT_ERROR)
    for script in scripts:
        if not script.is_file():
            console.print(f"[red]error:[/] no such script: {script}")
            raise typer.Exit(EXIT_ERROR)
    _require_torch(console)
    from .settings import CompareSettings
    from .runner import RunSpec, terminate_cleanly, use_real_cwd

    settings = CompareSettings(seed=seed, warmup=warmup, steps=steps, warmup_s=warmup_s, window_s=window_s,
                               max_pairs=max_pairs, min_pairs=min_pairs, budget_s=budget_s, timeout_s=timeout_s)
    args = _script_args(ctx)
    with terminate_cleanly(), use_real_cwd(real_cwd):
        if suite:
            code = _suite(settings, fixtures, tiny, workload, json_file, markdown, console)
        elif len(scripts) == 1:
            code = _single(RunSpec(scripts[0], args, cwd), settings, json_file, console)
        else:
            code = _pair(scripts, args, cwd, settings, json_file, console)
    raise typer.Exit(code)



def _single(spec: RunSpec, s: CompareSettings, json_file: Path | None, console: Console) -> int:
    from . import advice, report
    from .runner import run_once

    config = s.run_config(warmup_steps=s.warmup or s.min_warmup_steps, warmup_s=0.0 if s.warmup else s.warmup_s,
                          steps=s.steps or s.min_steps, window_s=0.0 if s.steps else s.window_s)
    with report.RichProgress(console, "bench") as progress:
        progress.plan(1)
        progress.start(f"running {spec.name}")
        result = run_once(spec, config)
        progress.finish(result)
    result = advice.with_findings(result)
    if json_file:
        report.write_json(json_file, result.to_json())
    report.render_run(result, console)
    return {"ok": EXIT_OK, "incomplete": EXIT_CHECK_FAILED, "unsettled": EXIT_CHECK_FAILED}.get(result.status, EXIT_ERROR)


def _pair(scripts: list[Path], args: list[str], cwd: Path | None, s: CompareSettings, json_file: Path | None,
          console: Console) -> int:
    from . import report
    from .compare import ComparisonError, Session
    from .runner import RunSpec
    from .stats import SLOWER

    a, b = scripts
    same = a.name == b.name
    spec_a = RunSpec(a, args, cwd, label=f"A: {a.name}" if same else a.name)
    spec_b = RunSpec(b, args, cwd, label=f"B: {b.name}" if same else b.name)
    started = time.monotonic()
    with report.RichProgress(console, "compare") as progress:
        session = Session(spec_a, s, progress=progress)
        try:
            session.prepare([spec_b])
            outcome = session.compare([spec_b], budget_s=max(1.0, s.budget_s - (time.monotonic() - started)))
        except ComparisonError as err:
            console.print(f"[red]error:[/] {err}")
            report.render_run(err.result, console)
            if json_file:
                report.write_json(json_file, {"error": str(err), "original": err.result.to_json()})
            return EXIT_ERROR
    if json_file:
        report.write_json(json_file, outcome.to_json())
    report.render_compare(outcome, console)
    cand = outcome.candidates[0]
    if cand.status != "ok":
        return EXIT_ERROR
    slower = bool(cand.speedup and cand.speedup.verdict == SLOWER)
    failed_loss = bool(cand.numerics and not cand.numerics.passed)
    return EXIT_CHECK_FAILED if slower or failed_loss else EXIT_OK


def _suite(s: CompareSettings, fixtures: Path | None, tiny: bool | None, only: list[str] | None,
           json_file: Path | None, markdown: Path | None, console: Console) -> int:
    from . import report
    from .stats import SLOWER
    from .suite import run_suite

    try:
        result = run_suite(fixtures=fixtures, tiny=tiny, only=only or None, settings=s, console=console)
    except (FileNotFoundError, ImportError) as err:
        console.print(f"[red]error:[/] {err}")
        return EXIT_ERROR
    if json_file:
        report.write_json(json_file, result.to_json())
    if markdown:
        report.write_text(markdown, report.suite_markdown(result))
    report.render_suite(result, console)
    rows = result.workloads
    if any(r.error or "speedfix" in (r.failures or {}) for r in rows):
        return EXIT_ERROR
    bad = [r for r in rows if (r.speedup and r.speedup.verdict == SLOWER) or r.loss_check_failed]
    return EXIT_CHECK_FAILED if bad else EXIT_OK
