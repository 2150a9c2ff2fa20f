"""Per-file limits: a time limit, input libcst's parser cannot finish, and parse errors that say
what happened (issue 13, item 4). No test here depends on the real clock."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

import speedfix.syntax.deadline
from speedfix.syntax.parsing import NestingTooDeep, parse_module



def flat_sum(terms: int) -> str:
    return "total = " + " + ".join(f"a{i}" for i in range(terms)) + "\n"


@pytest.fixture
def slow_clock(monkeypatch):
    """A clock that advances 100 s each time the time limit looks at it."""
    ticks = itertools.count(step=100)
    monkeypatch.setattr(speedfix.syntax.deadline, "clock", lambda: float(next(ticks)))


def test_a_file_over_the_time_limit_is_skipped_and_reported(good_script, run_cli, write, tmp_path, slow_clock):
    slow = write("slow.py", good_script)
    result = run_cli("scan", slow, "--file-time-limit", "150", "--no-summary")
    assert result.exit_code == 2
    assert "slow.py: error: skipped: analysing it took longer than 150 s" in result.stderr
    assert "--file-time-limit" in result.stderr and "Traceback" not in result.stderr
    result = run_cli("apply", slow, "--file-time-limit", "150")
    assert result.exit_code == 2 and "took longer than 150 s" in result.stderr
    assert slow.read_text() == good_script


def test_the_time_limit_applies_per_file_and_zero_disables_it(good_script, run_cli, write, tmp_path, slow_clock):
    write("a.py", good_script)
    write("b.py", good_script)
    result = run_cli("scan", tmp_path, "--file-time-limit", "150", "--no-summary", "--jobs", "1")
    assert result.stderr.count("took longer than 150 s") == 2  # each file got its own deadline
    result = run_cli("scan", tmp_path, "--file-time-limit", "0", "--no-summary")
    assert result.exit_code == 1 and result.stderr == ""


def test_time_limit_from_the_configuration(good_script, run_cli, write, tmp_path, slow_clock):
    write("pyproject.toml", "[tool.speedfix]\nfile-time-limit = 150\n")
    write("slow.py", good_script)
    result = run_cli("scan", tmp_path, "--no-summary")
    assert result.exit_code == 2 and "took longer than 150 s" in result.stderr


@pytest.mark.parametrize("terms", [20_000, 1_500], ids=["far beyond the limit", "beyond the limit"])
def test_a_huge_flat_expression_is_refused_before_libcst_sees_it(good_script, run_cli, write, tmp_path, terms):
    # 20,000 terms: libcst's parser (about N**2) would not finish; the scan answers at once.
    write("generated.py", "import torch\n" + flat_sum(terms) + "x = torch.zeros(3).cuda()\n")
    write("good.py", good_script)
    result = run_cli("scan", tmp_path, "--no-summary")
    assert result.exit_code == 2
    assert "generated.py:2:1: error: cannot parse: the code is nested too deeply (" in result.stderr
    assert f"line 2 nests {terms:,} expressions; the limit is 1,000" in result.stderr
    assert "good.py:4:10: SF102" in result.stdout


def test_code_nested_deeper_than_the_limit_is_refused_with_its_line():
    parse_module("import torch\n" + flat_sum(900))  # under the limit: parsed
    with pytest.raises(NestingTooDeep, match="line 1 nests"):
        parse_module(flat_sum(1_001))
    with pytest.raises(NestingTooDeep):
        parse_module("x = " + "-" * 1_100 + "1\n")  # one character per level


@pytest.mark.parametrize(
    "code",
    ["import torch\nx = (((((((((((((((((((((((((((((((1" + ")" * 30 + "\n", "import torch\n" + "[" * 300 + "]" * 300 + "\n"],
)
def test_parse_failures_never_print_an_empty_message(run_cli, write, code):
    path = write("deep.py", code)
    result = run_cli("scan", path)
    for line in result.stderr.splitlines():
        assert not line.rstrip().endswith(":"), line
    assert "cannot parse: \n" not in result.stderr


# Code libcst nests although Python's ast keeps it flat. The first three crashed scan, apply and the
# editor server with a segmentation fault (libcst's native parser); the others stopped with a
# RecursionError that named no line.
DEEP_SHAPES = {
    "and_chain.py": ("def train(model, loader):\n    for batch in loader:\n        if " + " and ".join(["ok(batch)"] * 8_000) + ":\n            model(batch)\n", 3),
    "dotted_import.py": ("import " + ".".join(["m"] * 8_000) + "\n", 1),
    "from_import.py": ("def f():\n    from " + ".".join(["m"] * 8_000) + " import x\n", 2),
    "or_chain.py": ("x = " + " or ".join(["a"] * 1_500) + "\n", 1),
    "concatenation.py": ("x = (\n" + '"a"\n' * 1_500 + ")\n", 2),
    "comprehension.py": ("x = [a " + " ".join(f"for a{i} in b" for i in range(1_500)) + "]\n", 1),
    "elif_chain.py": ("if a:\n    pass\n" + "elif a:\n    pass\n" * 1_500, 2_001),  # the 1,000th elif
}


def test_code_libcst_nests_deeply_is_refused_with_its_line_and_never_crashes(tmp_path, good_script):
    for name, (code, _) in DEEP_SHAPES.items():
        (tmp_path / name).write_text(good_script + code)  # 8 lines, with a finding
    (tmp_path / "good.py").write_text(good_script)
    command = [sys.executable, "-m", "speedfix", "scan", "--no-cache", "--no-summary", "."]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result  # not -11: a crash would lose every other file's report
    for name, (_, line) in DEEP_SHAPES.items():
        line += 8
        assert f"{name}:{line}:1: error: cannot parse: the code is nested too deeply (line {line} nests" in result.stderr
    assert "good.py:4:10: SF102" in result.stdout
    result = subprocess.run([*command[:3], "apply", "."], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Fixed 1 finding in 1 file" in result.stdout, result
    assert result.stderr.count("nested too deeply") == len(DEEP_SHAPES)


@pytest.mark.parametrize("shape", ["and", "elif", "concatenation"])
def test_code_nested_just_under_the_limit_is_fixed(run_cli, write, good_script, shape):
    deep = {
        "and": "if " + " and ".join(["a"] * 990) + ":\n    pass\n",
        "elif": "if a:\n    pass\n" + "elif a:\n    pass\n" * 990,
        "concatenation": "x = (" + " ".join(['"a"'] * 990) + ")\n",
    }[shape]
    path = write("train.py", good_script + deep)
    result = run_cli("apply", path)  # a RecursionError from libcst's code generation before
    assert result.exit_code == 1 and "Fixed 1 finding in 1 file" in result.stdout, result
    assert "pin_memory=True" in path.read_text() and path.read_text().endswith(deep)
