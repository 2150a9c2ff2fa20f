"""`speedfix scan`: output formats, exit codes, selection, configuration, suppression, bad input."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest

LINE = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+):(?P<col>\d+): (?P<code>SF\d{3}) (?P<fix>\[\*\] )?(?P<message>.+)$")


IMPACT = re.compile(r" \(impact: (high|medium|low)(?:, measured)?\)$")  # the end of every finding line


def finding_lines(stdout: str) -> list[re.Match]:
    return [m for m in map(LINE.match, stdout.splitlines()) if m]


def codes(stdout: str) -> list[str]:
    return [m["code"] for m in finding_lines(stdout)]


def test_text_output_lines_and_summary(run_cli, train_script, write):
    path = write("train.py", train_script)
    result = run_cli("scan", path)
    assert result.exit_code == 1
    lines = finding_lines(result.stdout)
    assert [m["code"] for m in lines] == ["SF501", "SF101", "SF102", "SF301", "SF203", "SF104"]  # x, y: one SF104
    first = lines[0]
    assert first["path"] == str(path) and (first["line"], first["col"]) == ("7", "13")
    assert first["fix"] and first["message"] == "`model` is trained without `torch.compile` (impact: high)"
    # stable order: the highest impact first, then by path, line, column, code
    impacts = [IMPACT.search(m["message"])[1] for m in lines]
    assert impacts == ["high"] * 2 + ["medium"] * 2 + ["low"] * 2  # one sync per step: medium; non_blocking from an unpinned loader: low
    keys = [(["high", "medium", "low"].index(i), int(m["line"]), int(m["col"]), m["code"]) for i, m in zip(impacts, lines)]
    assert keys == sorted(keys)
    # the summary, grouped by rule, follows the finding lines
    assert "Found 6 findings in 1 file: 2 high impact, 2 medium, 2 low" in result.stdout
    assert re.search(r"SF104\s+blocking-transfer\s+1\s+low\s+safe", result.stdout)


def test_lines_never_wrap_when_piped(run_cli, train_script, write):
    long_name = "a_really_long_directory_name_that_makes_the_line_long" * 2
    path = write(f"{long_name}/train.py", train_script)
    result = run_cli("scan", path, "--no-summary")
    assert all(LINE.match(line) for line in result.stdout.splitlines())
    assert "\x1b[" not in result.stdout  # no colour codes when not a terminal


def test_clean_file_exits_zero(run_cli, train_script, write):
    path = write("clean.py", "import torch\nx = torch.zeros(3)\n")
    result = run_cli("scan", path)
    assert result.exit_code == 0
    assert "All checks passed" in result.stdout


def test_paths_are_relative_to_the_current_folder(run_cli, train_script, write, tmp_path):
    write("pkg/train.py", train_script)
    result = run_cli("scan", "pkg", "--no-summary", cwd=tmp_path)
    assert {m["path"] for m in finding_lines(result.stdout)} == {"pkg/train.py"}


def test_directories_skip_vcs_venvs_caches_and_build_output(run_cli, train_script, write, tmp_path):
    write("src/train.py", train_script)
    for skipped in (".git/hooks/x.py", "__pycache__/x.py", "build/lib/x.py", "dist/x.py", "node_modules/x.py"):
        write(skipped, train_script)
    write("myenv/pyvenv.cfg", "home = /usr/bin\n")
    write("myenv/lib/site.py", train_script)
    result = run_cli("scan", ".", "--no-summary", cwd=tmp_path)
    assert {m["path"] for m in finding_lines(result.stdout)} == {"src/train.py"}


def test_select_ignore_extend_select(run_cli, train_script, write):
    path = write("train.py", train_script)
    assert set(codes(run_cli("scan", path, "--select", "SF104").stdout)) == {"SF104"}
    assert set(codes(run_cli("scan", path, "--select", "SF1").stdout)) == {"SF101", "SF102", "SF104"}
    assert set(codes(run_cli("scan", path, "--select", "SF101,SF203").stdout)) == {"SF101", "SF203"}
    ignored = set(codes(run_cli("scan", path, "--ignore", "SF1", "--ignore", "SF501").stdout))
    assert ignored == {"SF203", "SF301"}
    extended = set(codes(run_cli("scan", path, "--select", "SF104", "--extend-select", "SF301").stdout))
    assert extended == {"SF104", "SF301"}


def test_unknown_selector_is_a_usage_error(run_cli, train_script, write):
    path = write("train.py", train_script)
    result = run_cli("scan", path, "--select", "SF999")
    assert result.exit_code == 2
    assert "unknown rule selector `SF999`" in result.stderr


def test_pyproject_configuration_is_found_by_walking_up(run_cli, train_script, write, tmp_path):
    write("pyproject.toml", '[tool.speedfix]\nignore = ["SF1"]\nper-file-ignores = {"scripts/*" = ["SF301"]}\n')
    write("src/deep/train.py", train_script)
    write("scripts/train.py", train_script)
    deep = set(codes(run_cli("scan", tmp_path / "src" / "deep" / "train.py").stdout))
    assert deep == {"SF203", "SF301", "SF501"}
    script = set(codes(run_cli("scan", tmp_path / "scripts" / "train.py").stdout))
    assert script == {"SF203", "SF501"}
    # the command line wins over the configuration
    assert set(codes(run_cli("scan", tmp_path / "src", "--select", "SF101").stdout)) == {"SF101"}


def test_configuration_exclude(run_cli, train_script, write, tmp_path):
    write("pyproject.toml", '[tool.speedfix]\nexclude = ["legacy/*", "*_old.py"]\n')
    write("legacy/train.py", train_script)
    write("train_old.py", train_script)
    write("train.py", train_script)
    result = run_cli("scan", ".", "--no-summary", cwd=tmp_path)
    assert {m["path"] for m in finding_lines(result.stdout)} == {"train.py"}


def test_bad_configuration_is_a_clear_error(run_cli, train_script, write, tmp_path):
    write("pyproject.toml", '[tool.speedfix]\nselekt = ["SF1"]\n')
    path = write("train.py", train_script)
    result = run_cli("scan", path)
    assert result.exit_code == 2
    assert "unknown key(s) in [tool.speedfix]: selekt" in result.stderr
    assert "pyproject.toml" in result.stderr


def test_torch_version_switches_advice(run_cli, train_script, write):
    path = write("train.py", train_script)
    assert "SF203" in codes(run_cli("scan", path, "--torch-version", "2.4").stdout)
    # torch.amp.GradScaler does not exist before 2.3: no deprecation advice then
    assert "SF203" not in codes(run_cli("scan", path, "--torch-version", "2.2").stdout)
    result = run_cli("scan", path, "--torch-version", "two")
    assert result.exit_code == 2 and "not a torch version" in result.stderr


def test_noqa_on_the_line_and_for_the_file(run_cli, train_script, write):
    code = train_script.replace(
        "x, y = x.to(device), y.to(device)", "x, y = x.to(device), y.to(device)  # noqa: SF104"
    ).replace("running += loss.item()", "running += loss.item()  # noqa")
    path = write("train.py", code)
    found = codes(run_cli("scan", path).stdout)
    assert "SF104" not in found and "SF301" not in found and "SF101" in found
    other_tool = write("other.py", train_script.replace("loss.item()", "loss.item()  # noqa: E501"))
    assert "SF301" in codes(run_cli("scan", other_tool).stdout)
    whole_file = write("skip.py", "# speedfix: noqa\n" + train_script)
    assert run_cli("scan", whole_file).exit_code == 0
    some_codes = write("some.py", "# speedfix: noqa: SF101, SF102\n" + train_script)
    found = codes(run_cli("scan", some_codes).stdout)
    assert "SF101" not in found and "SF102" not in found and "SF104" in found


def test_syntax_error_is_a_finding_and_other_files_still_scanned(run_cli, train_script, write, tmp_path):
    write("a_broken.py", "import torch\ndef f(:\n    pass\n")
    write("b_train.py", train_script)
    result = run_cli("scan", ".", "--no-summary", cwd=tmp_path)
    assert result.exit_code == 1 and result.stderr == ""
    assert result.stdout.startswith("a_broken.py:2:7: SF000 SyntaxError: invalid syntax (impact: high)\n")
    assert {m["path"] for m in finding_lines(result.stdout)} == {"a_broken.py", "b_train.py"}


def test_syntax_error_in_a_file_without_torch_is_still_reported(run_cli, train_script, write):
    path = write("util.py", "def f(:\n")
    result = run_cli("scan", path, "--no-summary")
    assert result.exit_code == 1 and result.stdout == f"{path}:1:7: SF000 SyntaxError: invalid syntax (impact: high)\n"


def test_python2_files_in_a_tree_are_findings_not_errors(run_cli, train_script, write, tmp_path):
    write("py2/old_train.py", 'import torch\nprint "epoch", epoch\n')
    write("py2/tabs.py", "import torch\nif x:\n\tif y:\n        pass\n")
    write("train.py", train_script)
    result = run_cli("scan", ".", "--no-summary", "--select", "SF000", cwd=tmp_path)
    assert result.exit_code == 1 and result.stderr == ""
    assert result.stdout.splitlines() == [
        "py2/old_train.py:2:1: SF000 SyntaxError: Missing parentheses in call to 'print'. Did you mean print(...)?"
        " (impact: high)",
        "py2/tabs.py:4:1: SF000 TabError: inconsistent use of tabs and spaces in indentation (impact: high)",
    ]  # SF000 is reported whatever the selection; the selected rules found nothing else


def test_a_file_too_deeply_nested_to_parse_is_an_error_with_a_message(run_cli, write, tmp_path):
    write("deep.py", "x = " + "-" * 100_000 + "1\n")  # CPython's parser: a MemoryError with no message
    result = run_cli("scan", "deep.py", cwd=tmp_path)
    assert result.exit_code == 2
    # (the parser's exception differs between Python versions; its message never comes out empty)
    assert re.fullmatch(r"deep\.py: error: cannot parse: the code is nested too deeply \(\w.*\)\n", result.stderr)


def test_code_python_accepts_but_libcst_rejects_is_an_error_with_a_message(run_cli, write, tmp_path, monkeypatch):
    import libcst

    def refuse(data):  # libcst's message can be empty: the position must still come out
        raise libcst.ParserSyntaxError("", lines=["import torch\n"], raw_line=1, raw_column=0)

    monkeypatch.setattr(libcst, "parse_module", refuse)
    write("train.py", "import torch\nx = torch.zeros(3).cuda()\n")
    result = run_cli("scan", "train.py", cwd=tmp_path)
    assert result.exit_code == 2  # not a syntax error: a limit of speedfix
    assert result.stderr == "train.py:1:1: error: libcst cannot parse this file, although Python can: Syntax Error @ 1:1\n"


def test_binary_undecodable_and_unreadable_files(run_cli, train_script, write, tmp_path):
    (tmp_path / "blob.py").write_bytes(b"\x00\x01torch\x00")
    (tmp_path / "latin.py").write_bytes("import torch  # caf\xe9\n".encode("latin-1"))
    (tmp_path / "dangling.py").symlink_to(tmp_path / "nowhere.py")
    write("train.py", train_script)
    result = run_cli(
        "scan", tmp_path / "blob.py", tmp_path / "latin.py", tmp_path / "dangling.py", tmp_path / "train.py",
        "--no-summary",
    )
    assert result.exit_code == 2
    assert "blob.py: error: binary file" in result.stderr
    assert "latin.py: error: not valid UTF-8 text and no coding declaration" in result.stderr
    assert "dangling.py: error: cannot read file" in result.stderr
    assert codes(result.stdout)  # train.py was still scanned


def test_missing_path_is_a_usage_error(run_cli, train_script, tmp_path):
    result = run_cli("scan", tmp_path / "nope.py")
    assert result.exit_code == 2 and "no such file or directory" in result.stderr


def test_json_format_schema(run_cli, train_script, write):
    path = write("train.py", train_script)
    result = run_cli("scan", path, "--format", "json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert [item["code"] for item in data] == ["SF501", "SF203", "SF101", "SF102", "SF104", "SF301"]
    keys = {"path", "line", "column", "end_line", "end_column", "code", "name", "severity", "message", "fix"}
    for item in data:
        assert keys <= set(item)
        assert item["severity"] in ("error", "warning", "info")
        assert item["line"] >= 1 and item["column"] >= 1
    pin = next(item for item in data if item["code"] == "SF102")
    assert pin["fix"]["applicability"] == "safe"
    (edit,) = pin["fix"]["edits"]
    assert edit["line"] == 10 and "pin_memory=True" in edit["content"]
    lines = train_script.splitlines(keepends=True)
    patched = "".join(lines[: edit["line"] - 1]) + edit["content"] + "".join(lines[edit["end_line"] - 1 :])
    assert "DataLoader(train_set, batch_size=32, shuffle=True, pin_memory=True)" in patched


def test_markdown_report(run_cli, train_script, write, tmp_path):
    path = write("train.py", train_script)
    out = tmp_path / "report.md"
    result = run_cli("scan", path, "--format", "markdown", "--output", out)
    assert result.exit_code == 1 and result.stdout == ""
    report = out.read_text()
    assert report.startswith("# speedfix optimization report")
    assert "| 1 | high | Compile the model after it is built and moved to its device (SF501; unsafe fix) |" in report
    assert "### SF102 dataloader-no-pin-memory: 1 finding" in report
    # non_blocking from an unpinned loader gains nothing by itself: folded with the low-impact findings
    assert "<summary>2 low-impact findings (SF104 x1, SF203 x1)</summary>" in report
    assert "**What is slow:**" in report and "**Why:**" in report and "**Expected gain:**" in report
    assert "```diff" in report and "+    loader = DataLoader(train_set, batch_size=32, shuffle=True, pin_memory=True)" in report
    assert "https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html" in report
    assert "(unsafe fix: `speedfix apply --unsafe-fixes`)" in report  # SF101's workers, SF501's compile


def test_output_file_for_text_format_has_no_colour(run_cli, train_script, write, tmp_path):
    path = write("train.py", train_script)
    out = tmp_path / "report.txt"
    run_cli("scan", path, "--output", out)
    text = out.read_text()
    assert "\x1b[" not in text and finding_lines(text)


def test_cpu_only_script_gets_no_gpu_advice(run_cli, train_script, write):
    cpu = train_script.replace('torch.device("cuda" if torch.cuda.is_available() else "cpu")', '"cpu"').replace(
        "torch.cuda.amp.GradScaler()", "None"
    ).replace('torch.autocast("cuda", dtype=torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)',
              "nullcontext()")
    path = write("train.py", cpu)
    assert set(codes(run_cli("scan", path).stdout)) == {"SF101"}


def test_rules_and_rule_commands(run_cli, train_script):
    table = run_cli("rules")
    assert table.exit_code == 0
    for code in ("SF101", "SF102", "SF104", "SF201", "SF203", "SF301", "SF402", "SF501"):
        assert code in table.stdout
    listed = {rule["code"]: rule for rule in json.loads(run_cli("rules", "--format", "json").stdout)}
    assert {"code": "SF102", "name": "dataloader-no-pin-memory", "fix": "safe"}.items() <= listed["SF102"].items()
    assert listed["SF203"]["category"] == "deprecation" and listed["SF000"]["category"] == "correctness"
    docs = run_cli("rule", "SF101")
    assert docs.exit_code == 0
    for section in ("What it does", "Why is this bad?", "Example", "Use instead", "Fix safety", "Measured effect"):
        assert f"## {section}" in docs.stdout
    assert run_cli("rule", "dataloader-no-workers").stdout == docs.stdout
    unknown = run_cli("rule", "SF999")
    assert unknown.exit_code == 2 and "unknown rule" in unknown.stderr


def test_version_and_help(run_cli, train_script):
    assert run_cli("--version").stdout.startswith("speedfix ")
    assert "scan" in run_cli("--help").stdout
    assert "--select" in run_cli("scan", "--help").stdout


def test_unknown_format_is_a_usage_error(run_cli, train_script, write):
    path = write("train.py", train_script)
    result = run_cli("scan", path, "--format", "xml")
    assert result.exit_code == 2
    assert result.stderr == "error: --output-format must be one of text, github, json, markdown, sarif, not 'xml'\n"


def test_force_exclude_applies_exclude_to_files_named_on_the_command_line(run_cli, train_script, write, tmp_path):
    write("pyproject.toml", '[tool.speedfix]\nexclude = ["legacy/*"]\n')
    legacy = write("legacy/train.py", train_script)
    kept = write("train.py", train_script)
    assert codes(run_cli("scan", legacy, cwd=tmp_path).stdout)  # named explicitly: scanned
    forced = run_cli("scan", legacy, kept, "--force-exclude", "--no-summary", cwd=tmp_path)
    assert {m["path"] for m in finding_lines(forced.stdout)} == {"train.py"}


def test_gitignored_files_are_skipped_in_directory_walks(run_cli, train_script, write, tmp_path):
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    write(".gitignore", "generated/\nscratch_*.py\n")
    write("generated/train.py", train_script)
    write("scratch_train.py", train_script)
    write("train.py", train_script)
    result = run_cli("scan", ".", "--no-summary", cwd=tmp_path)
    assert {m["path"] for m in finding_lines(result.stdout)} == {"train.py"}
    write("pyproject.toml", "[tool.speedfix]\nrespect-gitignore = false\n")
    result = run_cli("scan", ".", "--no-summary", cwd=tmp_path)
    assert {m["path"] for m in finding_lines(result.stdout)} == {"train.py", "scratch_train.py", "generated/train.py"}


def test_the_program_ends_right_after_a_scan_with_its_report_written(train_script, write, tmp_path):
    """`speedfix scan` (the console script and `python -m speedfix`) ends the process as soon as
    the report is written, without the interpreter's teardown (atexit handlers do not run); the
    report and the exit code are whole. Other commands end as Python programs do."""
    import os
    import subprocess
    import sys

    write("train.py", train_script)
    program = (
        "import atexit, sys\natexit.register(lambda: print('torn down'))\n"
        "from speedfix.cli import run\nsys.argv = ['speedfix', *sys.argv[1:]]\nrun()\n"
    )
    env = {**os.environ, "SPEEDFIX_NO_CACHE": "1"}

    def speedfix(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", program, *args], cwd=tmp_path, env=env, capture_output=True, text=True)

    scanned = speedfix("scan", "train.py")
    assert scanned.returncode == 1 and "torn down" not in scanned.stdout
    assert scanned.stdout.count("train.py:") == 6 and "Found 6 findings in 1 file" in scanned.stdout
    clean = speedfix("scan", "train.py", "--select", "SF902")
    assert (clean.returncode, clean.stdout) == (0, "All checks passed: 1 file scanned.\n")
    listed = speedfix("rules")
    assert listed.returncode == 0 and listed.stdout.endswith("torn down\n")
    assert speedfix("scan", "missing.py").returncode == 2


def test_launch_script_named_on_the_command_line_is_not_parsed_as_python(run_cli, train_script, write, tmp_path):
    write("train.py", train_script)
    write("run.sh", "#!/bin/bash\n#SBATCH --gpus=4\nsrun python train.py --epochs 10\n")
    result = run_cli("scan", "train.py", "run.sh", "--no-cache", cwd=tmp_path)
    assert "SF000" not in codes(result.stdout)
    assert codes(result.stdout)  # the script is still scanned
    assert "run.sh: note: not scanned: a `.sh` file is not Python" in result.stdout
    assert run_cli("apply", "run.sh", cwd=tmp_path).exit_code == 0
    assert (tmp_path / "run.sh").read_text() == "#!/bin/bash\n#SBATCH --gpus=4\nsrun python train.py --epochs 10\n"


@pytest.mark.parametrize("text", [
    "plain.py:1:2: SF101 [*] a message (impact: high)",
    "tab\there and\tthere", "wide 漢字\tafter", "bell\x07 back\x08 vt\x0b ff\x0c cr\x0d end", "nul\x00 kept", "",
    "  trailing  ",
])
def test_a_piped_report_is_what_rich_would_print_without_loading_it(text):
    """Piped, the text report is written without rich; it reads exactly as rich would print it
    (rich drops some control characters and expands tabs: such lines still go through rich)."""
    from rich.console import Console
    from rich.text import Text

    from speedfix.output._styled import Line, render

    line = Line().append(text[:3], "bold").append(text[3:], "cyan")
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=False, no_color=True, width=80, highlight=False, soft_wrap=True,
                      emoji=False, markup=False)
    console.print(Text(text[:3], style="bold") + Text(text[3:], style="cyan"))
    console.print(text)
    assert render([line, text], color=False, width=80) == buffer.getvalue()


def test_a_scan_piped_to_a_file_does_not_load_rich(train_script, write, tmp_path):
    write("train.py", train_script)
    code = (
        "import sys\nfrom speedfix.cli import main\n"
        "try:\n    main(['scan', 'train.py', '--no-cache'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('rich')), file=sys.stderr)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert "SF101" in run.stdout and run.stderr.splitlines()[-1] == "[]"
    forced = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={**env, "FORCE_COLOR": "1"},
                            capture_output=True, text=True, check=True)
    assert "\x1b[" in forced.stdout and "'rich.console'" in forced.stderr  # a forced terminal gets styles


GAN_OPTIMIZERS = """\
import torch
netD = Discriminator().cuda()
netG = Generator().cuda()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4){d}
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4){g}
for x in loader:
    netD(netG(x)).sum().backward()
    optimizerD.step()
    optimizerG.step()
"""


@pytest.mark.parametrize("d, g, reported", [("", "", "4"), ("  # noqa: SF401", "", "5"), ("", "  # noqa: SF401", "4")])
def test_a_noqa_comment_keeps_its_line_out_of_a_folded_finding(run_cli, write, tmp_path, d, g, reported):
    """Two optimizers made side by side are one SF401 finding; a `# noqa` on either line leaves
    that line out of it: the other is still reported, and its fix leaves the commented line alone."""
    write("train.py", GAN_OPTIMIZERS.replace("{d}", d).replace("{g}", g))
    found = run_cli("scan", ".", "--select", "SF401", "--no-summary", cwd=tmp_path).stdout.splitlines()
    assert [line.split(":")[1] for line in found] == [reported]
    diff = run_cli("apply", ".", "--select", "SF401", "--unsafe-fixes", "--diff", cwd=tmp_path).stdout
    assert not any("noqa" in line and "fused=True" in line for line in diff.splitlines())
