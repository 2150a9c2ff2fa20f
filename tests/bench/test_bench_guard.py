"""The write guard's decisions, checked in this process without installing it (an audit hook
cannot be removed): what counts as a change, where a path really lands, which folder decides."""

from __future__ import annotations

import os

import pytest

from speedfix.bench.guard import Guard, locate, read_notes

WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


@pytest.fixture
def layout(tmp_path):
    """A user's project, a scratch mirror of it with one linked file and one linked folder."""
    user, mirror_root = tmp_path / "user", tmp_path / "scratch"
    project = user / "project"
    (project / "data").mkdir(parents=True)
    (project / "big.bin").write_bytes(b"x")
    (project / ".cache").mkdir()
    (user / "sibling").mkdir()
    leaf = mirror_root / str(project).lstrip("/")
    leaf.mkdir(parents=True)
    (leaf / "copy.txt").write_text("a copy")
    os.symlink(project / "big.bin", leaf / "big.bin")
    os.symlink(project / "data", leaf / "data")
    os.symlink(user / "sibling", leaf.parent / "sibling")
    guard = Guard(protected=[project], linked=[user / "sibling"], allowed=[mirror_root, project / ".cache"],
                  mirror_root=str(mirror_root))
    return guard, project, leaf, user


def refused(guard: Guard, event: str, *args) -> bool:
    try:
        guard.check(event, args)
    except PermissionError as err:
        assert "--real-cwd" in str(err)
        return True
    return False


def test_writes_that_land_in_the_users_folder_are_refused_and_recorded(layout):
    guard, project, leaf, user = layout
    assert refused(guard, "open", str(leaf / "big.bin"), "ab", os.O_WRONLY | os.O_APPEND)  # through a link
    assert refused(guard, "open", str(leaf / "data" / "new.npy"), "wb", WRITE)  # into a linked folder
    assert refused(guard, "open", str(project / "out.txt"), None, WRITE)  # an absolute path into the folder
    assert refused(guard, "os.rename", str(leaf / "copy.txt"), str(leaf / "data" / "x"), -1, -1)
    assert refused(guard, "shutil.rmtree", str(leaf / "data" / "sub"), None)
    assert refused(guard, "os.truncate", str(leaf / "big.bin"), 0)
    assert refused(guard, "os.chmod", str(leaf / "big.bin"), 0o600, -1)
    assert refused(guard, "open", str(leaf / "data" / ".." / "escaped.txt"), "w", WRITE)  # `..` after a link
    assert guard.refusals == 8
    assert guard.report()["refused"][0] == {"event": "open", "path": str(project / "big.bin"), "pid": os.getpid()}


def test_reading_and_writing_the_scratch_copies_and_caches_is_allowed(layout):
    guard, project, leaf, user = layout
    assert not refused(guard, "open", str(leaf / "big.bin"), "rb", os.O_RDONLY)  # reading is fine
    assert not refused(guard, "open", str(leaf / "copy.txt"), "w", WRITE)  # a copy in the scratch mirror
    assert not refused(guard, "os.remove", str(leaf / "big.bin"), -1)  # removes the mirror's link, not the file
    assert not refused(guard, "os.rename", str(leaf / "copy.txt"), str(leaf / "moved.txt"), -1, -1)
    assert not refused(guard, "open", str(project / ".cache" / "hub.bin"), "wb", WRITE)  # allowed, the nearer rule
    assert not refused(guard, "open", 3, "wb", WRITE)  # a file descriptor: its open was checked
    assert not refused(guard, "os.kill", os.getpid(), 0)  # no notes file: nothing to record
    assert guard.refusals == 0


def test_a_linked_sibling_is_protected_through_the_mirror_only(layout):
    guard, project, leaf, user = layout
    assert refused(guard, "open", os.path.join(leaf, "..", "sibling", "log.txt"), "w", WRITE)  # ../sibling
    assert not refused(guard, "open", str(user / "sibling" / "log.txt"), "w", WRITE)  # absolute: not the folder


def test_removal_resolves_all_but_the_last_component(tmp_path):
    os.symlink(tmp_path, tmp_path / "link")
    spelled, real = locate(str(tmp_path / "link"), follow=False)
    assert real == str(tmp_path / "link")
    assert locate(str(tmp_path / "link"), follow=True)[1] == str(tmp_path)
    assert locate("relative.txt", follow=True)[1] == os.path.join(os.path.realpath(os.getcwd()), "relative.txt")


def test_signals_at_the_benchmarks_processes_are_noted_before_they_are_sent(tmp_path):
    notes = tmp_path / "notes.jsonl"
    guard = Guard(notes_path=str(notes), main_pid=os.getpid(), parent_pid=4242)
    assert guard.watched == frozenset({"os.kill", "os.killpg"})  # no folder to protect: signals only
    guard.check("os.kill", (4242, 9))  # the parent: speedfix's supervisor
    guard.check("os.killpg", (os.getpid(), 15))  # the child's own group
    guard.check("os.kill", (12345, 9))  # somebody else: not noted
    assert [(n["target"], n["signal"]) for n in read_notes(str(notes))] == [("parent", "SIGKILL"), ("child", "SIGTERM")]
