"""Per-file limits: a time limit, input libcst's parser cannot finish, and parse errors that say
what happened (issue 13, item 4). No test here depends on the real clock."""

from __future__ import annotations

import itertools

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


@pytest.mark.parametrize("terms", [20_000, 1_500], ids=["beyond Python's parser", "beyond the limit"])
def test_a_huge_flat_expression_is_refused_before_libcst_sees_it(good_script, run_cli, write, tmp_path, terms):
    # 20,000 terms: libcst's parser (about N**2) would not finish; the scan answers at once.
    write("generated.py", "import torch\n" + flat_sum(terms) + "x = torch.zeros(3).cuda()\n")
    write("good.py", good_script)
    result = run_cli("scan", tmp_path, "--no-summary")
    assert result.exit_code == 2
    assert "generated.py: error: cannot parse: the code is nested too deeply (" in result.stderr
    if terms == 1_500:
        assert "line 2 nests 1,500 expressions; the limit is 1,000" in result.stderr
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
