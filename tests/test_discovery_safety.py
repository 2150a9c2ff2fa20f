"""One odd entry never stops a scan: FIFOs, sockets, devices, symbolic link loops and huge files
are skipped with a message naming them, every other file is still reported, and the exit code
is 2 (issue 13, item 2)."""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
from pathlib import Path

import pytest

from speedfix.syntax.source import DEFAULT_MAX_FILE_SIZE

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="FIFOs, sockets and /dev/zero are POSIX")



def run_bounded(run_cli, *args):
    """Run the CLI in a thread so that a regression (a scan blocked on a FIFO) fails the test
    instead of hanging the suite."""
    box = {}
    thread = threading.Thread(target=lambda: box.update(result=run_cli(*args)), daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the scan hung"
    return box["result"]


def assert_reported(result, name, message):
    assert result.exit_code == 2
    assert f"{name}: error: {message}" in result.stderr
    assert "good.py:4:10: SF102" in result.stdout  # the other file is still reported
    assert "Traceback" not in result.stdout + result.stderr


def test_fifo_in_a_folder_is_skipped_not_waited_on(good_script, run_cli, write, tmp_path):
    write("good.py", good_script)
    os.mkfifo(tmp_path / "pipe.py")
    result = run_bounded(run_cli, "scan", tmp_path, "--no-summary")
    assert_reported(result, "pipe.py", "skipped: not a regular file (a named pipe (FIFO))")


def test_fifo_named_on_the_command_line_is_skipped(good_script, run_cli, write, tmp_path):
    good = write("good.py", good_script)
    os.mkfifo(tmp_path / "pipe.py")
    for command in ("scan", "apply"):
        result = run_bounded(run_cli, command, tmp_path / "pipe.py", good)
        assert result.exit_code == 2
        assert "pipe.py: error: skipped: not a regular file (a named pipe (FIFO))" in result.stderr


def test_socket_is_skipped(good_script, run_cli, write, tmp_path, monkeypatch):
    write("good.py", good_script)
    monkeypatch.chdir(tmp_path)  # a short socket path (the limit is about 100 bytes)
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind("sock.py")
        result = run_bounded(run_cli, "scan", ".", "--no-summary")
    finally:
        server.close()
    assert_reported(result, "sock.py", "skipped: not a regular file (a socket)")


def test_symlink_to_dev_zero_is_never_read(good_script, run_cli, write, tmp_path):
    write("good.py", good_script)
    (tmp_path / "zero.py").symlink_to("/dev/zero")
    result = run_bounded(run_cli, "scan", tmp_path, "--no-summary")
    assert_reported(result, "zero.py", "skipped: not a regular file (a character device)")


@pytest.mark.parametrize("named", [False, True], ids=["in a folder", "on the command line"])
def test_symlink_loop_is_reported_and_the_rest_scanned(good_script, run_cli, write, tmp_path, named):
    good = write("good.py", good_script)
    (tmp_path / "a.py").symlink_to(tmp_path / "b.py")
    (tmp_path / "b.py").symlink_to(tmp_path / "a.py")
    args = [tmp_path / "a.py", tmp_path / "b.py", good] if named else [tmp_path]
    result = run_bounded(run_cli, "scan", *args, "--no-summary")
    for name in ("a.py", "b.py"):
        assert_reported(result, name, "skipped: symbolic link loop")
    result = run_bounded(run_cli, "apply", *args)
    assert result.exit_code == 2 and "a.py: error: skipped: symbolic link loop" in result.stderr
    assert "pin_memory=True" in good.read_text()


def test_file_over_the_size_cap_is_skipped_with_the_cap_in_the_message(good_script, run_cli, write, tmp_path):
    write("good.py", good_script)
    big = write("big.py", good_script + "# padding\n" * 300)  # about 3.8 KB
    result = run_cli("scan", tmp_path, "--no-summary", "--max-file-size-mb", "0.002")  # 2 KB
    assert_reported(result, "big.py", "skipped: larger than 0.002 MB")
    result = run_cli("apply", big, "--max-file-size-mb", "0.002")
    assert result.exit_code == 2 and "big.py: error: skipped: larger than 0.002 MB" in result.stderr
    assert run_cli("scan", tmp_path, "--max-file-size-mb", "0").exit_code == 1  # 0: no cap


def test_size_cap_from_the_configuration(good_script, run_cli, write, tmp_path):
    write("pyproject.toml", "[tool.speedfix]\nmax-file-size-mb = 0.002\n")
    write("good.py", good_script)
    write("big.py", good_script + "# padding\n" * 300)
    result = run_cli("scan", tmp_path, "--no-summary")
    assert_reported(result, "big.py", "skipped: larger than 0.002 MB")
    assert run_cli("scan", tmp_path, "--max-file-size-mb", "1").exit_code == 1  # the command line wins


def test_the_readme_states_the_default_size_cap():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    stated = re.search(r"^max-file-size-mb = (\d+)", readme, re.MULTILINE)
    assert stated and int(stated.group(1)) * 1024 * 1024 == DEFAULT_MAX_FILE_SIZE
