"""The in-child benchmark harness: runs one unchanged training script and measures it.

Started by ``runner.py`` as ``python /abs/path/child.py`` with its configuration (JSON) in the
environment variable ``SPEEDFIX_BENCH_CONFIG``. It must stay importable without speedfix
installed: stdlib and torch only (never libcst, typer or rich), because it runs inside the
user's training environment.

What it adds to the script's process must not change what it measures (docs/benchmarks.md,
"Harness overhead"): nothing per module call, nothing Dynamo can see (no graph breaks, no
guards, no recompiles), no host synchronisation inside the timed window, no polling thread.

* runs the script with ``runpy.run_path(..., run_name="__main__")``; ``sys.argv`` and
  ``sys.path[0]`` are set the way ``python script.py`` sets them, the cwd is the parent's choice;
* the clock: the first ``torch.optim`` optimizer that steps (global step post-hook); a script
  that never builds an optimizer (hand-written SGD) is clocked by its ``backward()`` calls.
  After the warm-up - which also waits until ``torch.compile`` has stopped compiling - it opens
  a window, closes it after N steps (device synchronize only at the two edges), writes the
  result file atomically and only then raises ``HarnessStop`` (a ``BaseException`` of its own).
  A compilation inside the window throws the window away and the warm-up goes on (at most
  ``_MAX_WINDOW_RESTARTS`` times; then the run is "unsettled", never "ok");
* times training only: the time between epochs - from the training DataLoader iterator's end
  to the next epoch's start (evaluation, checkpoints, the recompiles they cause) - is left out
  of the clock and reported on its own (``epochs``);
* records the loss of every ``backward()`` as a detached view (a clone only under CUDA graphs,
  which reuse their outputs; unscaled under GradScaler) and reads the values once, at the end;
* wraps the DataLoader iterator for batch size, samples/s and data-wait time; without a
  DataLoader, one forward pre-hook reads the batch size from the first model call and removes
  itself at once (and before any compilation starts, so Dynamo never traces it);
* guards every side effect to the main pid: forked DataLoader workers inherit every patch;
* installs the audit hook of ``guard.py`` before the script runs: no change to the user's real
  folders when the script runs from a scratch mirror of them, and a note of any signal the script
  sends to the benchmark's processes (the runner then knows who killed a run);
* a watchdog timer writes a ``timeout``/``no_steps`` result and hard-exits; the kernel ends the
  child with its parent (``PR_SET_PDEATHSIG``), so no thread polls for that;
* ends the process once the script has ended (``exit_without_finalizing``): its threads, exit
  handlers and open files as a normal exit ends them, without tearing down torch's modules.
"""

from __future__ import annotations

import functools
import gc
import json
import math
import os
import random
import resource
import signal
import sys
import threading
import time
import traceback
import warnings
import weakref
from collections import deque

CONFIG_ENV = "SPEEDFIX_BENCH_CONFIG"
SCHEMA = "speedfix.bench/0.1"
_T0 = time.perf_counter()
MAIN_PID = os.getpid()
PARENT_PID = os.getppid()
_REAL_EXIT = os._exit
_torch = None  # set by Harness.install: the per-batch hook must not run an import statement
_MAX_LOSSES = 200_000  # bound memory if a script runs far past the window (timeouts)
# Compile-aware warm-up: the window opens once no compilation has run for this many steps and
# those steps took similar times; it opens anyway after this many extra steps (never settles).
_SETTLE_STEPS = 5
_STABLE_RATIO = 3.0
_MAX_EXTRA_WARMUP = 200
# A compilation inside the window restarts it (the warm-up goes on) at most this many times;
# a window that still compiles after that is "unsettled", never "ok".
_MAX_WINDOW_RESTARTS = 3


# where multiprocessing ends every forked process (os._exit with the process's exit code)
_MP_ENDS = (os.sep + os.path.join("multiprocessing", "popen_fork.py"),)


def _load_sibling(name: str):
    """A standard-library-only module next to this file (child.py runs as a file, outside speedfix)."""
    key = f"_speedfix_bench_{name}"
    module = sys.modules.get(key)
    if module is None:
        import importlib.util

        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return module


def _write_note(path: str, note: dict) -> None:
    _load_sibling("guard").write_note(path, note)


def _read_notes(path: str) -> list:
    return _load_sibling("guard").read_notes(path)


class HarnessStop(BaseException):
    """Ends the script once the window is measured.

    Not an Exception (``except Exception`` is common in training loops), not KeyboardInterrupt
    (Lightning turns that into a graceful shutdown and ``sys.exit(1)``), not SystemExit.
    """


def _exit_with_parent() -> None:
    """Fallback where the kernel cannot do it: a killed parent must not leave this run behind."""
    while True:
        time.sleep(0.5)
        if os.getppid() != PARENT_PID:
            try:
                os.killpg(os.getpgrp(), signal.SIGKILL)
            finally:
                _REAL_EXIT(125)


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies; else poll from a thread.

    The kernel does it for free: a polling thread wakes up and takes the GIL twice a second,
    which a measured script would pay for.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0:  # 1 = PR_SET_PDEATHSIG
            if os.getppid() != PARENT_PID:  # the parent died before the request
                _REAL_EXIT(125)
            return
    except (OSError, AttributeError):
        pass
    threading.Thread(target=_exit_with_parent, daemon=True).start()


def _batch_size(obj: object, depth: int = 0) -> int | None:
    """First dimension of the first tensor found in a (nested) batch."""
    torch = _torch
    if isinstance(obj, torch.Tensor):
        return int(obj.shape[0]) if obj.dim() >= 1 else None
    if depth > 4:
        return None
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        items = list(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        items = list(vars(obj).values())
    else:
        return None
    for item in items:
        size = _batch_size(item, depth + 1)
        if size is not None:
            return size
    return None


def _first_param(optimizer):
    try:
        return optimizer.param_groups[0]["params"][0]
    except (IndexError, KeyError, AttributeError, TypeError):
        return None


def _describe_tensors(obj: object, out: list, depth: int = 0) -> None:
    torch = _torch
    if len(out) >= 4 or depth > 4:
        return
    if isinstance(obj, torch.Tensor):
        out.append({"shape": list(obj.shape), "dtype": str(obj.dtype).replace("torch.", ""),
                    # only pinned if CUDA is up; asking otherwise can create a CUDA context
                    "device": str(obj.device), "pinned": bool(obj.device.type == "cpu" and torch.cuda.is_initialized()
                                                              and obj.is_pinned())})
    elif isinstance(obj, dict):
        for value in obj.values():
            _describe_tensors(value, out, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            _describe_tensors(value, out, depth + 1)


def _proc_status_kb(pid: str, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _children_rss_kb() -> tuple[int, int]:
    """RSS of this process's direct children (DataLoader workers), summed."""
    total = count = 0
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return 0, 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == MAIN_PID:
            total += _proc_status_kb(pid, "VmRSS")
            count += 1
    return total, count


def _driver_version() -> str | None:
    """The NVIDIA driver's version, from the kernel module (Linux) or NVML where it is installed."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            for word in f.readline().split():
                if word[:1].isdigit() and "." in word:
                    return word
    except OSError:
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # not installed, no driver, or an NVML error: unknown
        return None


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _step_stats(per_step: list[float]) -> dict:
    ordered = sorted(per_step)
    if not ordered:
        return {}
    return {"mean": sum(ordered) / len(ordered), "median": _quantile(ordered, 0.5),
            "p10": _quantile(ordered, 0.1), "p90": _quantile(ordered, 0.9),
            "min": ordered[0], "max": ordered[-1]}


def _trimmed_traceback(exc: BaseException) -> str:
    """The traceback without the harness's own frames (child.py, runpy) on top."""
    tb = exc.__traceback__
    harness_files = (os.path.abspath(__file__), "runpy.py")
    while tb is not None and tb.tb_frame.f_code.co_filename.endswith(harness_files):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


class CompileWatch:
    """torch.compile's work, seen through Dynamo's compile start/end callbacks.

    Attached when the script calls ``torch.compile`` (which imports Dynamo anyway) or when
    Dynamo is found loaded at a step; the harness never imports Dynamo itself, because that
    alone costs an eager script a second and a half of start-up.
    """

    def __init__(self, harness: "Harness") -> None:
        self.harness = harness
        self.attached = False
        self.active_since: float | None = None
        self.events = 0
        self.seconds = 0.0
        self.last_end_step: int | None = None
        self.in_window = 0  # compilations inside the (final) window's training time
        self.ended: list[tuple[float, float]] = []  # (start, end) of compilations since the last step

    def attach(self, *, load: bool = True) -> bool:
        if self.attached:
            return True
        if not load and "torch._dynamo" not in sys.modules:
            return False
        try:
            from torch._dynamo.callback import callback_handler
        except ImportError:  # torch < 2.4: no callbacks; nothing is watched
            return False
        callback_handler.register_start_callback(self._start)
        callback_handler.register_end_callback(self._end)
        if self.harness.guard is not None:
            self.harness.guard.hide_from_dynamo()
        self.attached = True
        return True

    def _start(self, *args) -> None:
        self.harness._remove_forward_hook()  # before Dynamo reads the global hooks
        self.active_since = time.perf_counter()

    def _end(self, *args) -> None:
        end = time.perf_counter()
        start = end if self.active_since is None else self.active_since
        self.seconds += end - start
        self.active_since = None
        self.events += 1
        self.last_end_step = self.harness.steps
        self.ended.append((start, end))  # inside the window or between epochs: decided at the next step

    def compiled(self) -> bool:
        """Anything compiled or compiling so far (attaches first if the script loaded Dynamo)."""
        self.attach(load=False)
        return bool(self.events) or self.active_since is not None

    def quiet_for(self, steps: int) -> bool:
        """No compilation now and none in the last ``_SETTLE_STEPS`` steps."""
        return self.active_since is None and steps - (self.last_end_step or 0) >= _SETTLE_STEPS

    def take(self, pause: tuple[float, float] | None) -> tuple[int, int]:
        """The compilations since the last step: (between epochs, in training time). A compilation
        inside ``pause`` (the time between two epochs) is not the training loop's."""
        spans, self.ended = self.ended, []
        between = sum(1 for start, end in spans if pause is not None and pause[0] <= start and end <= pause[1])
        return between, len(spans) - between

    def report(self) -> dict:
        return {"watched": self.attached, "compilations": self.events, "seconds": self.seconds,
                "in_window": self.in_window}


class Harness:
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.script: str = cfg["script"]
        self.warmup_steps = max(1, int(cfg.get("warmup_steps") or 1))
        self.warmup_s = float(cfg.get("warmup_s") or 0.0)
        self.window_steps = max(1, int(cfg.get("steps") or 1))
        self.window_s = float(cfg.get("window_s") or 0.0)
        self.timeout_s = float(cfg.get("timeout_s") or 600.0)
        self.result_path: str = cfg["result_path"]
        self.notes_path: str | None = cfg.get("notes_path")
        self.mirror_root: str | None = cfg.get("mirror_root")  # the script runs from a copy under it
        self.guard = None  # guard.Guard once installed
        self.record_all = bool(cfg.get("record_all_steps"))  # calibration: find slow warm-up steps
        self.all_times: list[float] = []
        self.lock = threading.Lock()
        self.written = False
        # step clock
        self.phase = "startup"  # startup -> warmup -> window -> done
        self.steps = 0
        self.per_opt: dict[int, int] = {}
        self.self_s = 0.0  # time spent in the harness's own hooks inside the window
        self.clock: str | None = None  # "optimizer.step" or "backward"
        self.optimizers_built = 0
        self.recent_steps: deque[float] = deque(maxlen=_SETTLE_STEPS + 1)
        self.warmup_settled: bool | None = None
        self.settle_from = self.warmup_steps  # the warm-up may go on this many steps past it (then forced)
        self.window_restarts: list[dict] = []  # compilation inside the window: measured again
        self.compile_watch = CompileWatch(self)
        self.backward_at_window: list[int] = []
        self.primary_ref = None  # weakref: the clock passes on once its optimizer is freed
        self.t_first_step: float | None = None
        self.t_window_start: float | None = None  # on the clock (time between epochs left out)
        self.t_window_start_raw: float | None = None  # on perf_counter
        self.t_window_end: float | None = None
        self.cpu_window: list[float] = []  # process CPU time at the window's edges
        self.window_start_step = 0
        self.step_times: list[float] = []
        self.device = {"type": None, "param_dtype": None, "name": None, "driver_version": None,
                       "cuda_version": None}
        self.synchronized = False
        # loss
        self.losses: list = []
        self.loss_steps: list[int] = []
        self.backward_calls = 0
        self.nonscalar_backward = 0
        self.loss_source = "autograd.backward"
        self.clone_losses = False
        self.scaler_seen = False
        self.scaler_step_calls = 0
        self.scaler_skipped = 0
        # data
        self.batch_size: int | None = None
        self.batch_size_source: str | None = None
        self.first_batch: list = []
        self.batches_total = 0
        self.batches_no_grad = 0
        self.batches_in_window = 0
        self.samples_in_window = 0
        self.data_wait_window = 0.0
        self.fwd_batch: int | None = None
        self.fwd_handles: list = []
        # epochs: the time from the training iterator's end to the next epoch's start is not training
        self.last_iter = None  # weakref: the iterator of the latest batch fetched with grad enabled
        self.train_iter = None  # weakref: the iterator whose batches the latest step trained on
        self.pause_from: float | None = None  # when the training iterator ran out (an epoch ended)
        self.pause_to: float | None = None  # when the training loop started its next epoch
        self.paused_s = 0.0  # time between epochs so far: the clock's times leave it out
        self.epochs_ended = 0
        self.between_epochs: list[dict] = []
        # memory
        self.memory: dict = {}
        self.torch = None
        self.facts = None  # facts.Recorder: what the script configured (read at one-time hooks)

    # ------------------------------------------------------------------ setup
    def install(self) -> None:
        import torch

        global _torch
        self.torch = _torch = torch
        self.facts = _load_sibling("facts").Recorder(self._unmirror)
        self._seed(torch)
        self._patch_optimizer(torch)
        self._patch_backward(torch)
        self._patch_scaler(torch)
        self._patch_dataloader(torch)
        self._patch_forward(torch)
        # A compiled module warns once about global hooks; the forward hook is gone before it matters.
        warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
        self._patch_compile(torch)
        self._patch_save(torch)
        os._exit = self._os_exit  # type: ignore[assignment]
        watchdog = threading.Timer(self.timeout_s, self._on_timeout)
        watchdog.daemon = True
        watchdog.start()
        _die_with_parent()

    def _seed(self, torch) -> None:
        """Same seeds for A and B; ``seed_offset`` shifts the script's own seeds too (seed band)."""
        seed = int(self.cfg.get("seed", 0))
        offset = int(self.cfg.get("seed_offset", 0))
        random.seed(seed + offset)
        torch.manual_seed(seed + offset)
        try:
            import numpy
        except ImportError:
            numpy = None
        if numpy is not None:
            numpy.random.seed((seed + offset) % 2**32)
        if not offset:
            return
        # A script that seeds itself would give every "other seed" run the same trajectory;
        # shifting its seed calls measures a real seed-to-seed spread.
        def shift(value, modulo):
            if isinstance(value, int) and not isinstance(value, bool):
                return value + offset if modulo is None else (value + offset) % modulo
            return value

        def shifted(fn, keyword: str, modulo=None):
            # the seed comes positionally or by its keyword (`default_rng(seed=0)`, `random.seed(a=1)`)
            def wrapper(*args, **kwargs):
                if args:
                    args = (shift(args[0], modulo), *args[1:])
                elif keyword in kwargs:
                    kwargs[keyword] = shift(kwargs[keyword], modulo)
                return fn(*args, **kwargs)
            return wrapper

        random.seed = shifted(random.seed, "a")
        torch.manual_seed = torch.random.manual_seed = shifted(torch.manual_seed, "seed")
        torch.cuda.manual_seed = shifted(torch.cuda.manual_seed, "seed")
        torch.cuda.manual_seed_all = shifted(torch.cuda.manual_seed_all, "seed")
        if numpy is not None:
            numpy.random.seed = shifted(numpy.random.seed, "seed", 2**32)
            numpy.random.default_rng = shifted(numpy.random.default_rng, "seed")

    def _patch_optimizer(self, torch) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(self._on_step)
        # Count constructions: a script that never builds an optimizer is clocked by backward().
        original_init = torch.optim.Optimizer.__init__
        harness = self

        def __init__(self_, *args, **kwargs):
            if os.getpid() == MAIN_PID:
                harness.optimizers_built += 1
                if harness.clock == "backward" and harness.phase != "done":
                    harness._restart_clock()  # backward() ran before the optimizer existed (a sanity check)
            out = original_init(self_, *args, **kwargs)
            if os.getpid() == MAIN_PID:
                harness.facts.on_optimizer(self_)
            return out

        torch.optim.Optimizer.__init__ = __init__

    def _patch_backward(self, torch) -> None:
        # Tensor.backward calls torch.autograd.backward through the module attribute, so one
        # wrapper sees both spellings.
        original = torch.autograd.backward
        harness = self
        # -1 outside a backward pass: a call from inside one (reentrant torch.utils.checkpoint
        # runs a backward per checkpointed segment) is part of the outer step, not a step.
        graph_task = getattr(torch._C, "_current_graph_task_id", lambda: -1)

        def backward(tensors, *args, **kwargs):
            if os.getpid() == MAIN_PID and graph_task() == -1:
                t0 = time.perf_counter()
                try:
                    harness._record_loss(tensors)
                    harness._on_backward(tensors)
                finally:
                    harness._charge(t0)
            elif os.getpid() == MAIN_PID:
                harness.facts.reentrant_checkpoint = True  # a backward inside a backward: reentrant checkpointing
            return original(tensors, *args, **kwargs)

        torch.autograd.backward = backward

    def _patch_scaler(self, torch) -> None:
        scaler_classes = [torch.amp.GradScaler]
        legacy = getattr(getattr(torch.cuda, "amp", None), "GradScaler", None)
        if legacy is not None and not issubclass(legacy, torch.amp.GradScaler):
            scaler_classes.append(legacy)  # torch < 2.3
        harness = self
        for cls in scaler_classes:
            orig_scale, orig_step = cls.scale, cls.step

            def scale(self_, outputs, _orig=orig_scale):
                out = _orig(self_, outputs)
                if os.getpid() == MAIN_PID:
                    harness.scaler_seen = True
                    if (isinstance(outputs, torch.Tensor) and isinstance(out, torch.Tensor)
                            and out is not outputs and outputs.numel() == 1):
                        try:  # the backward wrapper records this instead of the scaled loss
                            out._speedfix_unscaled = outputs.detach()
                        except (AttributeError, RuntimeError):
                            pass
                return out

            def step(self_, optimizer, *args, _orig=orig_step, **kwargs):
                before = harness.per_opt.get(id(optimizer), 0)
                try:
                    return _orig(self_, optimizer, *args, **kwargs)
                finally:
                    if os.getpid() == MAIN_PID:
                        harness.scaler_step_calls += 1
                        if harness.per_opt.get(id(optimizer), 0) == before:
                            harness.scaler_skipped += 1  # inf/nan grads: optimizer.step was skipped

            cls.scale, cls.step = scale, step

    def _patch_dataloader(self, torch) -> None:
        """Batch size, samples/s and data wait from the iterator; where epochs end and start again.

        An epoch ends when the iterator the steps trained on runs out (StopIteration); the next one
        starts when a DataLoader is iterated again with grad enabled (``DataLoader.__iter__``: the
        workers a non-persistent loader starts again are the training loop's cost), or at the first
        batch fetched with grad enabled. The time between is not training (``_end_pause``).
        """
        from torch.utils.data import dataloader

        original = dataloader._BaseDataLoaderIter.__next__
        original_iter = dataloader.DataLoader.__iter__
        original_init = dataloader.DataLoader.__init__
        harness = self
        grad_enabled = torch.is_grad_enabled

        def __next__(it):
            if os.getpid() != MAIN_PID:
                return original(it)
            t0 = time.perf_counter()
            if harness.pause_from is not None and harness.pause_to is None and grad_enabled():
                harness.pause_to = t0
            batch = None
            ok = exhausted = False
            try:
                batch = original(it)
                ok = True
                return batch
            except StopIteration:
                exhausted = True
                raise
            finally:
                t1 = time.perf_counter()
                harness._on_batch(it, batch, ok, t1 - t0)
                if exhausted:
                    harness._on_exhausted(it, t1)
                harness._charge(t1)

        def __iter__(loader):
            if harness.pause_from is not None and os.getpid() == MAIN_PID and grad_enabled():
                harness.pause_to = time.perf_counter()  # the latest wins: an evaluation with grad on came first
            iterator = original_iter(loader)
            if os.getpid() == MAIN_PID:
                harness.facts.on_loader_iter(loader, iterator)  # once per epoch
            return iterator

        @functools.wraps(original_init)
        def __init__(loader, *args, **kwargs):
            original_init(loader, *args, **kwargs)
            if os.getpid() == MAIN_PID:
                harness.facts.on_loader(loader)  # its settings and the user's line that made it

        dataloader._BaseDataLoaderIter.__next__ = __next__
        dataloader.DataLoader.__iter__ = __iter__
        dataloader.DataLoader.__init__ = __init__

    def _patch_forward(self, torch) -> None:
        """Batch size for scripts without a DataLoader: the first grad-enabled model call.

        One global pre-hook that removes itself on that call, so later module calls pay
        nothing. It must never be there while Dynamo traces: Dynamo inlines global hooks and
        guards on their count (a graph break at every module, then a recompile when the hook
        goes). Dynamo's compile-start callback removes it first (``CompileWatch``); where torch
        has no such callback, the ``torch.compile`` call does (``_patch_compile``).
        """
        from torch.nn.modules import module

        harness = self

        def pre(mod, args):
            if torch.compiler.is_compiling() or os.getpid() != MAIN_PID:
                return
            if not torch.is_grad_enabled():
                # an evaluation before training: its batch is the fallback, but wait for a
                # training call while nothing compiles
                if harness.fwd_batch is None:
                    harness.fwd_batch = _batch_size(args)
                    harness.facts.on_first_forward(torch, mod, False)  # the model, if no training call is seen
                return
            harness.fwd_batch = _batch_size(args) or harness.fwd_batch
            harness._remove_forward_hook()
            harness.facts.on_first_forward(torch, mod, True)  # the model the step trains, the autocast around it

        self.fwd_handles = [module.register_module_forward_pre_hook(pre)]

    def _remove_forward_hook(self) -> None:
        for handle in self.fwd_handles:
            handle.remove()
        self.fwd_handles = []

    def _patch_compile(self, torch) -> None:
        """Watch compilation: the window opens once it has settled; its time is reported."""
        original = torch.compile
        harness = self

        @functools.wraps(original)
        def compile(*args, **kwargs):
            if not harness.compile_watch.attach():  # torch.compile imports Dynamo in any case
                harness._remove_forward_hook()  # no compile-start callback (torch < 2.4): go now
            options = kwargs.get("options") or {}
            if kwargs.get("mode") in ("reduce-overhead", "max-autotune") or options.get("triton.cudagraphs"):
                harness.clone_losses = True  # CUDA graphs overwrite their outputs at every replay
            if os.getpid() == MAIN_PID:
                harness.facts.on_compile(args[0] if args else kwargs.get("model"), kwargs)
            return original(*args, **kwargs)

        torch.compile = compile

    def _patch_save(self, torch) -> None:
        """``torch.save`` to a path writes from C++ (no audit event): raise the ``open`` event the
        write guard checks, as Python's own ``open`` would."""
        writer = getattr(torch.serialization, "_open_zipfile_writer_file", None)
        if writer is None:
            return
        original = writer.__init__

        @functools.wraps(original)
        def __init__(self_, name, *args, **kwargs):
            sys.audit("open", name, "wb", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            return original(self_, name, *args, **kwargs)

        writer.__init__ = __init__

    # ------------------------------------------------------------------ hooks
    def _record_loss(self, tensors) -> None:
        torch = self.torch
        self.backward_calls += 1
        t = tensors
        if isinstance(t, (list, tuple)) and len(t) == 1:
            t = t[0]
        if not isinstance(t, torch.Tensor) or t.numel() != 1:
            self.nonscalar_backward += 1
            return
        unscaled = getattr(t, "_speedfix_unscaled", None)
        if unscaled is not None:
            t = unscaled
            self.loss_source = "GradScaler.scale(input)"
        if len(self.losses) < _MAX_LOSSES:
            # A detached view costs no kernel launch (a clone would: on a GPU with a full launch
            # queue it waits, inside the step). Only CUDA graphs reuse output buffers: clone there.
            self.losses.append(t.detach().clone() if self.clone_losses else t.detach())
            self.loss_steps.append(self.steps)

    def _on_batch(self, it, batch, ok: bool, dt: float) -> None:
        if not self.torch.is_grad_enabled():
            self.batches_no_grad += 1  # evaluation loop
            return
        last = self.last_iter
        if last is None or last() is not it:
            self.last_iter = weakref.ref(it)
        if self.phase == "window":
            self.data_wait_window += dt
        if not ok:
            return
        self.batches_total += 1
        size = _batch_size(batch)
        if self.batch_size is None and size is not None:
            self.batch_size = size
            self.batch_size_source = "dataloader"
            _describe_tensors(batch, self.first_batch)
        if self.phase == "window":
            self.batches_in_window += 1
            self.samples_in_window += size or 0

    def _on_exhausted(self, it, now: float) -> None:
        """An iterator ran out: if the steps trained on it, an epoch ended (time stops counting)."""
        train = self.train_iter
        if self.pause_from is None and train is not None and train() is it:
            self.pause_from, self.pause_to = now, None
            self.epochs_ended += 1
            self.train_iter = None

    def _end_pause(self) -> tuple[float, float] | None:
        """At the first step after an epoch ended: the time between the epochs, taken off the clock.

        Without a sign of where the next epoch started (no DataLoader iterated with grad enabled)
        nothing is taken off: the step carries it, as without epochs."""
        start, end = self.pause_from, self.pause_to
        self.pause_from = self.pause_to = None
        if end is None or end < start:
            return None
        self.paused_s += end - start
        self.between_epochs.append({"after_epoch": self.epochs_ended, "seconds": end - start,
                                    "phase": self.phase, "at_step": self.steps, "compilations": 0})
        return start, end

    def _charge(self, t0: float) -> None:
        """Add the harness's own time since ``t0`` to its bill, for the part inside the window."""
        if self.phase == "window" and self.pause_from is None:
            self.self_s += time.perf_counter() - max(t0, self.t_window_start_raw)

    def _on_step(self, optimizer, args, kwargs) -> None:
        if os.getpid() != MAIN_PID:
            return
        if self.clock == "backward":
            return
        t0 = time.perf_counter()
        try:
            self._step_clock(optimizer)
        finally:
            self._charge(t0)

    def _step_clock(self, optimizer) -> None:
        if self.phase == "done":
            raise HarnessStop()
        now = time.perf_counter()
        key = id(optimizer)
        self.per_opt[key] = self.per_opt.get(key, 0) + 1
        if self.primary_ref is None:
            self.primary_ref = weakref.ref(optimizer)
            self._start_clock("optimizer.step", now, _first_param(optimizer))
            self.facts.on_first_step(sys._getframe(1))  # the frameworks that run the step
        clock = self.primary_ref()
        if clock is not optimizer:  # by identity: a new optimizer can reuse a freed one's id()
            if clock is not None:
                return  # a second optimizer (GAN): the first one is the clock
            # the clock's optimizer is gone (a grid search trains one model after another)
            self.primary_ref = weakref.ref(optimizer)
        self._tick(now)

    def _restart_clock(self) -> None:
        """Forget the backward() clock: the optimizer being built is the clock."""
        self.clock, self.phase, self.steps = None, "startup", 0
        self.t_window_start = self.t_first_step = None
        self.window_start_step, self.self_s = 0, 0.0
        self.samples_in_window = self.batches_in_window = 0
        self.data_wait_window = self.paused_s = 0.0
        self.pause_from = self.pause_to = self.train_iter = None
        self.epochs_ended = 0
        self.between_epochs.clear()
        for series in (self.recent_steps, self.all_times, self.step_times, self.cpu_window, self.backward_at_window):
            series.clear()
        if not self.fwd_handles and not self.compile_watch.compiled():
            self.fwd_batch = None  # that model call was the sanity check's: read the training batch
            self._patch_forward(self.torch)

    def _on_backward(self, tensors) -> None:
        """The clock of scripts that update parameters by hand: one step per backward()."""
        if self.clock == "optimizer.step":
            return
        if self.clock is None:
            if self.optimizers_built:
                return  # an optimizer exists: its first step starts the clock
            t = tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors
            self._start_clock("backward", time.perf_counter(), t if isinstance(t, self.torch.Tensor) else None)
        elif self.phase == "done":
            raise HarnessStop()
        self._tick(time.perf_counter())

    def _tick(self, raw: float) -> None:
        """One step of the clock: warm-up, then the timed window.

        The clock's times leave out the time between epochs (``paused_s``), so every duration,
        the window and the warm-up count training time only."""
        pause = self._end_pause() if self.pause_from is not None else None
        self.train_iter = self.last_iter
        in_training = 0
        if self.compile_watch.ended:
            between, in_training = self.compile_watch.take(pause)
            if between and pause is not None:
                self.between_epochs[-1]["compilations"] = between
        now = raw - self.paused_s
        self.steps += 1
        if self.record_all:
            self.all_times.append(now)
        if self.phase == "window" and in_training:
            if len(self.window_restarts) < _MAX_WINDOW_RESTARTS:
                self._restart_window(in_training)
            else:
                self.compile_watch.in_window += in_training
        if self.phase == "warmup":
            self.recent_steps.append(now)
            if self.steps >= self.warmup_steps and now - self.t_first_step >= self.warmup_s and self._settled():
                self._open_window()
        elif self.phase == "window":
            self.step_times.append(now)
            timed = self.steps - self.window_start_step
            if timed >= self.window_steps and now - self.t_window_start >= self.window_s:
                self._close_window()
                if self.compile_watch.in_window:
                    self._finish("unsettled", f"torch.compile compiled {self.compile_watch.in_window} time(s) "
                                 f"inside the window after the window was restarted {len(self.window_restarts)} "
                                 "times for compiling: no figure without compilation")
                else:
                    self._finish("ok", f"measured {timed} steps after {self.window_start_step} warm-up steps"
                                 + self._restarts_note())
                raise HarnessStop()

    def _restart_window(self, compilations: int) -> None:
        """Compilation inside the window: throw the window away and go on warming up."""
        self.window_restarts.append({"at_step": self.steps, "compilations": compilations,
                                     "window_steps_dropped": self.steps - 1 - self.window_start_step})
        self.phase = "warmup"
        self.settle_from = self.steps
        self.recent_steps.clear()
        self.step_times.clear()
        self.cpu_window.clear()
        self.backward_at_window.clear()
        self.t_window_start = self.t_window_start_raw = None
        self.self_s = self.data_wait_window = 0.0
        self.samples_in_window = self.batches_in_window = 0

    def _restarts_note(self) -> str:
        if not self.window_restarts:
            return ""
        steps = ", ".join(str(r["at_step"]) for r in self.window_restarts)
        return (f" (torch.compile compiled inside the window at step {steps}: the warm-up was extended and the "
                "window measured again)")

    def _settled(self) -> bool:
        """Compilation has stopped and the last steps took similar times (compile-aware warm-up).

        An eager script settles at once: nothing here changes its requested warm-up.
        """
        if not self.compile_watch.compiled():
            return True
        if self.steps - self.settle_from >= _MAX_EXTRA_WARMUP:
            self.warmup_settled = False  # still compiling: measure anyway, and say so
            return True
        if not self.compile_watch.quiet_for(self.steps) or len(self.recent_steps) <= _SETTLE_STEPS:
            return False
        times = list(self.recent_steps)
        durations = sorted(b - a for a, b in zip(times, times[1:]))
        if durations[-1] > _STABLE_RATIO * durations[len(durations) // 2]:
            return False
        self.warmup_settled = True
        return True

    def _start_clock(self, clock: str, now: float, tensor) -> None:
        self.clock = clock
        self.phase = "warmup"
        self.t_first_step = now
        self._remove_forward_hook()  # no model call came before the first step with grad on
        if tensor is not None:
            try:
                self.device = {"type": tensor.device.type, "param_dtype": str(tensor.dtype).replace("torch.", ""),
                               "index": tensor.device.index, **self._gpu_info(tensor.device)}
            except AttributeError:
                pass

    def _gpu_info(self, device) -> dict:
        """The GPU's name, the driver's and CUDA's versions (None off CUDA); read once, before the window."""
        info = {"name": None, "driver_version": None, "cuda_version": None}
        if device.type != "cuda":
            return info
        torch = self.torch
        try:
            info["name"] = torch.cuda.get_device_name(device)
        except (RuntimeError, AssertionError, AttributeError):
            pass
        info["cuda_version"] = getattr(torch.version, "cuda", None) or getattr(torch.version, "hip", None)
        info["driver_version"] = _driver_version()
        return info

    def _sync(self) -> None:
        torch, kind = self.torch, self.device.get("type")
        if kind == "cuda":
            torch.cuda.synchronize()
            self.synchronized = True
        elif kind not in (None, "cpu") and hasattr(torch, "accelerator"):
            torch.accelerator.synchronize()
            self.synchronized = True

    def _read_facts(self) -> None:
        """The loader the steps train on and the flags the window runs with: read once."""
        if self.facts.flags is None:
            self.facts.on_training_iterator(self.last_iter() if self.last_iter is not None else None)
            self.facts.read_flags(self.torch, self.device)

    def _open_window(self) -> None:
        self._read_facts()
        self._sync()
        if self.device.get("type") == "cuda":
            self.torch.cuda.reset_peak_memory_stats()
        try:  # reset VmHWM so the peak covers the window only (Linux >= 4.0)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        self.t_window_start_raw = time.perf_counter()
        self.t_window_start = self.t_window_start_raw - self.paused_s
        self.cpu_window = [time.process_time()]
        self.backward_at_window = [self.backward_calls]
        self.window_start_step = self.steps
        self.phase = "window"

    def _close_window(self) -> None:
        self._sync()
        self.t_window_end = time.perf_counter() - self.paused_s
        self.cpu_window.append(time.process_time())
        self.backward_at_window.append(self.backward_calls)
        self.phase = "done"
        self._read_memory(window=True)

    def _read_memory(self, window: bool) -> None:
        children_kb, children = _children_rss_kb()
        self.memory = {"vmhwm_window_kb": _proc_status_kb("self", "VmHWM") if window else 0,
                       "ru_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                       "children_rss_kb": children_kb, "children": children,
                       "cuda_max_allocated_window": 0, "cuda_max_reserved_window": 0}
        if window and self.device.get("type") == "cuda":
            self.memory["cuda_max_allocated_window"] = int(self.torch.cuda.max_memory_allocated())
            self.memory["cuda_max_reserved_window"] = int(self.torch.cuda.max_memory_reserved())

    # ------------------------------------------------------------------ ending
    def _on_timeout(self) -> None:
        if self.steps == 0:
            self._finish("no_steps", f"no optimizer steps observed within {self.timeout_s:g} s{self._no_steps_why()}")
        else:
            self._finish("timeout", f"timed out after {self.timeout_s:g} s: {self.steps} optimizer steps "
                         f"done, {self.warmup_steps + self.window_steps} needed for the window")
        sys.stdout.flush()
        sys.stderr.flush()
        _REAL_EXIT(124)

    def _os_exit(self, code: int = 0) -> None:
        if os.getpid() == MAIN_PID:
            self.finish_after_script(exit_code=code, how="os._exit")
        else:  # a forked process (DataLoader worker): multiprocessing ends every one this way; note the others
            caller = sys._getframe(1).f_code.co_filename
            if not caller.endswith(_MP_ENDS) and self.notes_path:
                where = traceback.extract_stack(sys._getframe(1), limit=1)[-1]
                _write_note(self.notes_path, {"kind": "exit", "pid": os.getpid(), "code": code,
                                              "where": f"{self._unmirror(where.filename)}:{where.lineno}"})
        _REAL_EXIT(code)

    def _unmirror(self, text: str) -> str:
        """Paths as the user knows them: the script runs from a copy under the mirror root."""
        return text.replace(self.mirror_root, "") if self.mirror_root else text

    def _worker_exits(self) -> str:
        notes = [n for n in _read_notes(self.notes_path) if n.get("kind") == "exit"] if self.notes_path else []
        return "".join(f"; a forked worker process (pid {n.get('pid')}) called os._exit({n.get('code')}) at "
                       f"{n.get('where')}" for n in notes[:3])

    def finish_after_script(self, *, exit_code=None, how: str = "return", exc: BaseException | None = None) -> None:
        """Status for a script that ended without closing the window."""
        if self.written:
            return
        if exc is not None:
            message = self._unmirror(f"{type(exc).__name__}: {exc}")
            if self.steps:
                message += f" (after {self.steps} optimizer steps)"
            self._finish("error", message + self._worker_exits(), exc)
            return
        ended = {"return": "the script ended", "sys.exit": f"the script called sys.exit({exit_code!r})",
                 "os._exit": f"the script called os._exit({exit_code!r})"}[how]
        failed_exit = exit_code not in (None, 0)
        if self.steps == 0:
            if failed_exit:
                self._finish("error", f"{ended} before its first optimizer step")
            else:
                self._finish("no_steps", f"{ended} without stepping a torch.optim optimizer{self._no_steps_why()}")
            return
        needed = self.warmup_steps + self.window_steps
        self._finish("incomplete", f"{ended} after {self.steps} optimizer steps, before the window closed "
                     f"(at least {needed} needed); partial timing kept")

    def _no_steps_why(self) -> str:
        if self.optimizers_built and self.backward_calls:
            return (f" ({self.optimizers_built} optimizer(s) built and {self.backward_calls} backward() calls, "
                    "but no optimizer step)")
        return " and without calling backward()" if not self.backward_calls else ""

    def _finish(self, status: str, message: str, exc: BaseException | None = None) -> None:
        with self.lock:
            if self.written:
                return
            if self.phase == "window" and self.step_times:
                self.t_window_end = self.step_times[-1]
            if not self.memory:
                self._read_memory(window=self.phase in ("window", "done"))
            if self.facts is not None:
                self._read_facts()
            result = self._result(status, message, exc)
            tmp = f"{self.result_path}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump(result, f)
            os.replace(tmp, self.result_path)  # atomic: the parent never sees half a file
            self.written = True  # only now: an exception raised meanwhile (a signal handler) leaves it to a retry

    def _epochs_report(self) -> dict:
        """Where epochs ended, and the time between them that the clock left out."""
        in_window = [p for p in self.between_epochs if p["phase"] == "window" and p["at_step"] >= self.window_start_step]
        detected = "dataloader" if self.batches_total else None  # the training loop iterates a DataLoader
        return {"detected_by": detected, "ended": self.epochs_ended, "between": self.between_epochs[-50:],
                "between_in_window_s": sum(p["seconds"] for p in in_window) if in_window else 0.0}

    def _loss_values(self) -> list:
        torch = self.torch
        try:
            values = torch.stack([t.reshape(()).float() for t in self.losses]).cpu().tolist()
        except (RuntimeError, TypeError, ValueError):  # mixed devices, or an empty list
            values = []
            for t in self.losses:
                try:
                    values.append(float(t))
                except (RuntimeError, TypeError, ValueError):
                    values.append(float("nan"))
        return [v if math.isfinite(v) else None for v in values]  # JSON has no NaN

    def _result(self, status: str, message: str, exc: BaseException | None) -> dict:
        torch = self.torch
        window_s = None
        per_step: list[float] = []
        steps_timed = 0
        if self.t_window_start is not None and self.t_window_end is not None:
            window_s = self.t_window_end - self.t_window_start
            edges = [self.t_window_start, *self.step_times]
            per_step = [b - a for a, b in zip(edges, edges[1:])]
            steps_timed = len(self.step_times)
        steps_per_s = steps_timed / window_s if window_s else None
        samples_per_step = samples_per_s = data_wait_fraction = None
        if steps_timed and self.samples_in_window:
            samples_per_step = self.samples_in_window / steps_timed
        elif steps_timed and self.batch_size is None and self.fwd_batch:
            # no DataLoader: the first model call's batch, times the backward() calls per step
            # (gradient accumulation runs several micro-batches per optimizer step)
            backward = (self.backward_at_window[-1] - self.backward_at_window[0]
                        if len(self.backward_at_window) == 2 else 0)
            samples_per_step = self.fwd_batch * max(1.0, backward / steps_timed)
            self.batch_size, self.batch_size_source = self.fwd_batch, "forward_pre_hook"
        if samples_per_step and steps_per_s:
            samples_per_s = samples_per_step * steps_per_s
        if window_s and self.batches_in_window:
            data_wait_fraction = self.data_wait_window / window_s
        losses = self._loss_values()
        now = time.perf_counter()
        result = {
            "schema": SCHEMA, "status": status, "message": message,
            "script": self.script, "args": list(self.cfg.get("args", [])), "cwd": os.getcwd(),
            "seed": self.cfg.get("seed", 0), "seed_offset": self.cfg.get("seed_offset", 0),
            "env": {"python": sys.version.split()[0], "torch": torch.__version__,
                    "cuda_available": bool(torch.cuda.is_available()),
                    "torch_num_threads": torch.get_num_threads(), "cpu_count": os.cpu_count()},
            "device": dict(self.device),
            "clock": self.clock,
            "compile": {**self.compile_watch.report(), "settled": self.warmup_settled,
                        "window_restarts": self.window_restarts},
            "steps": {"warmup": self.window_start_step or None, "warmup_requested": self.warmup_steps,
                      "warmup_s_requested": self.warmup_s, "requested": self.window_steps,
                      "window_s_requested": self.window_s, "observed_primary": self.steps,
                      "optimizers": len(self.per_opt), "per_optimizer": list(self.per_opt.values())},
            "wall": {"startup_to_first_step_s": (self.t_first_step - _T0) if self.t_first_step else None,
                     "total_s": now - _T0},
            "timing": {"window_complete": status == "ok", "steps_timed": steps_timed, "window_s": window_s,
                       "steps_per_s": steps_per_s, "step_time_s": _step_stats(per_step),
                       "per_step_s": per_step,
                       "all_step_s": [b - a for a, b in zip(self.all_times, self.all_times[1:])] or None,
                       # CPU seconds this process (all its threads, not the workers) used in the
                       # window: far below window_s x threads means the CPUs were contended
                       "cpu_s": self.cpu_window[1] - self.cpu_window[0] if len(self.cpu_window) == 2 else None,
                       "warmup_s": (self.t_window_start - self.t_first_step) if self.t_window_start else None,
                       "synchronized": self.synchronized,
                       # the harness's own cost, measured: seconds in its hooks inside the window
                       "harness_self_s": self.self_s,
                       "harness_share": self.self_s / window_s if window_s else None},
            "data": {"batch_size": self.batch_size, "batch_size_source": self.batch_size_source,
                     "first_batch": self.first_batch, "batches_in_window": self.batches_in_window,
                     "samples_in_window": self.samples_in_window, "samples_per_s": samples_per_s,
                     "samples_per_step": samples_per_step, "data_wait_s": self.data_wait_window,
                     "data_wait_fraction": data_wait_fraction, "batches_fetched_total": self.batches_total,
                     "batches_fetched_no_grad": self.batches_no_grad},
            "memory": self.memory,
            "epochs": self._epochs_report(),
            "guard": self.guard.report() if self.guard is not None else None,
            "loss": {"source": self.loss_source, "values": losses, "step_index": self.loss_steps[:len(losses)],
                     "backward_calls": self.backward_calls, "nonscalar_backward_calls": self.nonscalar_backward,
                     "nonfinite": sum(v is None for v in losses), "grad_scaler_seen": self.scaler_seen,
                     "grad_scaler_step_calls": self.scaler_step_calls,
                     "grad_scaler_skipped_steps": self.scaler_skipped},
            "runtime": self.facts.report() if self.facts is not None else None,
        }
        if exc is not None:
            result["exception"] = {"type": type(exc).__name__, "message": self._unmirror(str(exc))[:2000],
                                   "traceback": self._unmirror(_trimmed_traceback(exc))[-8000:]}
        return result

    # ------------------------------------------------------------------ run
    def run(self) -> int:
        import runpy

        self._install_guard()
        ending: dict = {}
        try:
            runpy.run_path(self.script, run_name="__main__")
        except HarnessStop:
            pass
        except SystemExit as exc:
            ending = {"exit_code": exc.code, "how": "sys.exit"}
        except BaseException as exc:  # the script's own crash (KeyboardInterrupt included)
            ending = {"exc": exc}
        exit_code = self._end(ending)
        # Drop the last frames (they hold DataLoader iterators) so workers shut down cleanly.
        try:
            gc.collect()
        except BaseException:  # a late signal handler of the script (DataLoader's SIGCHLD)
            pass
        return exit_code

    def _end(self, ending: dict) -> int:
        """Write the result of a script that ended. The script's signal handlers can still raise
        here (DataLoader's SIGCHLD handler raises when a worker died): such an exception is the
        script's error if nothing was written yet, and the result is written all the same."""
        for _ in range(5):
            try:
                self.finish_after_script(**ending)
                break
            except BaseException as late:
                if "exc" not in ending:
                    ending = {"exc": late}
        exc = ending.get("exc")
        if exc is not None:
            try:
                sys.stderr.write(self._unmirror(_trimmed_traceback(exc)))
            except BaseException:
                pass
            return 1
        code = ending.get("exit_code")
        return code if isinstance(code, int) else (0 if code is None else 1)

    def _install_guard(self) -> None:
        """The audit hook: no change to the user's real folders (unless the runner runs the script
        in them), and a note of any signal the script sends to the benchmark's processes."""
        guard = _load_sibling("guard")
        config: dict = {}
        if self.cfg.get("guard_path"):
            with open(self.cfg["guard_path"]) as f:
                config = json.load(f)
            sys.dont_write_bytecode = True  # no .pyc written through a link into the user's folder
        self.guard = guard.Guard(protected=config.get("protected", ()), linked=config.get("linked", ()),
                                 mirror_root=config.get("mirror_root"),
                                 allowed=guard.default_allowed(self.cfg.get("workdir")),
                                 notes_path=self.notes_path, main_pid=MAIN_PID, parent_pid=PARENT_PID)
        self.guard.install()


def main() -> int:
    cfg = json.loads(os.environ.pop(CONFIG_ENV))
    script = os.path.abspath(cfg["script"])
    cfg["script"] = script
    # What `python script.py` does: the script's directory first on sys.path (set before torch is
    # imported, so this harness's own directory never shadows anything), argv from the script on.
    sys.path[0] = os.path.dirname(script)
    sys.argv = [script, *cfg.get("args", [])]
    harness = Harness(cfg)
    harness.install()
    return harness.run()


def exit_without_finalizing(code: int) -> None:
    """End the process as ``sys.exit(code)`` would, less the interpreter's finalization.

    The result is written by now. What a normal exit still does for the script happens here, in
    the interpreter's order: its non-daemon threads are waited for, its atexit handlers run (a
    hanging one is the runner's to kill, as before), the files it left open are flushed. What is
    skipped is tearing down every module and object of torch: 1.5 s of CPU a run on a 2-vCPU box
    (torch 2.13), paid after the measurement by every run a comparison makes.
    """
    import atexit
    import io

    buffered = {io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom, io.BufferedRWPair}
    for end in filter(None, (getattr(threading, "_shutdown", None), atexit._run_exitfuncs)):
        try:
            end()
        except BaseException:  # the interpreter goes on past a failing handler too
            pass
    try:
        for obj in gc.get_objects():  # by exact type: an isinstance() check can wake lazy modules
            if type(obj) in buffered and not obj.closed:
                try:
                    obj.flush()
                except BaseException:
                    pass
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    _REAL_EXIT(code)


if __name__ == "__main__":
    exit_without_finalizing(main())
