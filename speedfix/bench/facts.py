"""What the measured script configured, read inside the child while it runs (``runtime`` in the result).

Loaded by ``child.py`` next to it (standard library and torch only: it runs in the user's
training environment). Everything is read where the harness already is, never in a step:

* a DataLoader's settings and the line of user code that made it, when it is made (its
  ``__init__``, wrapped once); the loader the steps train on, when the window opens;
* an optimizer's class, ``fused``/``foreach`` and the line that made it, when it is made;
* ``torch.compile`` calls (``Module.compile()`` goes through it), when they are made;
* the model the first training forward calls (the harness's one-shot forward pre-hook): its
  wrapper (DDP, FSDP, DataParallel, DeepSpeed), its parameters, conv layers, Hugging Face's
  gradient checkpointing flag, and the autocast state around that call;
* the frameworks that run the step (a Lightning or Hugging Face Trainer, a DeepSpeed engine, an
  Accelerate optimizer), from the ``self`` of the frames around the first optimizer step: no
  framework is imported that the script did not import;
* TF32, cuDNN, determinism and anomaly-detection flags, when the window opens (or when the run
  ends without one).

Nothing is judged here: the parent turns these facts into findings (``advice.py``).
"""

from __future__ import annotations

import os
import sys
import sysconfig
import weakref

MAX_RECORDS = 32  # loaders, optimizers, compile calls kept (a grid search makes many)
_HARNESS_DIR = os.path.dirname(os.path.abspath(__file__))
_LIBRARY_DIRS = tuple(
    {os.path.realpath(p) + os.sep for p in (sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("purelib"),
                                            sysconfig.get_paths().get("platlib")) if p}
)
_LIBRARY_MARKERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


def _library(filename: str) -> bool:
    """Code that is not the user's: the standard library, installed packages, this harness."""
    if filename.startswith("<") or filename.startswith(_HARNESS_DIR):
        return True
    real = os.path.realpath(filename)
    return real.startswith(_LIBRARY_DIRS) or any(marker in real for marker in _LIBRARY_MARKERS)


def _type_name(obj: object) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _mro_names(obj: object) -> list[str]:
    return [f"{c.__module__}.{c.__name__}" for c in type(obj).__mro__]


def _plain(value: object) -> object:
    """A JSON value: enums as their value, other objects as their text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    inner = getattr(value, "value", None)
    if isinstance(inner, (bool, int, float, str)):
        return inner
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value][:16]
    if isinstance(value, dict):
        return "dict"  # a config dict: named, not copied
    return str(value)[:200]


def _call(obj: object, name: str) -> object:
    """``obj.name()`` or ``obj.name``, None when it fails: a framework's API differs across versions."""
    try:
        value = getattr(obj, name)
        return _plain(value() if callable(value) else value)
    except Exception:
        return None


def _safe(method):
    """A fact that cannot be read is left out: recording must never change how the script runs."""

    def call(self, *args):
        try:
            return method(self, *args)
        except Exception as exc:  # an unusual loader, optimizer or framework object
            self.errors.append(f"{method.__name__}: {type(exc).__name__}: {exc}"[:300])
        return None

    call.__name__ = method.__name__
    return call


class Recorder:
    """The facts of one run, collected at the harness's one-time hooks."""

    def __init__(self, unmirror) -> None:
        self.unmirror = unmirror  # paths as the user knows them
        self.loaders: list[dict] = []
        self.loader_refs: dict[int, tuple] = {}  # id(loader) -> (weakref, record)
        self.iter_loader: dict[int, tuple] = {}  # id(iterator) -> (weakref to it, loader record)
        self.optimizers: list[dict] = []
        self.compiled: list[dict] = []
        self.model: dict | None = None
        self.autocast: dict | None = None
        self.frameworks: dict = {}
        self.flags: dict | None = None
        self.reentrant_checkpoint = False
        self.errors: list[str] = []

    # ------------------------------------------------------------------ where
    def site(self, skip: int = 2) -> dict:
        """The line of user code that made the object, and the library call it went through."""
        frame = sys._getframe(skip)
        via = None
        while frame is not None:
            filename = frame.f_code.co_filename
            if not _library(filename):
                return {"file": self.unmirror(filename), "line": frame.f_lineno, "via": via}
            if via is None and not os.path.realpath(filename).startswith(_TORCH_DIR) and not filename.startswith(
                    (_HARNESS_DIR, "<")) and "runpy" not in filename:
                via = f"{self.unmirror(filename)}:{frame.f_lineno}"  # a framework made it for the script
            frame = frame.f_back
        return {"file": None, "line": None, "via": via}

    # ------------------------------------------------------------------ DataLoaders
    @_safe
    def on_loader(self, loader) -> None:
        if len(self.loaders) >= MAX_RECORDS:
            return
        record = {**self.site(3), "type": _type_name(loader), "dataset": _type_name(loader.dataset),
                  "iterable_dataset": getattr(loader, "_dataset_kind", 0) == 1, "trained_on": False, "epochs": 0}
        self._read_loader(loader, record)
        self.loaders.append(record)
        self.loader_refs[id(loader)] = (weakref.ref(loader), record)

    @staticmethod
    def _read_loader(loader, record: dict) -> None:
        """The settings as they are now (a script may set them after the call, SF105)."""
        sampler = getattr(loader, "batch_sampler", None)
        record.update(num_workers=getattr(loader, "num_workers", None),
                      pin_memory=bool(getattr(loader, "pin_memory", False)),
                      persistent_workers=bool(getattr(loader, "persistent_workers", False)),
                      prefetch_factor=getattr(loader, "prefetch_factor", None),
                      batch_size=getattr(loader, "batch_size", None) or getattr(sampler, "batch_size", None))

    def _loader_record(self, loader) -> dict | None:
        entry = self.loader_refs.get(id(loader))
        return entry[1] if entry is not None and entry[0]() is loader else None

    @_safe
    def on_loader_iter(self, loader, iterator) -> None:
        """Once per epoch: which loader an iterator belongs to."""
        record = self._loader_record(loader)
        if record is None:
            return
        record["epochs"] += 1
        try:
            self.iter_loader[id(iterator)] = (weakref.ref(iterator), record)
        except TypeError:
            pass

    @_safe
    def on_training_iterator(self, iterator) -> None:
        """The iterator the steps train on (read once, when the window opens or the run ends)."""
        entry = self.iter_loader.get(id(iterator)) if iterator is not None else None
        if entry is None or entry[0]() is not iterator:
            return
        record = entry[1]
        record["trained_on"] = True
        for ref, rec in self.loader_refs.values():
            if rec is record and ref() is not None:
                self._read_loader(ref(), record)

    # ------------------------------------------------------------------ optimizers
    @_safe
    def on_optimizer(self, optimizer) -> None:
        if len(self.optimizers) >= MAX_RECORDS:
            return
        defaults = getattr(optimizer, "defaults", None) or {}
        param = None
        try:
            param = optimizer.param_groups[0]["params"][0]
        except (IndexError, KeyError, AttributeError, TypeError):
            pass
        self.optimizers.append({**self.site(3), "type": _type_name(optimizer),
                                "fused": defaults.get("fused"), "foreach": defaults.get("foreach"),
                                "differentiable": defaults.get("differentiable"),
                                "capturable": defaults.get("capturable"),
                                "param_device": getattr(getattr(param, "device", None), "type", None),
                                "param_dtype": str(getattr(param, "dtype", "")).replace("torch.", "") or None})

    # ------------------------------------------------------------------ torch.compile
    @_safe
    def on_compile(self, target, kwargs: dict) -> None:
        if len(self.compiled) >= MAX_RECORDS:
            return
        owner = getattr(target, "__self__", None)  # Module.compile() compiles its bound _call_impl
        what = owner if owner is not None and hasattr(owner, "_call_impl") else target
        backend = kwargs.get("backend", "inductor")
        if what is None:
            name = "?"  # @torch.compile(...) used as a decorator factory: the function comes later
        else:
            name = _type_name(what) if hasattr(what, "forward") else getattr(what, "__qualname__", _type_name(what))
        self.compiled.append({**self.site(3), "target": name,
                              "method": owner is not None, "mode": kwargs.get("mode"),
                              "backend": backend if isinstance(backend, str) else getattr(backend, "__name__", str(backend)),
                              "fullgraph": bool(kwargs.get("fullgraph", False)), "dynamic": kwargs.get("dynamic")})

    # ------------------------------------------------------------------ the model's first training call
    @_safe
    def on_first_forward(self, torch, module, training: bool) -> None:
        """The model as the training step calls it, and the autocast around the call. An evaluation
        call before training (grad disabled) tells the model only, until a training call is seen:
        a compiled model's training calls are never seen (the hook is gone before Dynamo traces)."""
        if not training:
            if self.model is None:
                self._read_model(torch, module)
                self.model["seen_in"] = "evaluation"
            return
        self._read_model(torch, module)
        self.autocast = {}
        for device in ("cuda", "cpu"):
            try:
                if torch.is_autocast_enabled(device):
                    self.autocast = {"enabled": True, "device_type": device,
                                     "dtype": str(torch.get_autocast_dtype(device)).replace("torch.", "")}
                    break
            except (RuntimeError, TypeError, AttributeError):
                pass
        self.autocast.setdefault("enabled", False)

    def _read_model(self, torch, module) -> None:
        inner = getattr(module, "_orig_mod", module)  # a torch.compile'd module
        wrapper = getattr(inner, "module", None)
        model: dict = {"type": _type_name(module), "compiled": inner is not module or
                       getattr(module, "_compiled_call_impl", None) is not None}
        names = _mro_names(inner)
        if any(n.endswith(".DistributedDataParallel") for n in names):
            model["wrapper"] = "DistributedDataParallel"
            model["ddp"] = {k: _call(inner, k) for k in ("find_unused_parameters", "gradient_as_bucket_view",
                                                         "static_graph", "broadcast_buffers")}
        elif any(n.endswith(".FullyShardedDataParallel") for n in names):
            model["wrapper"] = "FullyShardedDataParallel"
            model["fsdp"] = {k: _call(inner, k) for k in ("sharding_strategy", "mixed_precision")}
        elif any(n.endswith(".DataParallel") for n in names):
            model["wrapper"] = "DataParallel"
        elif any(n.startswith("deepspeed.") and n.endswith(".DeepSpeedEngine") for n in names):
            model["wrapper"] = "DeepSpeedEngine"
            self.frameworks.setdefault("deepspeed", self._deepspeed(inner))
        if model.get("wrapper") and wrapper is not None:
            inner = wrapper
        model["inner_type"] = _type_name(inner)
        try:
            params = list(inner.parameters())
            model["parameters"] = int(sum(p.numel() for p in params))
            model["conv"] = any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in inner.modules())
        except Exception:
            pass
        flag = getattr(inner, "is_gradient_checkpointing", None)  # Hugging Face models
        if isinstance(flag, bool):
            model["gradient_checkpointing"] = flag
        self.model = model

    # ------------------------------------------------------------------ frameworks around the step
    @_safe
    def on_first_step(self, frame) -> None:
        """The frameworks whose methods are on the stack of the first optimizer step."""
        seen: set[int] = set()
        while frame is not None:
            owner = frame.f_locals.get("self") if frame.f_code.co_varnames[:1] == ("self",) else None
            frame = frame.f_back
            if owner is None or id(owner) in seen:
                continue
            seen.add(id(owner))
            module = type(owner).__module__.split(".")[0]
            names = _mro_names(owner)
            if module in ("lightning", "pytorch_lightning") and any(n.endswith(".Trainer") for n in names):
                self.frameworks.setdefault("lightning", {
                    "precision": _call(owner, "precision"),
                    "strategy": _type_name(owner.strategy) if hasattr(owner, "strategy") else None,
                    "accelerator": _type_name(owner.accelerator) if hasattr(owner, "accelerator") else None,
                    "accumulate_grad_batches": _call(owner, "accumulate_grad_batches"),
                    "num_devices": _call(owner, "num_devices")})
            elif module in ("transformers", "trl") and any(n.endswith(".Trainer") for n in names):
                args = getattr(owner, "args", None)
                self.frameworks.setdefault("transformers", {k: _call(args, k) for k in _HF_ARGS})
            elif module == "deepspeed" and any(n.endswith(".DeepSpeedEngine") for n in names):
                self.frameworks.setdefault("deepspeed", self._deepspeed(owner))
            elif module == "accelerate" and hasattr(owner, "accelerator_state"):
                state = owner.accelerator_state
                self.frameworks.setdefault("accelerate", {"mixed_precision": _call(state, "mixed_precision"),
                                                          "distributed_type": _call(state, "distributed_type")})

    @staticmethod
    def _deepspeed(engine) -> dict:
        return {k: _call(engine, k) for k in ("zero_optimization_stage", "bfloat16_enabled", "fp16_enabled",
                                              "zero_cpu_offload", "train_micro_batch_size_per_gpu",
                                              "gradient_accumulation_steps")}

    # ------------------------------------------------------------------ flags
    @_safe
    def read_flags(self, torch, device: dict) -> None:
        """TF32, cuDNN, determinism, anomaly detection: as the window sees them (read once)."""
        if self.flags is not None:
            return
        backends = torch.backends
        flags = {"float32_matmul_precision": _call(torch, "get_float32_matmul_precision"),
                 "cuda_matmul_allow_tf32": _call(backends.cuda.matmul, "allow_tf32"),
                 "cudnn_allow_tf32": _call(backends.cudnn, "allow_tf32"),
                 "cudnn_benchmark": _call(backends.cudnn, "benchmark"),
                 "cudnn_deterministic": _call(backends.cudnn, "deterministic"),
                 "deterministic_algorithms": _call(torch, "are_deterministic_algorithms_enabled"),
                 "anomaly_detection": _call(torch, "is_anomaly_enabled"),
                 "gpu_capability": None}
        if device.get("type") == "cuda":
            try:
                flags["gpu_capability"] = list(torch.cuda.get_device_capability())
            except (RuntimeError, AssertionError):
                pass
        self.flags = flags

    def report(self) -> dict:
        return {"loaders": self.loaders, "optimizers": self.optimizers, "compiled": self.compiled,
                "model": self.model, "autocast": self.autocast, "flags": self.flags,
                "frameworks": self.frameworks, "reentrant_checkpoint": self.reentrant_checkpoint,
                "errors": self.errors[:10]}


_HF_ARGS = ("bf16", "fp16", "tf32", "torch_compile", "gradient_checkpointing", "optim",
            "per_device_train_batch_size", "gradient_accumulation_steps", "dataloader_num_workers",
            "dataloader_pin_memory", "dataloader_persistent_workers", "deepspeed", "fsdp")


def _torch_dir() -> str:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    origin = spec.origin if spec is not None else None
    return os.path.realpath(os.path.dirname(origin)) + os.sep if origin else "\0"


_TORCH_DIR = _torch_dir()
