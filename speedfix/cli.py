"""The `speedfix` command line: scan, apply, rules, rule, bench.

Each command imports its machinery inside its function (the scan, apply, the rule catalog, the
benchmark's verification, the server): those imports point down the layers and keep the start of
`speedfix --help`, and of a scan whose files are all cached, short.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional

import typer

from speedfix import __version__
from speedfix.output import Reporter, ReportOptions, UnknownFormat, format_names, get_reporter
from speedfix.output._styled import surely_not_a_terminal
from speedfix.syntax.source import printable
from speedfix.workspace.config import ConfigError, Settings, resolve_settings
from speedfix.workspace.discovery import MissingPath, is_scanned

if TYPE_CHECKING:
    from rich.console import Console

    from speedfix.commands.apply import ApplyOutcome
    from speedfix.engine.results import FileError, Note

app = typer.Typer(
    name="speedfix",
    help=(
        "Find the speed a PyTorch training script leaves on the table, fix it, and prove each fix "
        "on a benchmark.\n\nExit codes: 0 nothing found/changed, 1 findings/changes, 2 errors."
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# Options shared by `scan` and `apply`.
SelectOption = typer.Option(None, "--select", help="Rule codes or prefixes to enable (comma-separated; replaces the config's list).", metavar="CODES")
IgnoreOption = typer.Option(None, "--ignore", help="Rule codes or prefixes to disable (comma-separated).", metavar="CODES")
ExtendSelectOption = typer.Option(None, "--extend-select", help="Rule codes or prefixes to enable on top of the selection.", metavar="CODES")
TorchVersionOption = typer.Option(None, "--torch-version", help="Target torch version (default: config, else the installed torch, else 2.4).", metavar="VERSION")
ConfigOption = typer.Option(None, "--config", help="Read settings from this pyproject.toml instead of searching for one.", exists=True, dir_okay=False)
IsolatedOption = typer.Option(False, "--isolated", help="Ignore every configuration file.")
ForceExcludeOption = typer.Option(False, "--force-exclude", help="Apply `exclude` also to files named on the command line (for pre-commit).")
MaxFileSizeOption = typer.Option(None, "--max-file-size-mb", help="Skip (and report) files bigger than this (default: config, else 10; 0: no limit).", metavar="MB")
MinImpactOption = typer.Option(None, "--min-impact", help="Leave out findings below this impact: high, medium or low (default: config, else low).", metavar="LEVEL")
FileTimeLimitOption = typer.Option(None, "--file-time-limit", help="Skip (and report) a file whose analysis takes longer (default: config, else 120; 0: no limit).", metavar="SECONDS")


def _stderr() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def _fail(message: str) -> typer.Exit:
    _stderr().print(f"error: {printable(message)}", markup=False)
    return typer.Exit(2)


def _settings(paths: list[Path], **options: object) -> Settings:
    try:
        return resolve_settings(paths, output_formats=format_names(), **options)  # type: ignore[arg-type]
    except ConfigError as exc:
        raise _fail(str(exc)) from None


@contextmanager
def scan_progress() -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on standard error for long scans, only when it is a terminal."""
    console = None if surely_not_a_terminal(sys.stderr) else _stderr()
    if console is None or not console.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("scanning"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
        console=console, transient=True,
    ) as bar:
        task = None

        def update(done: int, total: int) -> None:
            nonlocal task
            if total < _PROGRESS_FROM:
                return
            if task is None:
                task = bar.add_task("scan", total=total)
            bar.update(task, completed=done)

        yield update


_PROGRESS_FROM = 50  # files; shorter scans finish before a bar would help


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"speedfix {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True, help="Show the version and exit."),
) -> None:
    _escape_what_cannot_be_encoded()


def _escape_what_cannot_be_encoded() -> None:
    """A file name the terminal's encoding cannot show (`é` with PYTHONIOENCODING=ascii, a name
    that is not UTF-8) is printed with backslash escapes instead of stopping the run."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure") and getattr(stream, "errors", None) == "strict":
            stream.reconfigure(errors="backslashreplace")


# ---------------------------------------------------------------------------- reports
def _reporter(name: str, report: str) -> Reporter:
    try:
        return get_reporter(name, report)
    except UnknownFormat as exc:
        raise _fail(f"--output-format {exc}") from None


def _report_options(settings: Settings | None = None, *, stderr: bool = False, to_file: bool = False, **fields: Any) -> ReportOptions:
    """Styles only when the report goes to a terminal that takes them."""
    target = settings.target if settings is not None else None
    if to_file or surely_not_a_terminal(sys.stderr if stderr else sys.stdout):
        return ReportOptions(target=target, color=False, **fields)  # plain text: no rich to ask
    from rich.console import Console

    probe = Console(stderr=stderr)
    color = probe.is_terminal and probe.color_system is not None
    return ReportOptions(target=target, color=color, width=probe.width, **fields)


def _print_errors(errors: Iterable[FileError | Note]) -> None:
    shown: set[str] = set()
    for error in errors:
        line = printable(error.render())
        if line not in shown:  # `scan --fix` reads every file twice: say each problem once
            shown.add(line)
            sys.stderr.write(line + "\n")


def _run_apply(paths: list[Path], settings: Settings, *, diff: bool, summary: bool = True, show_fixes: bool = False) -> ApplyOutcome:
    """`speedfix apply` (and `scan --fix`/`--diff`): fix or show the diff; the summary goes to
    standard error with a diff (standard output is the patch)."""
    from speedfix.commands.apply import apply_paths

    try:
        from rich.console import Console

        outcome = apply_paths(paths, settings, write=not diff, show_diff=diff, console=Console(highlight=False))
    except MissingPath as exc:
        raise _fail(str(exc)) from None
    if summary:
        _print_errors(outcome.errors)
        options = _report_options(stderr=diff, dry_run=diff, unsafe_fixes=settings.unsafe_fixes, show_fixes=show_fixes)
        (sys.stderr if diff else sys.stdout).write(get_reporter("text", "apply_summary").apply_summary(outcome, options))
    return outcome


def _run_add_noqa(paths: list[Path], settings: Settings) -> typer.Exit:
    """`scan --add-noqa`: what was added on standard output, problems on standard error."""
    from speedfix.commands.noqa import add_noqa_paths

    try:
        outcome = add_noqa_paths(paths, settings)
    except MissingPath as exc:
        raise _fail(str(exc)) from None
    _print_errors([*outcome.errors, *outcome.notes])
    files = len(outcome.files)
    sys.stdout.write(f"Added {outcome.added} noqa directive{'s' if outcome.added != 1 else ''}"
                     f" to {files} file{'s' if files != 1 else ''}.\n")
    return typer.Exit(outcome.exit_code)


def _exit(code: int, exit_zero: bool = False) -> typer.Exit:
    return typer.Exit(0 if exit_zero and code == 1 else code)


# ---------------------------------------------------------------------------- scan
@app.command()
def scan(
    paths: list[Path] = typer.Argument(None, help="Files and folders to scan (default: the current folder).", show_default=False, metavar="PATH"),
    output_format: Optional[str] = typer.Option(None, "--output-format", "--format", help=f"Output format: {', '.join(format_names())} (default: config, else text).", metavar="FORMAT"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the report to this file instead of standard output.", dir_okay=False),
    fix: bool = typer.Option(False, "--fix", help="Apply the safe fixes first (as `speedfix apply`), then report what is left."),
    unsafe_fixes: Optional[bool] = typer.Option(None, "--unsafe-fixes/--no-unsafe-fixes", help="With --fix or --diff: also apply the fixes that can change numerics or behaviour (default: config, else no)."),
    diff: bool = typer.Option(False, "--diff", help="Print the diff of the fixes and write nothing (as `speedfix apply --diff`); exit 1 if there is a diff."),
    show_fixes: bool = typer.Option(False, "--show-fixes", help="Text format: with --fix or --diff, list what was fixed per file and rule; otherwise show each finding's fix and diff under it."),
    statistics: bool = typer.Option(False, "--statistics", help="Print only the number of findings per rule (text or json format)."),
    add_noqa: bool = typer.Option(False, "--add-noqa", help="Add `# noqa: SFxxx` to every line with findings (a baseline for an existing codebase); report nothing else."),
    exit_zero: bool = typer.Option(False, "--exit-zero", help="Exit 0 even when there are findings (errors still exit 2)."),
    select: Optional[list[str]] = SelectOption,
    ignore: Optional[list[str]] = IgnoreOption,
    extend_select: Optional[list[str]] = ExtendSelectOption,
    torch_version: Optional[str] = TorchVersionOption,
    config: Optional[Path] = ConfigOption,
    isolated: bool = IsolatedOption,
    force_exclude: bool = ForceExcludeOption,
    max_file_size_mb: Optional[float] = MaxFileSizeOption,
    file_time_limit: Optional[float] = FileTimeLimitOption,
    min_impact: Optional[str] = MinImpactOption,
    bench_result: Optional[list[Path]] = typer.Option(None, "--bench-result", help="A `speedfix bench SCRIPT --json` result whose measurements decide the impact of the script's findings (default: SCRIPT's <stem>.speedfix-bench.json, if there is one).", exists=True, dir_okay=False, metavar="FILE"),
    no_summary: bool = typer.Option(False, "--no-summary", help="Text format: only the finding lines."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help="Files analysed in parallel (default: all cores)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Neither read nor write the .speedfix_cache/ results cache."),
) -> None:
    """Report missed optimizations: `path:line:col: CODE [*] message (impact: LEVEL)` per finding, the highest impact first ([*]: a fix exists).

    A file that does not parse is a finding too: SF000 (invalid-syntax)."""
    from speedfix.commands.measurements import BenchResultError
    from speedfix.commands.scan import scan_paths

    targets = list(paths or [Path(".")])
    settings = _settings(
        targets, config=config, select=select, ignore=ignore, extend_select=extend_select,
        torch_version=torch_version, unsafe_fixes=unsafe_fixes, output_format=output_format, isolated=isolated,
        force_exclude=force_exclude, max_file_size_mb=max_file_size_mb, file_time_limit=file_time_limit,
        min_impact=min_impact,
    )
    if output is not None and is_scanned(output, targets, settings):
        raise _fail(f"--output {output} is one of the files being scanned; the report would replace it (choose another file)")
    if add_noqa:
        if fix or diff:
            raise _fail("--add-noqa cannot be combined with --fix or --diff (fix first, then add the baseline)")
        raise _run_add_noqa(targets, settings)
    reporter = _reporter(settings.output_format, "statistics" if statistics else "scan")
    if diff:  # as in ruff, --diff only previews the fixes (with or without --fix)
        raise _exit(_run_apply(targets, settings, diff=True, show_fixes=show_fixes).exit_code, exit_zero)
    fixed = _run_apply(targets, settings, diff=False, summary=False) if fix else None
    try:
        with scan_progress() as progress:
            result = scan_paths(
                targets, settings, details=reporter.fix_details or (show_fixes and not fix), jobs=jobs,
                use_cache=settings.cache and not no_cache, progress=progress, bench_results=bench_result,
            )
    except MissingPath as exc:
        raise _fail(str(exc)) from None
    except BenchResultError as exc:
        raise _fail(f"--bench-result {exc}") from None
    _print_errors([*(fixed.errors if fixed else []), *result.errors])
    if reporter.name != "text":  # the text report lists them itself; others keep standard output parseable
        _print_errors(result.notes)
    options = _report_options(
        settings, to_file=output is not None, summary=not no_summary, show_fixes=show_fixes, fixed=fixed,
    )
    report = reporter.statistics(result, options) if statistics else reporter.scan(result, options)
    if output is not None:
        try:
            output.write_text(report, encoding="utf-8", errors="backslashreplace")  # a name that is not UTF-8
        except OSError as exc:
            raise _fail(f"cannot write {output}: {exc.strerror or exc}") from None
    elif report:
        sys.stdout.write(report)
    _finished_cleanly()
    raise _exit(2 if fixed is not None and fixed.errors else result.exit_code, exit_zero)


# ---------------------------------------------------------------------------- apply
@app.command()
def apply(
    ctx: typer.Context,
    paths: list[Path] = typer.Argument(..., help="Files and folders to fix (with --verify: one script).", metavar="PATH"),
    diff: bool = typer.Option(False, "--diff", help="Show what would change as a unified diff; write nothing."),
    unsafe_fixes: Optional[bool] = typer.Option(None, "--unsafe-fixes/--no-unsafe-fixes", help="Also apply fixes that can change numerics or behaviour (default: config, else no)."),
    verify: bool = typer.Option(False, "--verify", help="Benchmark the fixes on SCRIPT (args after --) and keep only those that pay off with matching loss: all together first, a search for the ones that fail only if that combination fails."),
    per_fix: bool = typer.Option(False, "--per-fix", help="--verify: measure every fix alone, then the kept ones together (slower)."),
    max_pairs: int = typer.Option(6, "--max-pairs", min=1, help="--verify: at most this many ABBA pairs per comparison (6: exactly 6, the fewest with a 95% interval)."),
    budget_s: float = typer.Option(900.0, "--budget-s", min=1, help="--verify: time budget per comparison (seconds; its calibration runs and seed band included)."),
    real_cwd: bool = typer.Option(False, "--real-cwd", help="--verify: run the script in the working directory itself, not in a scratch mirror of it (files it writes there then change)."),
    select: Optional[list[str]] = SelectOption,
    ignore: Optional[list[str]] = IgnoreOption,
    extend_select: Optional[list[str]] = ExtendSelectOption,
    torch_version: Optional[str] = TorchVersionOption,
    config: Optional[Path] = ConfigOption,
    isolated: bool = IsolatedOption,
    force_exclude: bool = ForceExcludeOption,
    max_file_size_mb: Optional[float] = MaxFileSizeOption,
    file_time_limit: Optional[float] = FileTimeLimitOption,
    min_impact: Optional[str] = MinImpactOption,
) -> None:
    """Rewrite files with the selected rules' fixes (safe ones unless --unsafe-fixes); --min-impact fixes only the findings of that impact or higher."""
    settings = _settings(
        paths, config=config, select=select, ignore=ignore, extend_select=extend_select,
        torch_version=torch_version, unsafe_fixes=unsafe_fixes, isolated=isolated, force_exclude=force_exclude,
        max_file_size_mb=max_file_size_mb, file_time_limit=file_time_limit, min_impact=min_impact,
    )
    if verify:
        from speedfix.bench.verify import verify_script

        if len(paths) != 1 or not paths[0].is_file():
            raise _fail("--verify takes exactly one script (arguments for it go after --)")
        script_args = list((ctx.obj or {}).get("script_args", []))
        raise typer.Exit(verify_script(paths[0], script_args, settings=settings, max_pairs=max_pairs, budget_s=budget_s,
                                       real_cwd=real_cwd, per_fix=per_fix))
    raise typer.Exit(_run_apply(paths, settings, diff=diff).exit_code)


# ---------------------------------------------------------------------------- rules
RuleFormatOption = typer.Option("text", "--output-format", "--format", help=f"Output format: {', '.join(format_names('rule_page'))}.", metavar="FORMAT")


@app.command("rules")
def list_rules(output_format: str = RuleFormatOption) -> None:
    """List every rule: code, name, fix availability, summary."""
    from speedfix.engine.registry import all_rules

    reporter = _reporter(output_format, "rule_list")
    sys.stdout.write(reporter.rule_list(all_rules(), _report_options()))


@app.command("rule")
def show_rule(
    code: str = typer.Argument(..., help="A rule code (SF101) or name (dataloader-no-workers)."),
    output_format: str = RuleFormatOption,
) -> None:
    """Show a rule's documentation."""
    from speedfix.engine.registry import rule_by_code

    reporter = _reporter(output_format, "rule_page")
    rule = rule_by_code(code)
    if rule is None:
        raise _fail(f"unknown rule {code!r} (see `speedfix rules`)")
    sys.stdout.write(reporter.rule_page(rule, _report_options()))


def _register_bench() -> None:
    try:
        from speedfix.bench.cli import CONTEXT_SETTINGS, bench
    except ImportError:  # the benchmark module is optional at import time
        return
    app.command("bench", context_settings=CONTEXT_SETTINGS)(bench)


_register_bench()


# ---------------------------------------------------------------------------- server
@app.command("server")
def server(
    stdio: bool = typer.Option(False, "--stdio", help="Talk over standard input/output (the default and only transport; accepted for editor clients that pass it)."),
) -> None:
    """Run the Language Server (LSP over stdio) for editors: diagnostics as you type and quick fixes."""
    try:  # pygls is an optional extra: `scan` and `apply` never import it
        from speedfix.server import serve
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in ("pygls", "lsprotocol", "cattrs"):
            raise
        raise _fail("`speedfix server` needs pygls: pip install 'speedfix[server]'") from None
    raise typer.Exit(serve())


def main(argv: list[str] | None = None) -> None:
    """Entry point; ends by SystemExit, as a program that embeds speedfix expects. Arguments after
    `--` belong to the benchmarked script."""
    args = list(sys.argv[1:] if argv is None else argv)
    script_args: list[str] = []
    if "--" in args:
        split = args.index("--")
        args, script_args = args[:split], args[split + 1:]
    app(args=args, prog_name="speedfix", obj={"script_args": script_args})


# Set by a command whose work is done and written, with no child process, temporary file or
# open file left for the interpreter's teardown to close.
_clean = False


def _finished_cleanly() -> None:
    global _clean
    _clean = True


def run() -> None:
    """The `speedfix` program (its console script and `python -m speedfix`): ``main``, then, after
    a command that finished cleanly, the process ends at once. The interpreter's own teardown
    frees every loaded module and object one by one (libcst, the rules): 0.1 s, a tenth of a
    scan of a hundred files on two cores, with nothing left for it to do."""
    global _clean
    _clean = False
    try:
        main()
    except SystemExit as exc:
        if _clean and (exc.code is None or isinstance(exc.code, int)):
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except (OSError, ValueError):
                raise exc from None  # a closed pipe: the interpreter reports it as it always does
            os._exit(exc.code or 0)
        raise
