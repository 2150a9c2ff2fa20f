"""The `speedfix` command line: scan, apply, rules, rule, bench."""

from __future__ import annotations

import io
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

import typer
from rich.console import Console

from speedfix import __version__
from speedfix.config import OUTPUT_FORMATS, ConfigError, Settings, resolve_settings
from speedfix.discovery import MissingPath

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


def _stdout() -> Console:
    console = Console(highlight=False, soft_wrap=False)
    if not console.is_terminal:
        console.width = max(console.width, 120)  # logs and pipes: keep table rows on one line
    return console


def _stderr() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def _fail(message: str) -> typer.Exit:
    _stderr().print(f"error: {message}", markup=False)
    return typer.Exit(2)


def _settings(paths: list[Path], **options: object) -> Settings:
    try:
        return resolve_settings(paths, **options)  # type: ignore[arg-type]
    except ConfigError as exc:
        raise _fail(str(exc)) from None


@contextmanager
def scan_progress() -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on standard error for long scans, only when it is a terminal."""
    console = _stderr()
    if not console.is_terminal:
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
    pass


# ---------------------------------------------------------------------------- scan
@app.command()
def scan(
    paths: list[Path] = typer.Argument(None, help="Files and folders to scan (default: the current folder).", show_default=False, metavar="PATH"),
    output_format: Optional[str] = typer.Option(None, "--format", help=f"Output format: {', '.join(OUTPUT_FORMATS)} (default: text).", metavar="FORMAT"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the report to this file instead of standard output.", dir_okay=False),
    select: Optional[list[str]] = SelectOption,
    ignore: Optional[list[str]] = IgnoreOption,
    extend_select: Optional[list[str]] = ExtendSelectOption,
    torch_version: Optional[str] = TorchVersionOption,
    config: Optional[Path] = ConfigOption,
    isolated: bool = IsolatedOption,
    force_exclude: bool = ForceExcludeOption,
    no_summary: bool = typer.Option(False, "--no-summary", help="Text format: only the finding lines."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help="Files analysed in parallel (default: all cores)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Neither read nor write the .speedfix_cache/ results cache."),
) -> None:
    """Report missed optimizations: `path:line:col: CODE [*] message` per finding ([*]: a fix exists)."""
    from speedfix.scan import scan_paths

    targets = list(paths or [Path(".")])
    if output_format is not None and output_format not in OUTPUT_FORMATS:
        raise _fail(f"--format must be one of {', '.join(OUTPUT_FORMATS)}, not {output_format!r}")
    settings = _settings(
        targets, config=config, select=select, ignore=ignore, extend_select=extend_select,
        torch_version=torch_version, output_format=output_format, isolated=isolated, force_exclude=force_exclude,
    )
    fmt = settings.output_format
    try:
        with scan_progress() as progress:
            result = scan_paths(
                targets, settings, details=fmt in ("json", "markdown", "sarif"), jobs=jobs,
                use_cache=settings.cache and not no_cache, progress=progress,
            )
    except MissingPath as exc:
        raise _fail(str(exc)) from None
    errors = _stderr()
    for error in result.errors:
        errors.print(error.render(), markup=False)
    report = _render(result, settings, fmt, to_file=output is not None, no_summary=no_summary)
    if output is not None:
        try:
            output.write_text(report, encoding="utf-8")
        except OSError as exc:
            raise _fail(f"cannot write {output}: {exc.strerror or exc}") from None
    elif report:
        sys.stdout.write(report)
    raise typer.Exit(result.exit_code)


def _render(result, settings: Settings, fmt: str, *, to_file: bool, no_summary: bool) -> str:  # type: ignore[no-untyped-def]
    """The report as text; the text format prints itself (colours on a terminal) unless saved."""
    if fmt == "json":
        from speedfix.output.json_format import render_json

        return render_json(result)
    if fmt == "markdown":
        from speedfix.output.markdown import render_markdown

        return render_markdown(result, settings.target)
    if fmt == "sarif":
        from speedfix.output.sarif import render_sarif

        return render_sarif(result)
    if fmt == "github":
        from speedfix.output.github import render_github

        return render_github(result)
    from speedfix.output.text import print_findings, print_summary

    buffer = io.StringIO() if to_file else None
    console = Console(file=buffer, highlight=False, width=100) if buffer else _stdout()
    print_findings(console, result.findings)
    if not no_summary:
        print_summary(console, result)
    return buffer.getvalue() if buffer else ""


# ---------------------------------------------------------------------------- apply
@app.command()
def apply(
    ctx: typer.Context,
    paths: list[Path] = typer.Argument(..., help="Files and folders to fix (with --verify: one script).", metavar="PATH"),
    diff: bool = typer.Option(False, "--diff", help="Show what would change as a unified diff; write nothing."),
    unsafe_fixes: Optional[bool] = typer.Option(None, "--unsafe-fixes/--no-unsafe-fixes", help="Also apply fixes that can change numerics or behaviour (default: config, else no)."),
    verify: bool = typer.Option(False, "--verify", help="Benchmark every fix on SCRIPT (args after --) and keep only those that pay off with matching loss."),
    max_pairs: int = typer.Option(10, "--max-pairs", min=1, help="--verify: at most this many ABBA pairs per comparison."),
    budget_s: float = typer.Option(900.0, "--budget-s", min=1, help="--verify: time budget per comparison (seconds)."),
    select: Optional[list[str]] = SelectOption,
    ignore: Optional[list[str]] = IgnoreOption,
    extend_select: Optional[list[str]] = ExtendSelectOption,
    torch_version: Optional[str] = TorchVersionOption,
    config: Optional[Path] = ConfigOption,
    isolated: bool = IsolatedOption,
    force_exclude: bool = ForceExcludeOption,
) -> None:
    """Rewrite files with the selected rules' fixes (safe ones unless --unsafe-fixes)."""
    settings = _settings(
        paths, config=config, select=select, ignore=ignore, extend_select=extend_select,
        torch_version=torch_version, unsafe_fixes=unsafe_fixes, isolated=isolated, force_exclude=force_exclude,
    )
    if verify:
        from speedfix.bench.verify import verify_script

        if len(paths) != 1 or not paths[0].is_file():
            raise _fail("--verify takes exactly one script (arguments for it go after --)")
        script_args = list((ctx.obj or {}).get("script_args", []))
        raise typer.Exit(verify_script(paths[0], script_args, settings=settings, max_pairs=max_pairs, budget_s=budget_s))
    from speedfix.apply import apply_paths, print_apply_summary

    try:
        outcome = apply_paths(paths, settings, write=not diff, show_diff=diff, console=_stdout())
    except MissingPath as exc:
        raise _fail(str(exc)) from None
    print_apply_summary(outcome, settings, console=_stderr() if diff else _stdout(), dry_run=diff)
    raise typer.Exit(outcome.exit_code)


# ---------------------------------------------------------------------------- rules
@app.command("rules")
def list_rules(
    output_format: str = typer.Option("text", "--format", help="text or json.", metavar="FORMAT"),
) -> None:
    """List every rule: code, name, fix availability, summary."""
    from rich.table import Table

    from speedfix.registry import all_rules

    rules = all_rules()
    if output_format == "json":
        import json

        data = [
            {"code": r.code, "name": r.name, "fix": r.fix_availability(), "severity": r.severity.value,
             "gpu_only": r.gpu_only, "summary": r.summary}
            for r in rules
        ]
        typer.echo(json.dumps(data, indent=2))
        return
    if output_format != "text":
        raise _fail("--format must be text or json")
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("code", "name", "fix", "summary"):
        table.add_column(column, overflow="fold")
    for rule in rules:
        table.add_row(rule.code, rule.name, rule.fix_availability(), rule.summary)
    _stdout().print(table)


@app.command("rule")
def show_rule(code: str = typer.Argument(..., help="A rule code (SF101) or name (dataloader-no-workers).")) -> None:
    """Show a rule's documentation."""
    from speedfix.registry import rule_by_code

    rule = rule_by_code(code)
    if rule is None:
        raise _fail(f"unknown rule {code!r} (see `speedfix rules`)")
    versions = []
    if rule.min_torch:
        versions.append(f"torch >= {rule.min_torch}")
    if rule.max_torch:
        versions.append(f"torch < {rule.max_torch}")
    header = [
        f"# {rule.code} {rule.name}",
        "",
        f"{rule.summary}.",
        "",
        f"- Fix: {rule.fix_availability()}" + (f" ({rule.fix_title})" if rule.fix_title else ""),
        f"- Severity: {rule.severity.value}",
        f"- Applies to: {', '.join(versions) if versions else 'every torch version'}"
        + ("; CUDA scripts only" if rule.gpu_only else ""),
        "",
    ]
    text = "\n".join(header) + rule.docs() + "\n"
    console = _stdout()
    if console.is_terminal:
        from rich.markdown import Markdown

        console.print(Markdown(text))
    else:
        sys.stdout.write(text)


def _register_bench() -> None:
    try:
        from speedfix.bench.cli import bench
    except ImportError:  # the benchmark module is optional at import time
        return
    app.command("bench", context_settings={"help_option_names": ["-h", "--help"]})(bench)


_register_bench()


def main(argv: list[str] | None = None) -> None:
    """Entry point. Arguments after `--` belong to the benchmarked script."""
    args = list(sys.argv[1:] if argv is None else argv)
    script_args: list[str] = []
    if "--" in args:
        split = args.index("--")
        args, script_args = args[:split], args[split + 1:]
    app(args=args, prog_name="speedfix", obj={"script_args": script_args})
