"""Spawn, watch, kill and collect one benchmark run (one fresh child process per measurement).

The child (``child.py``) leads its own session/process group, carries a unique marker in its
environment that every descendant inherits, and writes its result file before it stops the
script. Whatever happens, nothing with the marker outlives :func:`run_once` (P5, P6, P7, P13).
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

CHILD = Path(__file__).with_name("child.py")
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

    @property
    def name(self) -> str:
        return self.label or self.script.name


@dataclass
class RunConfig:
    """How long to warm up and measure. Steps and seconds are both minimums."""

    warmup_steps: int = 20
    warmup_s: float = 0.0
    steps: int = 50
    window_s: float = 0.0
    seed: int = 0
    seed_offset: int = 0
    record_all_steps: bool = False  # also every warm-up step's duration (calibration)
    timeout_s: float = 600.0
    result_grace_s: float = 5.0  # after the result appears: time for the script to unwind
    hard_grace_s: float = 20.0  # past timeout_s: for a child whose watchdog cannot run
    python: str = sys.executable


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
    for entry in os.listdir("/proc"):
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


def reap(run_id: str, pgid: int) -> list[int]:
    """Kill the run's process group, then every marked process that escaped it (``setsid``).

    Returns the escaped processes that were still alive once the group was dead.
    """
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


@contextmanager
def terminate_cleanly() -> Iterator[None]:
    """Turn SIGTERM into SystemExit while benchmarking, so that run_once's cleanup runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _failed(status: str, message: str, spec: RunSpec) -> dict:
    return {"schema": "speedfix.bench/0.1", "status": status, "message": message,
            "script": str(spec.script), "args": list(spec.args)}


def run_once(spec: RunSpec, config: RunConfig) -> dict:
    """Run the script once in a fresh child and return its result dict (schema speedfix.bench/0.1).

    Never raises for a failing script: the status says what happened (ok, incomplete, error,
    timeout, no_steps) and ``runner`` holds the return code and the stdout/stderr tails.
    """
    workdir = Path(tempfile.mkdtemp(prefix="speedfix-run-"))
    try:
        return _run_in(workdir, spec, config)
    finally:  # also when the benchmark itself is interrupted
        shutil.rmtree(workdir, ignore_errors=True)


def _run_in(workdir: Path, spec: RunSpec, config: RunConfig) -> dict:
    script = spec.script.resolve()
    cwd = (spec.cwd or Path.cwd()).resolve()
    run_id = uuid.uuid4().hex
    (workdir / "tmp").mkdir()
    result_path = workdir / "result.json"
    child_cfg = {"script": str(script), "args": list(spec.args), "seed": config.seed,
                 "seed_offset": config.seed_offset, "warmup_steps": config.warmup_steps,
                 "warmup_s": config.warmup_s, "steps": config.steps, "window_s": config.window_s,
                 "timeout_s": config.timeout_s, "record_all_steps": config.record_all_steps,
                 "result_path": str(result_path)}
    env = dict(os.environ)
    env[CONFIG_ENV] = json.dumps(child_cfg)
    env[MARKER_ENV] = run_id
    # inductor caches compiled kernels under the temp dir: keep the usual location, or every run
    # would compile from scratch once TMPDIR moves below
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_{_user()}"))
    env["TMPDIR"] = str(workdir / "tmp")  # multiprocessing debris of killed runs lands here (P13)
    env.setdefault("PYTHONHASHSEED", str(config.seed))  # same set/dict orders for A and B
    env["PYTHONUNBUFFERED"] = "1"  # the stdout tail is complete even when the child is killed
    out_path, err_path = workdir / "stdout.txt", workdir / "stderr.txt"
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    killed = None
    leftovers: list[int] = []
    proc = None
    try:
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen([config.python, str(CHILD)], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=err, start_new_session=True)
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
        if proc is not None:
            leftovers = reap(run_id, proc.pid)
            proc.wait()
    wall_s = time.monotonic() - started
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        if killed == "hard_timeout":
            result = _failed("timeout", f"the child did not respond within {config.timeout_s:g} s "
                             "(+ grace) and was killed", spec)
        else:
            result = _failed("error", f"the child exited with code {proc.returncode} without a result "
                             "(killed by a signal, out of memory, or a crash in native code)", spec)
    result["args"] = list(spec.args)
    # Load average (1 min) around the run: other work on the machine is the usual cause of noise.
    result["runner"] = {"returncode": proc.returncode if proc else None, "wall_s": wall_s, "killed": killed,
                        "loadavg": [load_before, os.getloadavg()[0]],
                        "leftover_processes_at_exit": leftovers, "run_id": run_id,
                        "stdout_tail": _tail(out_path), "stderr_tail": _tail(err_path)}
    return result
