"""Spawn, watch, kill and collect one benchmark run (one fresh child process per measurement).

Nothing a run starts outlives :func:`run_once` (DataLoader workers, compile workers, helpers that start their own session), and nothing it writes stays:

* **Processes.** On Linux the child (``child.py``) is started by a small supervisor
  (``reaper.py``) that is a *child subreaper*: every process the run starts and orphans - a
  helper that called ``setsid()`` and cleared its environment included - is reparented to it, so
  it finds and kills all of them when the child ends, when the runner asks, and when the runner
  dies (its stdin pipe from the runner reaches end-of-file, even after a SIGKILL). The child's
  process group and the ``SPEEDFIX_RUN_ID`` environment marker remain a second net (and the only
  one elsewhere).
* **Temporary folders.** Each run works in ``$TMPDIR/speedfix-run-<owner>-*``, where the owner is
  the speedfix process (pid, start time, pid namespace). It is removed when the run ends, when
  speedfix is stopped by SIGTERM/SIGINT/SIGHUP (:func:`terminate_cleanly`), by the supervisor
  when speedfix was killed, and otherwise at the next start (:func:`sweep_stale_tempdirs`
  removes the folders of owners that are gone).
* **The user's files.** Unless asked for the real folders (``RunSpec.real_cwd`` or
  :func:`use_real_cwd`), the script runs from a scratch mirror of its own folder and of its
  working directory (:func:`mirror_tree`): ``__file__``, sibling imports and relative paths
  resolve the same, files it creates stay in the scratch folder, and the existing files it
  overwrites are copies (files up to ``COPY_FILE_LIMIT``). What the mirror links to instead of
  copying (large files, crowded folders) and absolute paths into the user's folders are kept
  unchanged by the child's write guard (``guard.py``), which refuses such changes.
"""

from __future__ import annotations

import contextvars
import getpass
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import threading
import uuid
from collections import deque
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from .guard import read_notes
from .results import RunnerInfo, RunResult
from .settings import RunConfig

CHILD = Path(__file__).with_name("child.py")
REAPER = Path(__file__).with_name("reaper.py")
SUPERVISED = sys.platform.startswith("linux")  # the subreaper needs Linux; elsewhere: group + marker
SUPERVISOR_WAIT_S = 30.0  # for the supervisor to kill and reap everything once asked
CONFIG_ENV = "SPEEDFIX_BENCH_CONFIG"
MARKER_ENV = "SPEEDFIX_RUN_ID"
TAIL_CHARS = 4000


@dataclass
class RunSpec:
    """One thing to run: a script, its arguments, the directory it runs from."""

    script: Path
    args: list[str] = field(default_factory=list)
    cwd: Path | None = None  # None: the current directory (what `python path/x.py` would see)
    label: str = ""
    # True: run in ``cwd`` itself (what the script writes lands there). False: in a scratch mirror
    # of it. None: as :func:`use_real_cwd` says (default False).
    real_cwd: bool | None = None

    @property
    def name(self) -> str:
        return self.label or self.script.name


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL_CHARS))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def marked_pids(run_id: str) -> list[int]:
    """Processes whose environment carries this run's marker (catches setsid'd descendants)."""
    needle = f"{MARKER_ENV}={run_id}".encode()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:  # no /proc (macOS): the process group is all there is
        return found
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # gone, or not ours
            continue
    return found


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def reap(run_id: str, pgid: int | None) -> list[int]:
    """Kill the run's process group, then every marked process that escaped it (``setsid``).

    Returns the escaped processes that were still alive once the group was dead.
    """
    if pgid is not None:
        _kill_group(pgid)
    deadline = time.monotonic() + 1.0
    while True:  # let the group's SIGKILL land before calling anything a leftover
        alive = [p for p in marked_pids(run_id) if p != pgid and _alive(p)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    leftovers = alive
    deadline = time.monotonic() + 5.0
    while alive and time.monotonic() < deadline:
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)
        alive = [p for p in marked_pids(run_id) if _alive(p)]
    return leftovers


def _alive(pid: int) -> bool:
    """True unless the process is gone or a zombie (a zombie holds no resources)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


# ---------------------------------------------------------------- signals

_shield = threading.local()


@contextmanager
def terminate_cleanly() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into SystemExit (SIGINT stays KeyboardInterrupt) while benchmarking,
    so that run_once's cleanup runs. A signal that arrives during a cleanup (:func:`shielded`) is
    held back until the cleanup is done."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        if getattr(_shield, "depth", 0):
            _shield.pending = signum
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def shielded() -> Iterator[None]:
    """Run a cleanup to its end: a SIGTERM/SIGINT/SIGHUP caught by :func:`terminate_cleanly` while
    it runs is raised afterwards (a second Ctrl-C must not leave a folder or a process behind)."""
    _shield.depth = getattr(_shield, "depth", 0) + 1
    try:
        yield
    finally:
        _shield.depth -= 1
        pending = getattr(_shield, "pending", None)
        if not _shield.depth and pending is not None:
            _shield.pending = None
            if pending == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + pending)


# ---------------------------------------------------------------- temporary folders

# speedfix-<kind>-<pid>.<start ticks>.<pid namespace>-<random>
_OWNED = re.compile(r"^speedfix-[a-z]+-(\d+)\.(\d+)\.(\d+)-")
# multiprocessing binds DataLoader workers' sockets at $TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX, and a
# socket's path holds at most 103 bytes (macOS; 107 on Linux): under a long $TMPDIR the run's own
# temp folder would push it over and the workers could not share a batch (the run would hang), so
# the child then keeps the user's TMPDIR.
_CHILD_TMPDIR_MAX = 103 - len("/pymp-XXXXXXXX/listener-XXXXXXXX")
LEGACY_RUN_DIR_AGE_S = 24 * 3600.0  # speedfix-run-* folders without an owner (older versions)


def _start_ticks(pid: int) -> int:
    """The process's start time in clock ticks since boot (0 where /proc cannot say)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def _pid_namespace() -> int:
    try:
        return int(re.sub(r"\D", "", os.readlink("/proc/self/ns/pid")) or 0)
    except (OSError, ValueError):
        return 0


def owner_token() -> str:
    """Who owns a temporary folder: this process, told apart from a later one with the same pid."""
    return f"{os.getpid()}.{_start_ticks(os.getpid())}.{_pid_namespace()}"


def owned_tempdir(prefix: str) -> Path:
    """A fresh ``$TMPDIR/<prefix><owner>-*`` folder that :func:`sweep_stale_tempdirs` can attribute.

    ``prefix`` looks like ``speedfix-run-`` (``speedfix-<lowercase kind>-``)."""
    if not re.fullmatch(r"speedfix-[a-z]+-", prefix):
        raise ValueError(f"bad prefix {prefix!r}")
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{owner_token()}-"))


def _owner_alive(pid: int, start: int) -> bool:
    if os.path.isdir("/proc"):
        if not _alive(pid):
            return False
        return not start or _start_ticks(pid) == start  # another process with a reused pid: gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_tree(path: Path | str) -> None:
    """``rmtree`` that never follows a symlink and unlocks folders a script made read-only."""

    top = os.path.abspath(path)

    def retry(func, failed, _exc) -> None:
        try:
            for candidate in (os.path.dirname(failed), failed):
                candidate = os.path.abspath(candidate)
                inside = candidate == top or candidate.startswith(top + os.sep)
                if inside and stat.S_ISDIR(os.lstat(candidate).st_mode):  # a real folder, never a link's target
                    os.chmod(candidate, 0o700)
            func(failed)
        except OSError:
            pass

    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            os.unlink(path)
            return
    except OSError:
        return
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=retry)
    else:
        shutil.rmtree(path, onerror=retry)
    shutil.rmtree(path, ignore_errors=True)  # what the retries could not remove on the first pass


def sweep_stale_tempdirs(directory: Path | str | None = None, *,
                         legacy_age_s: float = LEGACY_RUN_DIR_AGE_S) -> list[Path]:
    """Remove the temporary folders of speedfix processes that are gone (killed before cleaning up).

    A folder named by :func:`owned_tempdir` is removed when its owner process is no longer alive
    (or its pid now belongs to another process). Folders of another pid namespace (a container
    sharing /tmp) and ``speedfix-run-*`` folders without an owner (older versions) are removed
    only once untouched for ``legacy_age_s``. Only this user's folders, never through a link.
    """
    base = Path(directory or tempfile.gettempdir())
    namespace, now, removed = _pid_namespace(), time.time(), []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith("speedfix-"):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or (hasattr(os, "getuid") and info.st_uid != os.getuid()):
            continue
        old = now - info.st_mtime > legacy_age_s
        owner = _OWNED.match(entry.name)
        if owner:
            pid, start, ns = (int(g) for g in owner.groups())
            if ns != namespace and not old:
                continue
            if ns == namespace and _owner_alive(pid, start):
                continue
        elif not (entry.name.startswith("speedfix-run-") and old):
            continue
        remove_tree(entry.path)
        removed.append(Path(entry.path))
    return removed


# ---------------------------------------------------------------- scratch working directory

COPY_FILE_LIMIT = 16 * 2**20  # larger files are linked, not copied
COPY_TOTAL_LIMIT = 64 * 2**20  # per mirror; past it, files are linked
# Checkpoints are what scripts overwrite (torch.save over last run's file): copied up to far more,
# so that only a data file, which scripts read, is ever linked for its size.
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".safetensors", ".pth.tar")
CHECKPOINT_FILE_LIMIT = 2 * 2**30
CHECKPOINT_TOTAL_LIMIT = 4 * 2**30
MIRROR_ENTRIES = 256  # entries re-created below the mirrored folder's top level; past it, folders are linked
VCS_FOLDERS = frozenset({".git", ".hg", ".svn"})  # linked, never re-created (large, and scripts only read them)
MIRROR_PARENTS = 2  # parent levels mirrored as links (``..``, ``../..``)

_real_cwd_default: contextvars.ContextVar[bool] = contextvars.ContextVar("speedfix_real_cwd", default=False)


@contextmanager
def use_real_cwd(real: bool) -> Iterator[None]:
    """Inside this block, RunSpecs with ``real_cwd=None`` run in their real working directory
    (``True``) or in a scratch mirror of it (``False``, the default)."""
    token = _real_cwd_default.set(bool(real))
    try:
        yield
    finally:
        _real_cwd_default.reset(token)


def runs_in_real_cwd(spec: RunSpec) -> bool:
    return _real_cwd_default.get() if spec.real_cwd is None else bool(spec.real_cwd)


@dataclass
class Mirror:
    """A scratch view of real folders under ``root``: ``path(real)`` stands for ``real``."""

    root: Path
    leaf: Path  # the view of the first folder mirrored
    linked_files: dict[str, tuple[int, int]] = field(default_factory=dict)  # real path -> (size, mtime_ns)
    tops: list[str] = field(default_factory=list)  # the folders mirrored (real paths)
    link_targets: set[str] = field(default_factory=set)  # real locations the mirror's links lead to

    def path(self, real: Path | str) -> Path:
        """Where a real path (in or below a mirrored folder) is seen in the mirror."""
        return self.root.joinpath(*Path(os.path.abspath(real)).parts[1:])

    def guard_config(self) -> dict:
        """What the write guard of the run (guard.py) protects: the mirrored folders, and what the
        mirror's links lead to outside them."""
        tops = sorted({os.path.realpath(t) for t in self.tops})
        outside = sorted(t for t in self.link_targets if not any(_inside(t, top) for top in tops))
        return {"protected": tops, "linked": outside, "mirror_root": str(self.root)}

    def modified(self) -> list[str]:
        """Linked (large) real files whose size or modification time changed since the mirror was made."""
        changed = []
        for path, before in self.linked_files.items():
            try:
                info = os.stat(path)
                now = (info.st_size, info.st_mtime_ns)
            except OSError:
                now = None
            if now != before:
                changed.append(path)
        return changed


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _skip_entry(name: str) -> bool:
    return name.startswith("speedfix-") and bool(_OWNED.match(name) or name.startswith("speedfix-run-"))


def mirror_tree(reals: Path | str | Sequence[Path | str], root: Path, *, skip: Collection[str] = ()) -> Mirror:
    """Build ``root/<absolute path of each real folder>``, folders in which the same relative names
    resolve as in the real ones (``Mirror.path``; ``Mirror.leaf`` for the first), and return them.

    * Every entry of a mirrored folder is there. Its sub-folders (hidden ones and ``__pycache__``
      included; not version-control folders such as ``.git``) are re-created as real folders,
      breadth first, while they hold fewer than ``MIRROR_ENTRIES`` entries in all; a sub-folder
      past that budget is a link to the real one. A mirrored folder, and every folder on the way
      from one mirrored folder down to another (the script's folder below the working directory),
      is always re-created in full.
    * Regular files up to ``COPY_FILE_LIMIT`` (and ``COPY_TOTAL_LIMIT`` in all) are copies: a script that
      overwrites ``checkpoint.pt`` or appends to a log changes the copy. Checkpoint files
      (``CHECKPOINT_SUFFIXES``) are copied up to ``CHECKPOINT_FILE_LIMIT`` each (and
      ``CHECKPOINT_TOTAL_LIMIT`` in all). Larger files, links and special files are links to the
      real ones (``Mirror.modified`` tells if one was changed).
    * The ``MIRROR_PARENTS`` levels above each mirrored folder are folders of links to those
      parents' entries, so that ``../data`` and ``Path(__file__).parents[1]`` resolve too.
    * Names in ``skip`` (at the top level of the first folder) and speedfix's own temporary folders
      are left out.

    What the links reach is real: the write guard of the benchmark child (guard.py) refuses
    changes there (``Mirror.protected``).
    """
    given = [reals] if isinstance(reals, (str, os.PathLike)) else list(reals)
    tops = list(dict.fromkeys(Path(os.path.abspath(r)) for r in given))
    first = tops[0]
    # folders that are never links: the mirrored ones and those between them and the root
    keep = {*tops, *(parent for top in tops for parent in top.parents)}
    outer = [t for t in tops if not any(o != t and o in t.parents for o in tops)]
    mirror = Mirror(root, root.joinpath(*first.parts[1:]), tops=[str(t) for t in tops])

    def link(source: Path, dest: Path) -> None:
        _link(source, dest)
        mirror.link_targets.add(os.path.realpath(source))

    levels = {Path(*top.parts[:depth + 1]) for top in outer
              for depth in range(max(0, len(top.parts) - 1 - MIRROR_PARENTS), len(top.parts) - 1)}
    for level in sorted(levels):  # parents: links to their entries, except those leading down to a mirrored folder
        target = mirror.path(level)
        target.mkdir(parents=True, exist_ok=True)
        try:
            names = [e.name for e in os.scandir(level)]
        except OSError:  # unreadable: nothing to mirror there
            continue
        for name in names:
            if level / name not in keep and not _skip_entry(name):
                link(level / name, target / name)
    budget, copied_bytes, checkpoint_bytes = MIRROR_ENTRIES, 0, 0
    queue: deque[tuple[Path, Path, bool]] = deque()
    for top in outer:
        mirror.path(top).mkdir(parents=True, exist_ok=True)
        queue.append((top, mirror.path(top), True))
    while queue:
        source, dest, full = queue.popleft()
        listing: list[os.DirEntry] | None = []
        try:
            with os.scandir(source) as it:
                for entry in it:
                    if _skip_entry(entry.name) or (source == first and entry.name in skip):
                        continue
                    listing.append(entry)
                    if not full and len(listing) > budget:
                        break
        except OSError:
            listing = None
        if not full and (listing is None or len(listing) > budget):  # past the budget: link the folder
            try:
                dest.rmdir()
            except OSError:
                continue
            link(source, dest)
            continue
        if not full:  # mirrored folders are always there in full
            budget -= len(listing or ())
        for entry in listing or ():
            src, dst = Path(entry.path), dest / entry.name
            try:
                if entry.is_dir(follow_symlinks=False) and (src in keep or entry.name not in VCS_FOLDERS):
                    dst.mkdir(exist_ok=src in keep)
                    queue.append((src, dst, src in keep))
                    continue
                if entry.is_file(follow_symlinks=False):
                    info = entry.stat(follow_symlinks=False)
                    small = info.st_size <= COPY_FILE_LIMIT and copied_bytes + info.st_size <= COPY_TOTAL_LIMIT
                    checkpoint = (not small and entry.name.endswith(CHECKPOINT_SUFFIXES)
                                  and info.st_size <= CHECKPOINT_FILE_LIMIT
                                  and checkpoint_bytes + info.st_size <= CHECKPOINT_TOTAL_LIMIT)
                    if small or checkpoint:
                        try:
                            shutil.copy2(src, dst, follow_symlinks=False)
                            if small:
                                copied_bytes += info.st_size
                            else:
                                checkpoint_bytes += info.st_size
                            continue
                        except OSError:  # unreadable: the link fails for the script as the original would
                            dst.unlink(missing_ok=True)
                    mirror.linked_files[str(src)] = (info.st_size, info.st_mtime_ns)
                link(src, dst)
            except OSError:
                continue
    return mirror


def _link(source: Path, dest: Path) -> None:
    try:
        os.symlink(source, dest)
    except OSError:
        pass


# ---------------------------------------------------------------- one run

def _failed(status: str, message: str, spec: RunSpec) -> RunResult:
    return RunResult.failed(status, message, str(spec.script), spec.args)


def run_once(spec: RunSpec, config: RunConfig) -> RunResult:
    """Run the script once in a fresh child and return its result (schema speedfix.bench/0.1).

    Never raises for a failing script: the status says what happened (ok, incomplete, error,
    timeout, no_steps) and ``runner`` holds the return code and the stdout/stderr tails.
    """
    sweep_stale_tempdirs()
    workdir = owned_tempdir("speedfix-run-")
    try:
        return _run_in(workdir, spec, config)
    finally:  # also when the benchmark itself is interrupted
        with shielded():
            remove_tree(workdir)


class _Supervised:
    """The child behind ``reaper.py``: ``proc`` is the supervisor, the status file names the child."""

    lost = False  # the supervisor died before it finished (killed by the script, or by something else)

    def __init__(self, config: RunConfig, workdir: Path, cwd: Path, env: dict, out, err) -> None:
        self.status_path = workdir / "supervisor.json"
        cmd = [config.python, "-I", "-S", str(REAPER), str(self.status_path), "--cleanup", str(workdir), "--",
               config.python, str(CHILD)]
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=out, stderr=err,
                                     start_new_session=True)

    def status(self) -> dict:
        try:
            return json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return {}

    def stop(self, run_id: str) -> tuple[int | None, list[int]]:
        """Have the supervisor kill and reap everything; returns (child's return code, leftovers)."""
        proc = self.proc
        try:
            if proc.poll() is None:
                proc.stdin.write(b"k")
                proc.stdin.flush()
        except (OSError, ValueError):  # it is gone already
            pass
        try:
            proc.wait(timeout=SUPERVISOR_WAIT_S)
        except subprocess.TimeoutExpired:  # frozen: kill it, the second net below takes over
            proc.kill()
            proc.wait()
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass
        status = self.status()
        leftovers = list(status.get("leftovers") or [])
        # Second net: the marker, and the child's group if the supervisor did not finish (killed by
        # the script, or frozen). After a clean finish the child is reaped and its pid may be reused.
        self.lost = not status.get("done")
        child = None if status.get("done") else status.get("child_pid")
        if child is not None and child not in marked_pids(run_id):
            child = None  # reaped already, and its pid may now lead somebody else's group
        extra = reap(run_id, child)
        leftovers += [p for p in extra if p not in leftovers]
        returncode = status["returncode"] if "returncode" in status else proc.returncode
        return returncode, leftovers


class _Direct:
    """Without the supervisor (not Linux): the child leads its own session; group + marker at the end."""

    lost = False

    def __init__(self, config: RunConfig, workdir: Path, cwd: Path, env: dict, out, err) -> None:
        self.proc = subprocess.Popen([config.python, str(CHILD)], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=err, start_new_session=True)

    def stop(self, run_id: str) -> tuple[int | None, list[int]]:
        leftovers = reap(run_id, self.proc.pid)
        self.proc.wait()
        return self.proc.returncode, leftovers


def _run_in(workdir: Path, spec: RunSpec, config: RunConfig) -> RunResult:
    script = spec.script.resolve()
    cwd = (spec.cwd or Path.cwd()).resolve()
    run_id = uuid.uuid4().hex
    (workdir / "tmp").mkdir()
    mirror = None
    run_cwd, run_script = cwd, script
    if not runs_in_real_cwd(spec):
        try:  # the working directory and the script's own folder (its __file__, siblings, Path(__file__).parent)
            mirror = mirror_tree([cwd, script.parent], workdir / "mirror")
            run_cwd, run_script = mirror.leaf, mirror.path(script)
            if not os.path.lexists(run_script):
                raise OSError(f"{script.name} could not be placed in it")
        except OSError as err:
            result = _failed("error", f"could not prepare the scratch working directory ({err}); "
                             "run in the real one with --real-cwd", spec)
            return replace(result, runner=RunnerInfo(run_id=run_id))  # never started: no wall time
    result_path, notes_path = workdir / "result.json", workdir / "notes.jsonl"
    child_cfg = {"script": str(run_script), "args": list(spec.args), "seed": config.seed,
                 "seed_offset": config.seed_offset, "warmup_steps": config.warmup_steps,
                 "warmup_s": config.warmup_s, "steps": config.steps, "window_s": config.window_s,
                 "timeout_s": config.timeout_s, "record_all_steps": config.record_all_steps,
                 "result_path": str(result_path), "notes_path": str(notes_path), "workdir": str(workdir),
                 "mirror_root": str(mirror.root) if mirror else None, "guard_path": None}
    if mirror:  # the protected list can be long: a file, not the environment (128 KiB per variable)
        guard_path = workdir / "guard.json"
        guard_path.write_text(json.dumps(mirror.guard_config()))
        child_cfg["guard_path"] = str(guard_path)
    env = dict(os.environ)
    env[CONFIG_ENV] = json.dumps(child_cfg)
    env[MARKER_ENV] = run_id
    # inductor caches compiled kernels under the temp dir: keep the usual location, or every run
    # would compile from scratch once TMPDIR moves below
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_{_user()}"))
    if len(os.fsencode(workdir / "tmp")) <= _CHILD_TMPDIR_MAX:
        env["TMPDIR"] = str(workdir / "tmp")  # multiprocessing debris of killed runs lands here
    env["PWD"] = str(run_cwd)
    env.setdefault("PYTHONHASHSEED", str(config.seed))  # same set/dict orders for A and B
    env["PYTHONUNBUFFERED"] = "1"  # the stdout tail is complete even when the child is killed
    out_path, err_path = workdir / "stdout.txt", workdir / "stderr.txt"
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    killed = None
    leftovers: list[int] = []
    returncode = None
    handle = None
    try:
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            handle = (_Supervised if SUPERVISED else _Direct)(config, workdir, run_cwd, env, out, err)
        proc = handle.proc
        hard_deadline = started + config.timeout_s + config.hard_grace_s
        result_seen_at = None
        while proc.poll() is None:
            now = time.monotonic()
            if result_seen_at is None and result_path.exists():
                result_seen_at = now
            if result_seen_at is not None and now - result_seen_at > config.result_grace_s:
                killed = "after_result_grace"  # the script swallowed the stop or hangs in atexit
                break
            if now > hard_deadline:
                killed = "hard_timeout"
                break
            time.sleep(0.02)
    finally:
        if handle is not None:
            with shielded():
                returncode, leftovers = handle.stop(run_id)
    wall_s = time.monotonic() - started
    try:
        result = RunResult.from_json(json.loads(result_path.read_text()))
    except (OSError, ValueError):
        if killed == "hard_timeout":
            result = _failed("timeout", f"the child did not respond within {config.timeout_s:g} s "
                             "(+ grace) and was killed", spec)
        else:
            lost = handle is not None and handle.lost
            result = _failed("error", no_result_message(returncode, lost, read_notes(str(notes_path))), spec)
    unmirror = (lambda text: text.replace(str(mirror.root), "")) if mirror else (lambda text: text)
    # Load average (1 min) around the run: other work on the machine is the usual cause of noise.
    runner = RunnerInfo(returncode=returncode, wall_s=wall_s, killed=killed, loadavg=[load_before, os.getloadavg()[0]],
                        leftover_processes_at_exit=leftovers, run_id=run_id, supervised=SUPERVISED,
                        scratch_cwd=str(run_cwd) if mirror else None,
                        real_files_modified=mirror.modified() if mirror else [],
                        stdout_tail=unmirror(_tail(out_path)), stderr_tail=unmirror(_tail(err_path)))
    # script and cwd: the user's (the script saw copies of them in the scratch mirror unless real_cwd)
    return replace(result, script=str(script), args=list(spec.args), cwd=str(cwd), runner=runner)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def no_result_message(returncode: int | None, lost: bool, notes: list[dict]) -> str:
    """Why a child wrote no result, from what is known for sure: its (or its supervisor's) exit
    status and the notes the child wrote (signals the script sent to the benchmark's processes,
    ``os._exit`` calls of its forked workers)."""
    signals = [n for n in notes if n.get("kind") == "signal"]
    at_parent = [n for n in signals if n.get("target") == "parent"]
    at_child = [n for n in signals if n.get("target") == "child"]
    exits = [n for n in notes if n.get("kind") == "exit"]
    how = "killed" if returncode is not None and returncode < 0 else "ended"
    status = (f"by {_signal_name(-returncode)}" if returncode is not None and returncode < 0
              else f"with code {returncode}")
    if lost:
        if at_parent:
            return (f"the script killed its parent process, speedfix's supervisor ({at_parent[0].get('call')}), "
                    "before the child wrote a result")
        return (f"the benchmark supervisor was {how} {status} before the child wrote a result; the script sent it "
                "no signal: another process killed it (the out-of-memory killer, a user, a job scheduler, or a "
                "program the script started)")
    if at_child:
        return f"the script killed the benchmark child itself ({at_child[0].get('call')}) before it wrote a result"
    worker = ("; " + "; ".join(f"a forked worker process (pid {n.get('pid')}) called os._exit({n.get('code')}) at "
                               f"{n.get('where')}" for n in exits[:3])) if exits else ""
    if returncode is not None and returncode < 0:
        cause = {signal.SIGKILL: "not by a signal the script sent: the out-of-memory killer, a user or a job "
                                 "scheduler killed it",
                 signal.SIGSEGV: "a crash in native code", signal.SIGBUS: "a crash in native code",
                 signal.SIGABRT: "an abort in native code"}.get(-returncode, "not by a signal the script sent")
        return f"the child was killed by {_signal_name(-returncode)} without a result ({cause}){worker}"
    return (f"the child exited with code {returncode} without a result (its stop was bypassed: a native exit, "
            f"or an error while it ended){worker}")
