"""Writes never destroy what a user saved: an edit made while apply runs, a report written over an
input, a symbolic link replaced by a copy (issue 13, item 1)."""

from __future__ import annotations

import os

import pytest

import speedfix.commands.apply
from speedfix.syntax.source import FileChanged, WriteRefused, write_atomic

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
    assert "Fixed 2 findings in 1 file" in result.stdout  # the refused file is not counted (issue 27)
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


# ------------------------------------------------------------------ issue 27, item 3: apply as root
def _acl(entries: list[tuple[int, int, int]]) -> bytes:
    """A POSIX ACL as the `system.posix_acl_access` extended attribute holds it."""
    import struct

    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, ident) for tag, perm, ident in entries)


def _set_xattrs(path) -> dict[str, bytes]:
    """A user attribute and an ACL that lets user 1234 read the file, where the file system
    takes them; the attributes the file then has."""
    acl = _acl([(0x01, 6, 0xFFFFFFFF), (0x02, 4, 1234), (0x04, 4, 0xFFFFFFFF), (0x10, 4, 0xFFFFFFFF), (0x20, 0, 0xFFFFFFFF)])
    for name, value in (("user.origin", b"dataset-v2"), ("system.posix_acl_access", acl)):
        try:
            os.setxattr(path, name, value)
        except OSError:  # not supported here: then the rewritten file must have none either
            pass
    return _xattrs(path)


def _xattrs(path) -> dict[str, bytes]:
    try:
        return {name: os.getxattr(path, name) for name in os.listxattr(path)}
    except OSError:
        return {}


def test_apply_keeps_the_owner_group_mode_and_extended_attributes(run_cli, write):
    script = write("train.py", SCRIPT)
    owner = (1234, 1234) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    os.chown(script, *owner)  # as root: another user's file, which apply used to give to root
    os.chmod(script, 0o640)
    attributes = _set_xattrs(script)
    result = run_cli("apply", script)
    assert result.exit_code == 1, result.stderr
    assert "pin_memory=True" in script.read_text()
    status = os.stat(script)
    assert (status.st_uid, status.st_gid, oct(status.st_mode & 0o7777)) == (*owner, oct(0o640))
    assert _xattrs(script) == attributes
    assert os.listdir(script.parent) == ["train.py"]


def test_a_file_whose_owner_cannot_be_kept_is_not_written(run_cli, write, monkeypatch):
    script, other = write("train.py", SCRIPT), write("other.py", SCRIPT)
    foreign = os.geteuid() == 0  # only root can make a file another user's
    if foreign:
        os.chown(script, 1234, 1234)

    def refuse(*args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "chown", refuse)
    result = run_cli("apply", script, other)
    assert "pin_memory=True" in other.read_text()
    if foreign:
        assert result.exit_code == 2
        assert "train.py: error: owned by user 1234, group 1234, which speedfix cannot give the rewritten file" in result.stderr
        assert script.read_text() == SCRIPT and os.stat(script).st_uid == 1234
        assert "Fixed 2 findings in 1 file" in result.stdout
    else:  # the file is this user's: the owner needs no change, and chown is never called
        assert result.exit_code == 1 and "pin_memory=True" in script.read_text()
    assert sorted(os.listdir(script.parent)) == ["other.py", "train.py"]


def test_a_read_only_file_is_reported_and_left_alone(run_cli, write, tmp_path):
    read_only, other = write("locked.py", SCRIPT), write("other.py", SCRIPT)
    os.chmod(read_only, 0o444)
    for args in (("apply", "--diff", tmp_path), ("apply", tmp_path)):
        result = run_cli(*args)
        assert result.exit_code == 2
        assert "locked.py: error: read-only (mode 0444); not written (make it writable to fix it)" in result.stderr
        assert read_only.read_text() == SCRIPT and oct(os.stat(read_only).st_mode & 0o777) == oct(0o444)
    assert "pin_memory=True" in other.read_text()
    assert "Fixed 2 findings in 1 file" in result.stdout  # the refused file is not counted (item 8)


def test_write_atomic_refuses_a_read_only_file(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("x = 1\n")
    path.chmod(0o444)
    with pytest.raises(WriteRefused, match="read-only"):
        write_atomic(path, b"fixed\n")
    assert path.read_text() == "x = 1\n" and os.listdir(tmp_path) == ["train.py"]


def test_a_symbolic_link_out_of_the_project_is_not_written_through(run_cli, write, tmp_path):
    outside = write("elsewhere/shared.py", SCRIPT)
    project = tmp_path / "project"
    write("project/train.py", SCRIPT)
    (project / "linked.py").symlink_to(outside)
    for args in (("apply", project), ("apply", project / "linked.py", project / "train.py")):
        result = run_cli(*args)
        assert result.exit_code == 2
        assert f"linked.py: error: a symbolic link to {outside}, outside the project; not written" in result.stderr
        assert outside.read_text() == SCRIPT
    assert "pin_memory=True" in (project / "train.py").read_text()
    assert "Fixed" not in result.stdout  # train.py was fixed by the first run; the refused link is not counted
    assert (project / "linked.py").is_symlink()


def test_a_symbolic_link_within_the_configured_project_is_written_through(run_cli, write, tmp_path):
    write("pyproject.toml", "[tool.speedfix]\n")
    shared = write("common/train.py", SCRIPT)
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "train.py").symlink_to(shared)
    result = run_cli("apply", tmp_path / "jobs")
    assert result.exit_code == 1, result.stderr
    assert "pin_memory=True" in shared.read_text() and (tmp_path / "jobs" / "train.py").is_symlink()


def test_write_fixed_refuses_a_read_only_script(tmp_path):
    # `apply --verify` writes the kept fixes through write_fixed: the same refusals as `apply`.
    from speedfix.fixes.fixer import write_fixed

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    script.chmod(0o444)
    with pytest.raises(WriteRefused, match="read-only"):
        write_fixed(script, "fixed\n", unchanged_since=SCRIPT.encode())
    assert script.read_text() == SCRIPT
