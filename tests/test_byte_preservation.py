"""No byte outside the fixed lines changes, no comment is lost, and a file libcst cannot give
back byte for byte is left alone (issue 13, item 5)."""

from __future__ import annotations

import pytest

from speedfix.fixes.fixer import FixError, fix_code
from speedfix.syntax.roundtrip import Restorer, RoundTripError

# The loop trains on CUDA; SF303 removes `torch.cuda.empty_cache()`, SF304 `gc.collect()`.
HEAD = "import gc\nimport torch\n\nfor x, y in loader:\n    loss = model(x.cuda(non_blocking=True)).sum()\n    loss.backward()\n    opt.step()\n"


def fixed(code: str, rule: str) -> str:
    return fix_code(code, path="train.py", select=[rule], unsafe=True).code


@pytest.mark.parametrize("rule, call", [("SF303", "torch.cuda.empty_cache()"), ("SF304", "gc.collect()")])
def test_comment_above_a_removed_last_statement_of_a_block_is_kept(rule, call):
    code = HEAD + f"    # free memory before the next batch\n    {call}\nprint('done')\n"
    assert fixed(code, rule) == HEAD + "    # free memory before the next batch\nprint('done')\n"


@pytest.mark.parametrize("rule, call", [("SF303", "torch.cuda.empty_cache()"), ("SF304", "gc.collect()")])
def test_comments_of_a_removed_statement_move_to_the_next_one(rule, call):
    code = HEAD + f"    # above\n    {call}  # at the end of the line\n    step += 1\n"
    assert fixed(code, rule) == HEAD + "    # above\n    # at the end of the line\n    step += 1\n"


def test_comments_inside_a_removed_guard_are_kept():
    code = HEAD + (
        "    if step % 100 == 0:  # now and then\n"
        "        # release cached blocks\n"
        "        torch.cuda.empty_cache()  # slow\n"
        "        # (measured: 30 ms)\n"
        "    step += 1\n"
    )
    expected = HEAD + (
        "    # now and then\n    # release cached blocks\n    # slow\n    # (measured: 30 ms)\n    step += 1\n"
    )
    assert fixed(code, "SF303") == expected


def test_a_statement_alone_in_its_block_becomes_pass_with_its_comments():
    code = HEAD + "    if should_collect(step):\n        # why\n        gc.collect()  # costly\nprint(1)\n"
    assert fixed(code, "SF304") == HEAD + "    if should_collect(step):\n        # why\n        pass  # costly\nprint(1)\n"


def test_form_feed_on_an_untouched_line_is_kept():
    code = HEAD + "    torch.cuda.empty_cache()\n\x0cprint('page two')\n\x0c\ndef f():\n    pass\n"
    assert fixed(code, "SF303") == HEAD + "\x0cprint('page two')\n\x0c\ndef f():\n    pass\n"


def test_final_carriage_return_of_a_cr_only_file_is_kept():
    code = (HEAD + "    torch.cuda.empty_cache()\nprint('done')\n").replace("\n", "\r")
    assert fixed(code, "SF303") == (HEAD + "print('done')\n").replace("\n", "\r")


def test_a_file_libcst_cannot_give_back_byte_for_byte_is_reported_and_left_alone(run_cli, write):
    # libcst drops the empty last line of a CR-only file ("...\r\r" comes back as "...\r").
    data = (HEAD + "    torch.cuda.empty_cache()\n\n").replace("\n", "\r").encode()
    path = write("train.py", "")
    path.write_bytes(data)
    with pytest.raises(FixError, match="does not reproduce line 9 of the file byte for byte; left unfixed"):
        fix_code(data.decode(), path="train.py", select=["SF303"], unsafe=True)
    result = run_cli("apply", path, "--select", "SF303", "--unsafe-fixes")
    assert result.exit_code == 2 and "byte for byte" in result.stderr and "train.py" in result.stderr
    assert path.read_bytes() == data


def test_restorer_refuses_lines_that_libcst_adds_or_drops():
    with pytest.raises(RoundTripError):
        Restorer(b"a\nb\nc\n", b"a\nc\n")
    restorer = Restorer(b"a\n\x0cb\nc\n", b"a\nb\nc\n")
    assert restorer.restore(b"a\nb\nnew\nc\n") == b"a\n\x0cb\nnew\nc\n"


def test_nul_byte_after_the_first_8_kb_is_detected(run_cli, write):
    path = write("train.py", "")
    data = (HEAD + "# " + "x" * 9000 + "\n").encode() + b"\0\n"
    path.write_bytes(data)
    for command in ("scan", "apply"):
        result = run_cli(command, path)
        assert result.exit_code == 2
        assert "train.py: error: binary file (contains NUL bytes)" in result.stderr
    assert path.read_bytes() == data
