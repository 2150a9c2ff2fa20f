"""What the benchmarked script may not do to the user's files, and who sent a fatal signal.

Loaded by ``child.py`` from its own folder (standard library only, like it: it runs inside the
user's training environment). One audit hook (``sys.addaudithook``) does two jobs:

* **the write guard.** The script runs from a scratch mirror of its folder and of the working
  directory (``runner.mirror_tree``): small files are copies, but large files and crowded folders
  are links to the real ones, and a script can name any absolute path. Every change to a path
  whose real location is inside a protected folder (the user's working directory and the script's
  folder, however the path was spelled) or, for a path reached through the mirror, inside what one
  of its links leads to (``../sibling`` folders, a user's own links) is refused with a
  ``PermissionError`` that says so: opening for writing, removing, renaming, truncating,
  ``chmod``/``chown``/``utime``, making or removing folders, links, extended attributes,
  ``shutil.rmtree``. The nearest listed folder decides, so the run's own scratch folder and the
  usual caches (``~/.cache``, the inductor and triton caches) stay writable even inside a protected
  folder. Each refusal is recorded;
* **the signal watch.** A signal the script sends to the benchmark's own processes (its parent,
  the supervisor; the child; their groups; every process) is written to the notes file *before*
  it is sent, so that the runner can tell "the script killed its parent" from a kill that came
  from elsewhere.

Its fast path is one set lookup per audit event (a step of a training loop raises a few: ``id()``
calls, worker sockets); only the events above do more. Audit hooks run outside anything Dynamo
traces. Processes started by ``fork`` (DataLoader workers on Linux) inherit the hook; ``spawn`` and
``forkserver`` workers and programs the script starts do not (documented in docs/benchmarks.md).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
MAX_RECORDED = 100

# event -> ((index of a path argument, index of its dir_fd argument or None, follow symlinks), ...)
# "follow": the call acts on what a link points to (open, chmod); otherwise on the entry itself
# (removing or renaming a link in the mirror leaves its target alone).
PATH_EVENTS: dict[str, tuple[tuple[int, int | None, bool], ...]] = {
    "os.remove": ((0, 1, False),),
    "os.rename": ((0, 2, False), (1, 3, False)),
    "os.rmdir": ((0, 1, False),),
    "os.mkdir": ((0, 2, False),),
    "os.truncate": ((0, None, True),),
    "os.chmod": ((0, 2, True),),
    "os.chown": ((0, 3, True),),
    "os.chflags": ((0, None, True),),
    "os.utime": ((0, 3, True),),
    "os.link": ((1, 3, False),),
    "os.symlink": ((1, 2, False),),
    "os.setxattr": ((0, None, True),),
    "os.removexattr": ((0, None, True),),
    "shutil.rmtree": ((0, 1, False),),
}
SIGNAL_EVENTS = ("os.kill", "os.killpg")


def _fd_path(fd: object) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{int(fd)}")  # type: ignore[call-overload]
    except (OSError, TypeError, ValueError):
        return None


def locate(path: object, dir_fd: object = None, follow: bool = True) -> tuple[str, str] | None:
    """Where a path argument points: (as spelled, made absolute; where it really lands, links
    resolved - all of them, or all but the last component), relative to the working directory or
    to ``dir_fd``; None when it cannot be told."""
    if isinstance(path, int):
        real = _fd_path(path)
        return None if real is None else (real, real)
    try:
        name = os.fsdecode(path)  # type: ignore[arg-type]
    except TypeError:
        return None
    if not os.path.isabs(name):
        base = _fd_path(dir_fd) if isinstance(dir_fd, int) and dir_fd >= 0 else os.getcwd()
        if base is None:
            return None
        name = os.path.join(base, name)
    head, tail = os.path.split(name)
    if follow or tail in ("", ".", ".."):
        return name, os.path.realpath(name)
    return name, os.path.join(os.path.realpath(head), tail)


def _nearest(path: str, rules: dict[str, bool]) -> bool | None:
    """The rule of the nearest folder of ``path`` (itself included) that has one."""
    while True:
        rule = rules.get(path)
        if rule is not None:
            return rule
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


class Guard:
    """The audit hook. ``protected``: real folders never to change; ``linked``: real paths not to
    change through the mirror (under ``mirror_root``); ``allowed``: writable even inside those;
    ``notes_path``: where signal notes go (JSON lines); ``main_pid``/``parent_pid``: the benchmark
    child and its supervisor."""

    def __init__(self, *, protected=(), linked=(), allowed=(), mirror_root: str | None = None,
                 notes_path: str | None = None, main_pid: int | None = None, parent_pid: int | None = None) -> None:
        # nearest listed folder wins: True protected, False allowed
        allowed_rules = {os.path.realpath(p): False for p in allowed}
        self.rules: dict[str, bool] = {**{os.path.realpath(p): True for p in protected}, **allowed_rules}
        self.linked_rules: dict[str, bool] = {**{os.path.realpath(p): True for p in linked}, **allowed_rules}
        roots = {mirror_root, os.path.realpath(mirror_root)} if mirror_root else set()
        self.mirror_roots = tuple(r.rstrip(os.sep) + os.sep for r in roots)  # as given and resolved
        self.notes_path = notes_path
        self.main_pid = os.getpid() if main_pid is None else main_pid
        self.parent_pid = parent_pid
        self.refused: list[dict] = []
        self.refusals = 0
        active = protected or linked
        self.active = bool(active)
        self.watched = frozenset(("open", *PATH_EVENTS, *SIGNAL_EVENTS) if active else SIGNAL_EVENTS)

    def install(self) -> None:
        watched, check = self.watched, self.check

        def hook(event: str, args: tuple) -> None:
            if event in watched:
                check(event, args)

        self.hook_code = hook.__code__
        sys.addaudithook(hook)

    def hide_from_dynamo(self) -> None:
        """Audit events fire inside compiled code too (``id()``): Dynamo must never try to compile
        the hook, nor what it calls. Called once Dynamo is loaded (the guard never imports it)."""
        code = getattr(self, "hook_code", None)
        if code is None:
            return
        try:
            from torch._dynamo.eval_frame import FrameAction, FrameExecStrategy, set_code_exec_strategy

            set_code_exec_strategy(code, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))
        except ImportError:  # older torch
            try:
                from torch._dynamo.eval_frame import skip_code

                skip_code(code)
            except ImportError:
                pass

    # ------------------------------------------------------------ writes
    def protects(self, spelled: str, real: str) -> bool:
        """Whether a change at ``real`` (reached as ``spelled``) would change the user's files."""
        if _nearest(real, self.rules):
            return True
        through_mirror = bool(self.mirror_roots) and spelled.startswith(self.mirror_roots)
        return through_mirror and bool(_nearest(real, self.linked_rules))

    def check(self, event: str, args: tuple) -> None:
        if event == "open":
            if len(args) > 2 and isinstance(args[2], int) and args[2] & WRITE_FLAGS and args[0] is not None:
                self._refuse_if_protected(event, locate(args[0]))
            return
        if event in SIGNAL_EVENTS:
            self._note_signal(event, args)
            return
        for index, fd_index, follow in PATH_EVENTS[event]:
            if index < len(args):
                dir_fd = args[fd_index] if fd_index is not None and fd_index < len(args) else None
                self._refuse_if_protected(event, locate(args[index], dir_fd, follow))

    def _refuse_if_protected(self, event: str, where: tuple[str, str] | None) -> None:
        if where is None or not self.protects(*where):
            return
        real = where[1]
        self.refusals += 1
        if len(self.refused) < MAX_RECORDED:
            self.refused.append({"event": event, "path": real, "pid": os.getpid()})
        raise PermissionError(errno.EACCES, f"speedfix bench keeps your files unchanged: {event} of {real} refused "
                              "(the script runs in a scratch copy of its folder; run with --real-cwd to let it "
                              "change your files)", real)

    def report(self) -> dict:
        return {"active": self.active, "refusals": self.refusals, "refused": list(self.refused)}

    # ------------------------------------------------------------ signals
    def _note_signal(self, event: str, args: tuple) -> None:
        try:
            target, signum = int(args[0]), int(args[1])
        except (IndexError, TypeError, ValueError):
            return
        if signum == 0 or self.notes_path is None:
            return
        whom = self._whom(event, target)
        if whom is None:
            return
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = str(signum)
        write_note(self.notes_path, {"kind": "signal", "call": f"{event}({target}, {name})", "signal": name,
                                     "target": whom, "sender": os.getpid(), "sender_is_child": os.getpid() == self.main_pid})

    def _whom(self, event: str, target: int) -> str | None:
        """Which of the benchmark's processes a signal reaches: "parent" (the supervisor), "child"."""
        parent, main = self.parent_pid, self.main_pid
        if event == "os.killpg":
            return "parent" if target == parent else "child" if target == main else None
        if target == -1:
            return "parent"  # every process this user may signal
        if parent is not None and target in (parent, -parent):
            return "parent"
        if target in (main, -main) or (target == 0 and os.getpgrp() == main):
            return "child"
        return None


def write_note(path: str, note: dict) -> None:
    """Append one JSON line (one ``write`` call: lines of several processes do not interleave)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, (json.dumps(note) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def read_notes(path: str) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    notes = []
    for line in lines:
        try:
            note = json.loads(line)
        except ValueError:
            continue
        if isinstance(note, dict):
            notes.append(note)
    return notes


def default_allowed(workdir: str | None) -> list[str]:
    """Folders a run may always write: its own scratch folder and the usual caches."""
    home = os.path.expanduser("~")
    env = os.environ
    candidates = [workdir, os.path.join(home, ".cache"), os.path.join(home, ".triton"), env.get("XDG_CACHE_HOME"),
                  env.get("TORCHINDUCTOR_CACHE_DIR"), env.get("TRITON_CACHE_DIR"), env.get("HF_HOME"),
                  env.get("TORCH_HOME"), "/dev", "/proc", "/sys"]
    return [c for c in candidates if c]
