"""The supervisor between the runner and one benchmark child: nothing the run started outlives it.

Started by ``runner.py`` as ``python -I -S reaper.py STATUS [--cleanup DIR] -- CMD...`` in a session
of its own, with a pipe from the runner on its stdin. Standard library only, no speedfix import and
nothing newer than Python 3.8: it may run under the interpreter of the user's training environment.

What makes it hold (Linux):

* it makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``): every process the run
  starts that loses its parent - a double-forked daemon, a helper that called ``setsid()`` and
  cleared its environment, the workers of a SIGKILLed child - is reparented to this process, not
  to init. Its descendants are therefore exactly what the run left, whatever they did to their
  session, process group or environment;
* it starts CMD (the child) in a session of its own and waits. When the child ends, when the
  runner writes ``k`` on the pipe, when the pipe reaches end-of-file (the runner died, even by
  SIGKILL) or on SIGTERM/SIGINT/SIGHUP, it kills the child's process group, then every remaining
  descendant (found by walking ``/proc`` for processes whose parent chain reaches it), reaps them
  and exits;
* if the runner died, it also removes the run's work directory (``--cleanup``), which no one
  else would.

The status file (JSON, replaced atomically) says ``child_pid`` once the child runs, and at the end
``returncode`` (the child's, as ``subprocess`` gives it: negative for a signal), ``leftovers``
(processes that were still alive outside the child's process group once the group was dead),
``remaining`` (processes that could not be killed) and ``reason``. The child's stdout and stderr
are this process's; it writes nothing to them.

It cannot protect against a script that kills this process itself (it is the script's parent):
the runner's second net (the child's process group and the ``SPEEDFIX_RUN_ID`` marker) then
applies, and the child dies with its parent if it asked for ``PR_SET_PDEATHSIG``.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
KILL_REQUEST = b"k"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
GROUP_SETTLE_S = 1.0  # let the group's SIGKILL land before calling anything a leftover
KILL_DEADLINE_S = 10.0
EXIT_CANNOT_START = 3


def set_subreaper() -> bool:
    """Ask Linux to reparent orphaned descendants to this process; False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def process_table() -> dict:
    """pid -> (ppid, pgid, state) for every process /proc shows."""
    table = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            table[int(entry)] = (int(fields[1]), int(fields[2]), fields[0].decode("ascii", "replace"))
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    return table


def descendants(root: int) -> list:
    """(pid, pgid) of every living (not zombie) process whose parent chain reaches ``root``."""
    table = process_table()
    children = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        ppid, pgid, state = table[pid]
        if state not in ("Z", "X"):
            found.append((pid, pgid))
        todo.extend(children.get(pid, ()))
    return found


def exit_code(status: int):
    """The code ``subprocess`` would report for a ``waitpid`` status."""
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return None


class Supervisor:
    def __init__(self, status_path: str, cleanup: str, cmd: list) -> None:
        self.status_path, self.cleanup, self.cmd = status_path, cleanup, cmd
        self.status = {"supervisor_pid": os.getpid()}
        self.exited = {}  # pid -> exit code of every child reaped so far
        self.stop_signal = None

    def write_status(self, **fields) -> None:
        self.status.update(fields)
        tmp = "%s.tmp" % self.status_path
        try:
            with open(tmp, "w") as f:
                json.dump(self.status, f)
            os.replace(tmp, self.status_path)
        except OSError:  # the work directory is gone: nobody is left to read it
            pass

    def reap(self) -> bool:
        """Collect every exited child (the run's orphans become ours: no zombie piles up).

        True once this process has no child left at all."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            except InterruptedError:
                continue
            if pid == 0:
                return False
            self.exited[pid] = exit_code(status)

    def _on_stop_signal(self, signum, frame) -> None:
        self.stop_signal = signum

    def run(self) -> int:
        subreaper = set_subreaper()
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)  # a SIGCHLD or a stop signal ends the select() below at once
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_stop_signal)
        try:
            child = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as err:
            self.write_status(error="cannot start %s: %s" % (self.cmd[0], err), done=True)
            return EXIT_CANNOT_START
        self.write_status(child_pid=child.pid, subreaper=subreaper)
        reason, runner_gone = self._wait(child.pid, wake_r)
        leftovers, remaining = self.kill_all(child.pid)
        returncode = self.exited.get(child.pid)
        if returncode is None:  # not reaped within the deadline (uninterruptible sleep)
            try:
                returncode = exit_code(os.waitpid(child.pid, 0)[1])
            except ChildProcessError:
                returncode = None
        child.returncode = returncode  # reaped here: subprocess must not wait for it again
        self.write_status(returncode=returncode, reason=reason, leftovers=leftovers, remaining=remaining,
                          done=True)
        if runner_gone and self.cleanup and os.path.basename(self.cleanup).startswith("speedfix-"):
            shutil.rmtree(self.cleanup, ignore_errors=True)
        return 0

    def _wait(self, child_pid: int, wake_r: int):
        """Block until the child ends, the runner asks or goes away, or a stop signal arrives."""
        watched = [0, wake_r]
        while True:
            self.reap()
            if child_pid in self.exited:
                return "child exited", False
            if self.stop_signal is not None:
                return "signal %d" % self.stop_signal, False
            try:
                ready = select.select(watched, [], [], 1.0)[0]
            except InterruptedError:
                continue
            except OSError:  # no usable stdin: only the child's end or a signal can stop this
                watched, ready = [wake_r], []
            if wake_r in ready:
                try:
                    while os.read(wake_r, 512):
                        pass
                except (BlockingIOError, InterruptedError):
                    pass
            if 0 in ready:
                try:
                    data = os.read(0, 512)
                except OSError:
                    data = b""
                if not data:
                    return "runner gone", True
                if KILL_REQUEST in data:
                    return "runner asked", False

    def kill_all(self, child_pid: int):
        """Kill the child's group, then every other descendant; returns (leftovers, remaining)."""
        me = os.getpid()
        if child_pid not in self.exited:  # not reaped yet: its pid, the group's id, cannot be reused
            try:
                os.killpg(child_pid, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + GROUP_SETTLE_S
        while True:
            self.reap()
            procs = descendants(me)
            in_group = [pid for pid, pgid in procs if pgid == child_pid]
            if not in_group or time.monotonic() > deadline:
                break
            for pid in in_group:  # the members one by one: only this process's descendants are touched
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)
        leftovers = sorted(pid for pid, pgid in procs if pgid != child_pid)
        deadline = time.monotonic() + KILL_DEADLINE_S
        while procs and time.monotonic() < deadline:
            for pid, _ in procs:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)
            self.reap()
            procs = descendants(me)
        # The killed processes' zombies are reparented here a moment after they die: wait for them.
        deadline = time.monotonic() + 2.0
        while not self.reap() and time.monotonic() < deadline:
            time.sleep(0.01)
        return leftovers, sorted(pid for pid, _ in procs)


def main(argv: list) -> int:
    try:
        split = argv.index("--")
    except ValueError:
        split = -1
    head, cmd = argv[1:split], argv[split + 1:]
    if split < 0 or not head or not cmd:
        sys.stderr.write("usage: reaper.py STATUS [--cleanup DIR] -- CMD...\n")
        return 2
    cleanup = ""
    if len(head) == 3 and head[1] == "--cleanup":
        cleanup = head[2]
    return Supervisor(head[0], cleanup, cmd).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
