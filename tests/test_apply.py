"""`speedfix apply`: what it writes, what it never touches, and how it reports."""

from __future__ import annotations

import os
import stat
import textwrap

import pytest

from speedfix.fixes.fixer import fix_code

LATIN1_SCRIPT = (
    "# -*- coding: latin-1 -*-\n"
    "# Entraînement du modèle (données synthétiques) - ½ précision\n"
    "import torch\n"
    "from torch.utils.data import DataLoader\n"
    "\n"
    "loader = DataLoader(ds, batch_size=32)  # chargé à chaque époque\n"
    "for x, y in loader:\n"
    "    x = x.to('cuda')  # copie bloquante\n"
    "    loss = model(x).sum()\n"
    "    loss.backward()\n"
    "    opt.step()\n"
)


def test_safe_fixes_by_default_unsafe_on_request(run_cli, write, train_script):
    path = write("train.py", train_script)
    result = run_cli("apply", path)
    assert result.exit_code == 1
    code = path.read_text()
    assert "pin_memory=True" in code and "x.to(device, non_blocking=True)" in code
    assert 'torch.amp.GradScaler("cuda")' in code
    assert "num_workers" not in code and "model.compile()" not in code  # unsafe
    assert "Fixed 3 findings in 1 file (SF102 x1, SF104 x1, SF203 x1)" in result.stdout  # x and y: one transfer
    assert "SF101 unsafe fix: needs --unsafe-fixes" in result.stdout
    result = run_cli("apply", path, "--unsafe-fixes")
    assert result.exit_code == 1
    code = path.read_text()
    assert "num_workers=min(8, os.cpu_count() or 1)" in code and "model.compile()" in code
    assert "running += loss.detach()" in code and "{float(running) / 100:.3f}" in code
    assert code.count("import os\n") == 1
    again = run_cli("apply", path, "--unsafe-fixes")
    assert again.exit_code == 0 and "No fixes to apply" in again.stdout


def test_diff_writes_nothing(run_cli, write, train_script):
    path = write("train.py", train_script)
    before = path.read_bytes()
    result = run_cli("apply", path, "--diff")
    assert result.exit_code == 1
    assert path.read_bytes() == before
    assert "-    loader = DataLoader(train_set, batch_size=32, shuffle=True)" in result.stdout
    assert "+    loader = DataLoader(train_set, batch_size=32, shuffle=True, pin_memory=True)" in result.stdout
    assert "\x1b[" not in result.stdout
    assert "Would fix 3 findings" in result.stderr


def test_nothing_to_do_exits_zero(run_cli, write):
    path = write("clean.py", "import torch\nx = torch.zeros(1)\n")
    result = run_cli("apply", path)
    assert result.exit_code == 0 and "No fixes to apply" in result.stdout


def test_select_limits_the_fixes(run_cli, write, train_script):
    path = write("train.py", train_script)
    run_cli("apply", path, "--select", "SF102")
    code = path.read_text()
    assert "pin_memory=True" in code and "non_blocking" not in code


def test_syntax_error_is_reported_and_left_untouched(run_cli, write, train_script, tmp_path):
    broken = write("broken.py", "import torch\nloader = torch.utils.data.DataLoader(ds\n")
    good = write("train.py", train_script)
    before = broken.read_bytes()
    result = run_cli("apply", tmp_path)
    assert result.exit_code == 1 and result.stderr == ""  # train.py changed; a syntax error is a finding
    assert f"  {broken}:2:37: SF000 SyntaxError: '(' was never closed (the file is left as it is)\n" in result.stdout
    assert broken.read_bytes() == before
    assert "pin_memory=True" in good.read_text()


MULTILINE_LOADER = """\
import torch
from torch.utils.data import DataLoader

device = torch.device("cuda")
loader = DataLoader(
    dataset,
    batch_size=64,
)
for x, y in loader:
    x = x.to(device)
    loss = model(x, y)
    loss.backward()
    optimizer.step()
    print(loss.item())
"""


def _positions(lines: list[str]) -> set[str]:
    """`path:line:col: CODE` of finding lines (the scan's or the apply summary's)."""
    return {" ".join(line.strip().split(" ", 2)[:2]) for line in lines}


def test_diff_prints_positions_in_the_file_on_disk(run_cli, write, tmp_path):
    # The safe fix adds a line (`pin_memory=True,`) above the findings it leaves: `--diff` writes
    # nothing, so they must keep the positions `scan` gives them.
    write("train.py", MULTILINE_LOADER)
    result = run_cli("apply", "--diff", "train.py", cwd=tmp_path)
    assert "+    pin_memory=True," in result.stdout
    left = _positions([line for line in result.stderr.splitlines() if line.startswith("  train.py:")])
    assert left == {"train.py:5:10: SF101", "train.py:9:1: SF201", "train.py:12:5: SF202", "train.py:14:11: SF301"}
    assert left <= _positions(run_cli("scan", "train.py", "--no-summary", cwd=tmp_path).stdout.splitlines())
    # Once written, what is left is where it is in the fixed file.
    written = run_cli("apply", "train.py", cwd=tmp_path)
    left = _positions([line for line in written.stdout.splitlines() if line.startswith("  train.py:")])
    assert left == {"train.py:5:10: SF101", "train.py:10:1: SF201", "train.py:13:5: SF202", "train.py:15:11: SF301"}
    assert left == _positions(run_cli("scan", "train.py", "--no-summary", cwd=tmp_path).stdout.splitlines())


def test_latin1_coding_cookie_and_non_ascii_comments_survive(run_cli, tmp_path):
    path = tmp_path / "train.py"
    path.write_bytes(LATIN1_SCRIPT.encode("latin-1"))
    assert run_cli("apply", path).exit_code == 1
    data = path.read_bytes()
    text = data.decode("latin-1")
    assert "x = x.to('cuda', non_blocking=True)  # copie bloquante" in text
    assert "pin_memory=True" in text
    original = LATIN1_SCRIPT.splitlines()
    fixed = text.splitlines()
    assert fixed[:4] == original[:4]  # cookie and accented comment, byte-identical
    assert [line for line in fixed if "loader =" not in line and "x.to" not in line] == [
        line for line in original if "loader =" not in line and "x.to" not in line
    ]


def test_crlf_line_endings_are_kept(run_cli, tmp_path, train_script):
    path = tmp_path / "train.py"
    path.write_bytes(train_script.replace("\n", "\r\n").encode())
    run_cli("apply", path, "--unsafe-fixes")
    data = path.read_bytes()
    assert b"\r\n" in data and data.count(b"\n") == data.count(b"\r\n")
    assert b"model.compile()\r\n" in data and b"import os\r\n" in data


def test_utf8_bom_is_kept(run_cli, tmp_path, train_script):
    path = tmp_path / "train.py"
    path.write_bytes(b"\xef\xbb\xbf" + train_script.encode())
    run_cli("apply", path)
    data = path.read_bytes()
    assert data.startswith(b"\xef\xbb\xbfimport torch\n")
    assert data.count(b"\xef\xbb\xbf") == 1 and b"pin_memory=True" in data


def test_untouched_lines_are_byte_identical(run_cli, write, train_script):
    messy = train_script.replace("import torch\n", "import torch   # keep   this  spacing\n\n\n").replace(
        "running = 0.0", "running = 0.0  ;  unused = (1,\n          2)"
    )
    path = write("train.py", messy)
    run_cli("apply", path, "--unsafe-fixes")
    fixed = path.read_text().splitlines()
    changed = {"loader", "x, y = x.to", "model.compile", "import os", "running +=", "float(running)", "GradScaler",
               "num_workers", "persistent_workers", "pin_memory", "train_set,", "batch_size=", "shuffle=", ")"}
    kept = [line for line in messy.splitlines() if not any(key in line for key in changed)]
    assert all(line in fixed for line in kept)
    assert "import torch   # keep   this  spacing" in fixed


def test_write_is_atomic_and_keeps_permissions(run_cli, write, train_script, tmp_path):
    path = write("train.py", train_script)
    os.chmod(path, 0o750)
    run_cli("apply", path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o750
    assert [p.name for p in tmp_path.iterdir()] == ["train.py"]  # no temporary files left behind


def test_only_output_that_parses_is_written(monkeypatch, write, train_script, run_cli):
    """A fix that produced broken code must leave the file alone and say so."""
    import speedfix.fixes.fixer as fixer

    class Broken:  # what a buggy fix would produce: a doubled comma
        def __init__(self, module):
            self.bytes = module.bytes.replace(b"pin_memory=True", b"pin_memory=True,,")

    original = fixer.apply_fixes
    monkeypatch.setattr(fixer, "apply_fixes", lambda module, fixes: Broken(original(module, fixes)))
    path = write("train.py", train_script)
    before = path.read_bytes()
    result = run_cli("apply", path)
    assert result.exit_code == 2
    assert "does not parse" in result.stderr and "nothing was written" in result.stderr
    assert path.read_bytes() == before


def test_fix_code_api_reuses_aliases_and_adds_imports_once():
    code = textwrap.dedent(
        """\
        import torch as t
        from torch import nn

        def train(model, loader, opt):
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()

        train(nn.Linear(8, 1).cuda(), loader, opt)
        """
    )
    out = fix_code(code, path="t.py", select=["SF201"], unsafe=True)
    assert out.applied == {"SF201": 1}
    assert "t.set_float32_matmul_precision(\"high\")" in out.code and "import torch\n" not in out.code
    no_torch = code.replace("import torch as t\n", "")
    out = fix_code(no_torch, path="t.py", select=["SF201"], unsafe=True)
    assert out.code.count("import torch\n") == 1
    assert 'torch.set_float32_matmul_precision("high")' in out.code
    assert out.code.index("import torch\n") < out.code.index("torch.set_float32_matmul_precision")


@pytest.mark.usefixtures("outside_the_checkout")  # `t.py` has no project around it
@pytest.mark.parametrize("unsafe", [False, True])
def test_apply_is_idempotent_on_the_examples_of_every_rule(unsafe):
    from speedfix.engine.registry import all_rules

    for rule in all_rules():
        for example in rule.INVALID:
            first = fix_code(example.code, path="t.py", unsafe=unsafe, torch_version=example.torch)
            if first.code == example.code:
                continue  # nothing fixed: a second run would be this same run again
            second = fix_code(first.code, path="t.py", unsafe=unsafe, torch_version=example.torch)
            assert second.code == first.code, (rule.code, example.code)


def test_a_fix_that_moves_statements_runs_alone_in_its_block():
    """SF202 wraps statements in a `with`; a removal (SF303) and argument edits (SF104) in the
    same block wait for the next pass instead of shifting what it moves."""
    code = textwrap.dedent(
        """\
        import torch
        from torch.utils.data import DataLoader

        def main():
            loader = DataLoader(ds, batch_size=32, pin_memory=True)
            for x, y in loader:
                torch.cuda.empty_cache()
                out = model(x.cuda())
                loss = criterion(out, y.cuda())
                loss.backward()
                opt.step()
        """
    )
    out = fix_code(code, path="t.py", select=["SF202", "SF303", "SF104"], unsafe=True)
    assert out.applied == {"SF104": 1, "SF202": 1, "SF303": 1}  # x and y copied on adjacent lines: one transfer
    assert out.passes >= 2
    assert out.code == textwrap.dedent(
        """\
        import torch
        from torch.utils.data import DataLoader

        def main():
            loader = DataLoader(ds, batch_size=32, pin_memory=True)
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    out = model(x.cuda(non_blocking=True))
                    loss = criterion(out, y.cuda(non_blocking=True))
                loss.backward()
                opt.step()
        """
    )


def test_fixes_inside_a_restructured_block_wait_for_the_next_pass():
    import libcst as cst

    from speedfix.engine.findings import Applicability, Fix, InsertStatements, Transform
    from speedfix.fixes.fixer import this_pass

    module = cst.parse_module("for x in y:\n    a()\n    b()\n")
    loop = module.body[0]
    block = loop.body
    first, second = block.body

    def keep(node):
        return node

    wrap = Fix("wrap", Applicability.UNSAFE, (Transform(block, keep),), restructures=block)
    edit_inside = Fix("edit", Applicability.SAFE, (Transform(first, keep),))
    insert_inside = Fix("insert", Applicability.SAFE, (InsertStatements(second, (cst.parse_statement("c()"),)),))
    around = Fix("around", Applicability.SAFE, (Transform(loop, keep),))
    assert this_pass([edit_inside, wrap, insert_inside, around]) == [wrap, around]
    assert this_pass([edit_inside, insert_inside]) == [edit_inside, insert_inside]
    other_wrap = Fix("wrap again", Applicability.UNSAFE, (Transform(block, keep),), restructures=block)
    assert this_pass([wrap, other_wrap]) == [wrap]
