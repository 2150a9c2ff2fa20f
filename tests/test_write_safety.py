"""Writes never destroy what a user saved: an edit made while apply runs, a report written over an
input, a symbolic link replaced by a copy (issue 13, item 1)."""

from __future__ import annotations

import os

import pytest

import speedfix.commands.apply
from speedfix.syntax.source import FileChanged, write_atomic

# SF102 (pin_memory) and SF104 (non_blocking) are safe fixes: `apply` writes them by default.
SCRIPT = """\
import torch
from torch.utils.data import DataLoader

loader = DataLoader(ds, batch_size=32)
for x, y in loader:
    x = x.to("cuda")
    loss = model(x).sum()
    loss.backward()
    opt.step()
"""
USER_EDIT = SCRIPT.replace("batch_size=32", "batch_size=64  # saved by the editor meanwhile")


def test_an_edit_saved_while_apply_runs_is_kept_and_reported(run_cli, write, monkeypatch):
    edited = write("edited.py", SCRIPT)
    other = write("other.py", SCRIPT)
    real_fix_source = speedfix.commands.apply.fix_source

    def fix_while_the_user_saves(source, path, *args, **kwargs):
        outcome = real_fix_source(source, path, *args, **kwargs)
        if source.path == edited:  # the editor saves between speedfix's read and its write
            edited.write_text(USER_EDIT)
        return outcome

    monkeypatch.setattr(speedfix.commands.apply, "fix_source", fix_while_the_user_saves)
    result = run_cli("apply", edited, other)
    assert result.exit_code == 2
    assert edited.read_text() == USER_EDIT
    assert f"{edited.name}: error: changed on disk while speedfix worked on it; not written" in result.stderr
    assert "pin_memory=True" in other.read_text()  # the other file is still fixed
    assert "Traceback" not in result.stderr + result.stdout


def test_write_atomic_refuses_a_changed_file_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("new content on disk\n")
    with pytest.raises(FileChanged):
        write_atomic(path, b"fixed\n", expected=b"what speedfix read\n")
    assert path.read_text() == "new content on disk\n"
    assert os.listdir(tmp_path) == ["train.py"]
    write_atomic(path, b"fixed\n", expected=b"new content on disk\n")
    assert path.read_text() == "fixed\n"


@pytest.mark.parametrize("spelling", ["same", "relative", "symlink"])
def test_scan_refuses_to_write_the_report_over_an_input(run_cli, write, tmp_path, spelling):
    script = write("train.py", SCRIPT)
    output = {"same": script, "relative": tmp_path / "sub" / ".." / "train.py", "symlink": tmp_path / "link.py"}[spelling]
    (tmp_path / "sub").mkdir()
    if spelling == "symlink":
        output.symlink_to(script)
    result = run_cli("scan", script, "--output", output)
    assert result.exit_code == 2
    assert "is one of the files being scanned" in result.stderr
    assert script.read_text() == SCRIPT


def test_scan_refuses_an_output_that_a_folder_scan_reads(run_cli, write, tmp_path):
    write("train.py", SCRIPT)
    report = write("report.py", "x = 1\n")
    result = run_cli("scan", tmp_path, "--output", report)
    assert result.exit_code == 2 and "is one of the files being scanned" in result.stderr
    assert report.read_text() == "x = 1\n"
    result = run_cli("scan", tmp_path, "--output", tmp_path / "report.txt")
    assert result.exit_code == 1 and "SF102" in (tmp_path / "report.txt").read_text()


def test_apply_writes_through_a_symbolic_link_and_keeps_it(run_cli, write, tmp_path):
    real = write("real/train.py", SCRIPT)
    link = tmp_path / "train.py"
    link.symlink_to(real)
    result = run_cli("apply", link)
    assert result.exit_code == 1
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert "pin_memory=True" in real.read_text()
    assert sorted(os.listdir(real.parent)) == ["train.py"]  # no temporary file left behind


def test_write_fixed_refuses_a_script_edited_during_a_long_run(tmp_path):
    # `apply --verify` reads the script, benchmarks for minutes, then writes the kept fixes.
    from speedfix.fixes.fixer import write_fixed
    from speedfix.syntax.source import read_source

    script = tmp_path / "train.py"
    script.write_bytes(SCRIPT.replace("\n", "\r\n").encode())
    as_read = read_source(script).data
    script.write_text(USER_EDIT)  # the user saves meanwhile
    with pytest.raises(FileChanged):
        write_fixed(script, "fixed\n", unchanged_since=as_read)
    assert script.read_text() == USER_EDIT
    write_fixed(script, "fixed\n", unchanged_since=USER_EDIT.encode())
    assert script.read_text() == "fixed\n"
