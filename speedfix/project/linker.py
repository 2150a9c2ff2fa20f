"""Link the files of one scan: resolve their imports and tell each file what the others say.

Module names are resolved as Python would for a script run from its own folder or from a scan
root: ``from engine import x`` finds ``engine.py`` beside the importing file, in the folder
above its package (``util/misc.py`` for ``import util.misc`` inside a package tree), or at a
root the scan was given (or, failing those, in the one folder of the scan that holds such a
module: a project whose shell script puts `src/solver/` on `PYTHONPATH`); ``from .engine import
x`` is relative to the importing package. Only files of the scan are linked, with one exception:
a module a scanned file star-imports (`from conf import *`, in turn) is read for its facts (never
reported on), since every name it binds is the file's own.

What a file learns (``Links``):

- the facts of each project module it imports, under the prefix it imports it by, so its
  context can look up ``engine.train_one_epoch`` or ``config.DEVICE``;
- ``cuda``: why it runs on CUDA through another file, or None. A file names CUDA itself, or
  imports a name that holds a CUDA device (``from config import DEVICE``), or calls a project
  function that runs on CUDA; and every module imported (transitively) by such a file runs on
  CUDA too: ``engine.py`` taking ``device`` as a parameter is trained on the device ``main.py``
  passes;
- ``hot``: its functions that another file calls on every training step, also through a
  parameter (`train_step(..., forward_step_func=forward_step)`, whose training loop calls
  `forward_step_func(...)`);
- ``no_grad``: its functions that another file calls with autograd off (`with torch.no_grad():
  validate(...)`);
- ``env_updates``: its functions that another file calls in a loop that steps an environment
  (an RL agent's `update()`, run between rollouts);
- ``feeds``: its functions whose returned DataLoader another file's training loop iterates
  (`loader = get_loader(...)` in ``train.py``): the loader's fixes belong where it is built;
- ``missing``: modules it imports that exist beside it but were not scanned (to say what could
  not be checked);
- ``arguments``: what other files pass to the parameters of its module-level functions and of
  its classes' constructors, when every call passes the same constant (`get_loader(...,
  num_workers=args.workers)`: the run's worker count is the option's default, not `get_loader`'s;
  `GNN(..., gnn_type=args.gnn_type)`: the layers its `gnn_type` picks);
- ``networks``: what other files hand to the parameters of its module-level functions when it is
  a network of one of their classes (`fit_one_epoch(model_train, ...)` with `model_train =
  YoloBody(...).train()`, through `DataParallel(...)` and `.cuda()`): whether that class builds
  convolutions and whether it may multiply matrices (a conv net gains nothing from TF32);
- ``on_device``: the parameters of its module-level functions that other files hand only
  objects of their classes whose methods copy to a device (a Dataset that moves each sample to
  the GPU, handed to a loader factory);
- ``cudnn``: the file of a scan that imports it (in turn) and chooses cuDNN's algorithms for
  the process (`cudnn.benchmark = True` in the `main.py` that runs `solver.py`'s training), or None;
- ``tf32``: the same for the fp32 matmul precision (`allow_tf32 = args.tf32` in the `main.py`
  that runs the trainer classes of other files: its command line decides), or None; a script
  that calls a function of another file making either choice (a start-up helper) makes it too;
- ``unpinned_loaders``: the same for DataLoaders built without `pin_memory` (Dual-Path-RNN's
  `train_rnn.py`, whose loaders the trainer class of another file iterates), or None;
- ``cuda_default``: a module it imports, in turn, that makes CUDA the default for new tensors
  (`torch.set_default_tensor_type(torch.cuda.FloatTensor)` in a models/utils.py whose collate
  function the script's loaders take), or None;
- ``cudnn_imported``: a module it imports, in turn, that chooses cuDNN's algorithms or switches
  cuDNN off when imported (module level: crnn's evaluate.py, imported by train.py), or None;
- ``skips_submodules``: a module it imports, in turn, with a module class whose `forward` calls
  a submodule only in some calls (DDP needs `find_unused_parameters` for it), or None;
- ``double_backward``: a module it imports, in turn, that takes a gradient with `create_graph`
  (a potential's forces), or None;
- ``trained_by``: the file of a scan that imports it (in turn) and holds a training loop: this
  one is its library, whose `if __name__ == "__main__":` block is a self-test (unless a launch
  command runs it);
- ``constructed``: its classes that other files build, and what they pass them (a constructor
  default another file overrides is not the run's value);
- ``built_under``: its classes that other files build, with the flags (`if args.gail:`) each
  construction needs: a class built only under an option that is off by default is off the run's path;
- ``methods_used``: the methods of its classes that other files call on the objects they build
  (`buffer.add(...)` on a `ReplayBuffer` of `utils.py`: an online agent fills its buffer);
- ``options``: the command-line options of the scripts that run it (a script that imports it,
  in turn, whose parser is its own or one of a module it imports: `arguments.py`'s `get_args()`),
  with the default each has where the scripts agree, and the names they bind the parsed options
  to (`args`): `optim_factory.py`'s `args.opt` is `main.py`'s `--opt`, `adamw` unless given.
"""

from __future__ import annotations

from collections import deque

import hashlib
import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, TypeVar

from speedfix.project.facts import FunctionFacts, ModuleFacts, option_of_module

T = TypeVar("T")


@dataclass(frozen=True)
class Links:
    modules: dict[str, ModuleFacts] = field(default_factory=dict)  # import prefix -> facts (functions, CUDA names)
    names: dict[str, str] = field(default_factory=dict)  # import prefix -> the module's file, as shown
    star: dict[str, str] = field(default_factory=dict)  # name bound by `from m import *` -> its qualified name
    # a library name that `from m import *` binds because `m` imports it (`torch`, `nn`) -> what it means
    star_libraries: dict[str, str] = field(default_factory=dict)
    cuda: str | None = None  # why the file runs on CUDA through another file
    hot: tuple[str, ...] = ()  # its functions (`f`, `Class.method`) called on every step from another file
    no_grad: tuple[str, ...] = ()  # its functions another file calls under `torch.no_grad()`
    env_updates: tuple[str, ...] = ()  # its functions another file calls in a loop that steps an environment
    # methods other files call under `torch.no_grad()` on objects of classes they cannot name
    # (an agent built from a config): by name only
    no_grad_methods: tuple[str, ...] = ()
    # methods other files call in a loop that steps an environment on objects of classes they
    # cannot name (an agent built from a config's `agent.update(...)`): by name only
    env_methods: tuple[str, ...] = ()
    # methods of its classes (`SupervisedTrainer.train_step`) that a subclass in another scanned
    # file overrides with one that takes a step: the base class's loop that calls them trains
    stepping_overrides: tuple[str, ...] = ()
    # its functions whose returned loader another file's training loop iterates: (function, every
    # epoch, batches copied to a device, its dataset changed between epochs, the elements of the
    # tuple it returns that are iterated: `train_loader, val_loader = get_loaders()`; -1: the value)
    feeds: tuple[tuple[str, bool, bool, bool, tuple[int, ...]], ...] = ()
    missing: tuple[str, ...] = ()  # modules it imports that exist beside it but were not scanned
    # its classes other files build: (class, `from_argparse_args` or "", keywords, positional count, star)
    constructed: tuple[tuple[str, str, tuple[str, ...], int, bool], ...] = ()
    methods_used: tuple[str, ...] = ()  # methods of its classes that other files call on objects they build
    # its classes other files build, with the flags each construction needs (ModuleFacts.gated_constructions)
    built_under: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # what other files pass to its functions' `**kwargs` (`make_loaders(args, **kwargs)`): (function,
    # key, the value's repr, "" when it is unknown or the callers differ, ``LEFT_OUT`` when some
    # call does not pass the key); only functions whose every such call passes known keys
    kwargs: tuple[tuple[str, str, str], ...] = ()
    # networks of another file's classes that other files hand to its module-level functions (YOLO
    # tutorials' `fit_one_epoch(model_train, ...)` with `model_train = YoloBody(...).train()`):
    # (function, parameter, the class builds convolutions, it may multiply matrices), one per
    # parameter that every such call agrees on
    networks: tuple[tuple[str, str, bool, bool], ...] = ()
    # the parameters of its module-level functions and class constructors that other files hand
    # objects of their classes only whose methods copy to a device (fastcomposer's
    # `get_data_loader(train_dataset, ...)` with a Dataset whose `__getitem__` moves each sample
    # to `self.device`): (function or class, parameter)
    on_device: tuple[tuple[str, str], ...] = ()
    # what other files pass to the parameters of its module-level functions and classes
    # (`get_loader(..., num_workers=args.workers)`, `GNN(..., gnn_type=args.gnn_type)`): (function
    # or class, parameter, the value's repr, "" when it is unknown, the calls differ or one of them
    # leaves the default); parameter "*": a call passes `*args`/`**kwargs`
    arguments: tuple[tuple[str, str, str], ...] = ()
    cudnn: str | None = None  # an importer's file (as shown) that chooses cuDNN's algorithms for the process
    tf32: str | None = None  # an importer's file (as shown) that chooses the fp32 matmul precision for the process
    # an importer's file (as shown) that builds DataLoaders and pins none: the batches this file is
    # handed (a trainer class's `self.train_dataloader`) come from pageable memory
    unpinned_loaders: str | None = None
    # a module it imports, in turn, that makes CUDA the default for new tensors (as shown): the
    # tensors a collate function makes are then CUDA tensors, which workers cannot make nor pin
    cuda_default: str | None = None
    # a module it imports, in turn, that chooses cuDNN's algorithms (or switches cuDNN off) at
    # import (as shown): the process has made its choice there
    cudnn_imported: str | None = None
    # a module it imports, in turn, whose module class calls a submodule only in some forward passes
    skips_submodules: str | None = None
    # a module it imports, in turn, that differentiates a gradient again (`create_graph=`)
    double_backward: str | None = None
    trained_by: str | None = None  # an importer's file (as shown) that holds a training loop: this one is its library
    # the library (as shown) holding the training loop of a script that imports this file too
    # (``_imported_beside_a_trainer``): a run builds with this file what that library trains
    beside_trainer: str | None = None
    options: tuple[tuple[str, str], ...] = ()  # (destination, default's repr) of the scripts that run it
    option_holders: tuple[str, ...] = ()  # the names those scripts bind their parsed options to
    # the entries of option-indexed dicts (ModuleFacts.dispatches) through which alone the scanned
    # scripts reach this file: (option, key) pairs (LTSF-Linear's `models/Autoformer.py` and the
    # layers only it imports: `("model", "Autoformer", ("Autoformer", "DLinear", ...))`: the option,
    # the entry's key and every key of its dict); empty when a script reaches it otherwise
    picked_by: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    # the scanned files that import it (as shown): whether a run reaches it
    importers: tuple[str, ...] = ()
    # the scanned scripts (with an `if __name__ == "__main__":` block, not tests) that import it, in
    # turn (as shown): for a module with no such block, the commands that run them run its code
    entry_importers: tuple[str, ...] = ()
    # no other scanned file imports it (``unreferenced_modules``), while the scan holds code that
    # trains: its analysis looks for its name in the project's other files
    unreferenced: bool = False
    # a test of the project (`test_*.py`, a `tests/` folder) found in a folder the scan walked:
    # its training code exercises the project's code, no run trains with it
    test: bool = False

    def lookup(self, qualified: str | None) -> tuple[str, str] | None:
        """(import prefix, name inside that module) for a qualified name, longest prefix first."""
        return _longest_prefix(qualified, self.modules) if qualified else None

    def function(self, qualified: str | None) -> FunctionFacts | None:
        """The facts of a project function, method (`m.Class.method`) or class (`m.Class`)."""
        found = self.lookup(qualified)
        return self.modules[found[0]].functions.get(found[1]) if found else None

    def constant(self, qualified: str | None) -> str | None:
        """The repr of a project module's constant (`config.num_workers`: `0`), None if not one."""
        found = self.lookup(qualified)
        return dict(self.modules[found[0]].constants).get(found[1]) if found else None

    def is_cuda_name(self, qualified: str | None) -> bool:
        found = self.lookup(qualified)
        return found is not None and found[1].split(".", 1)[0] in self.modules[found[0]].cuda_names

    def digest(self) -> str:
        """Changes whenever anything another file tells this one changes (the cache key)."""
        record = {
            "modules": {prefix: _slim_record(facts) for prefix, facts in sorted(self.modules.items())},
            "names": sorted(self.names.items()),
            "star": sorted(self.star.items()),
            "star_libraries": sorted(self.star_libraries.items()),
            "cuda": self.cuda,
            "hot": list(self.hot),
            "no_grad": list(self.no_grad),
            "env_updates": list(self.env_updates),
            "no_grad_methods": list(self.no_grad_methods),
            "env_methods": list(self.env_methods),
            "stepping_overrides": list(self.stepping_overrides),
            "feeds": [list(feed) for feed in self.feeds],
            "missing": list(self.missing),
            "constructed": [list(map(str, (name, method, ",".join(keywords), count, star)))
                            for name, method, keywords, count, star in self.constructed],
            "methods_used": list(self.methods_used),
            "built_under": [[name, list(gates)] for name, gates in self.built_under],
            "kwargs": [list(given) for given in self.kwargs],
            "arguments": [list(given) for given in self.arguments],
            "networks": [list(given) for given in self.networks],
            "on_device": [list(given) for given in self.on_device],
            "cudnn": self.cudnn,
            "tf32": self.tf32,
            "unpinned_loaders": self.unpinned_loaders,
            "cuda_default": self.cuda_default,
            "cudnn_imported": self.cudnn_imported,
            "skips_submodules": self.skips_submodules,
            "double_backward": self.double_backward,
            "trained_by": self.trained_by,
            "beside_trainer": self.beside_trainer,
            "options": [list(option) for option in self.options],
            "option_holders": list(self.option_holders),
            "picked_by": [[option, key, list(keys)] for option, key, keys in self.picked_by],
            "unreferenced": self.unreferenced,
            "test": self.test,
            "importers": list(self.importers),
            "entry_importers": list(self.entry_importers),
        }
        return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def _slim_record(facts: ModuleFacts) -> dict:
    return {"functions": {name: f.__dict__ for name, f in sorted(facts.functions.items())},
            "cuda_names": list(facts.cuda_names), "constants": list(facts.constants),
            "returned_dicts": list(facts.returned_dicts), "options": list(facts.options),
            "class_layers": [[name, [list(call) for call in calls], list(params)] for name, calls, params in facts.class_layers]}


_IMPORT_LINE = re.compile(rb"^[ \t]*(?:from[ \t]+([.\w]+)[ \t]+import\b([^\n#]*)|import[ \t]+([^\n#;]+))", re.MULTILINE)
_WORD = re.compile(rb"\w+")


def imported_words(data: bytes, *, modules_only: bool = False) -> set[str]:
    """Every name on the file's import lines (cheap: no parse), to find the files that may
    import another file of the scan before any of them is parsed; with ``modules_only``, not
    the names a `from m import a, b` takes from its module."""
    words: set[str] = set()
    for match in _IMPORT_LINE.finditer(data):
        groups = (match.group(1), match.group(3)) if modules_only else match.groups()
        for group in groups:
            if group:
                words.update(word.decode("ascii", "replace") for word in _WORD.findall(group))
    return words


_STAR_LINE = re.compile(rb"^from[ \t]+(\w+(?:\.\w+)*)[ \t]+import[ \t]*\*", re.MULTILINE)
_STAR = re.compile(rb"import[ \t]*\*")  # what every star import holds: a quick search first


def star_imported_beside(path: Path, data: bytes, roots: Iterable[Path]) -> list[Path]:
    """Project modules a file takes every name of at module level (`from conf import *`) that
    sit in its folder or at a scan root: their names are the file's own, so their facts are
    read even when they are not scanned (cheap: no parse)."""
    found: list[Path] = []
    if _STAR.search(data) is None:
        return found
    for match in _STAR_LINE.finditer(data):
        parts = match.group(1).decode("ascii", "replace").split(".")
        for folder in dict.fromkeys([path.parent, *roots]):
            base = folder.joinpath(*parts)
            candidate = next((c for c in (base.with_suffix(".py"), base / "__init__.py") if c.is_file()), None)
            if candidate is not None:
                found.append(candidate)
                break
    return found


_QUOTED_WORD = re.compile(rb"""['"](\w+)['"]""")
# Code that imports modules by names made at run time, or runs files: any module may be one.
_DYNAMIC_IMPORT = re.compile(rb"import_module\(|__import__\(|iter_modules\(|walk_packages\(|spec_from_file_location\("
                             rb"|load_source\(|run_path\(|\bexec\(|\bexecfile\(")
# Words one of them must hold: looked for first (a plain search is several times as fast).
_DYNAMIC_IMPORT_WORDS = (b"import_module(", b"__import__(", b"iter_modules(", b"walk_packages(",
                         b"spec_from_file_location(", b"load_source(", b"run_path(", b"exec(", b"execfile(")
_TRAINS = (b"backward(", b".fit(", b".train(")  # a training loop, Lightning's or a Trainer's run
_NOT_LIBRARIES = frozenset({"__init__", "__main__", "setup", "conftest"})


def unreferenced_modules(texts: Mapping[Path, bytes], candidates: Iterable[Path]) -> set[Path]:
    """Of ``candidates`` (scanned modules no other scanned file imports), those that train
    nothing themselves, in a scan whose ``texts`` (the scanned files, notebooks too) hold code
    that trains; none when one imports modules by a name made at run time
    (`importlib.import_module(name)`, a loop over a folder's modules). Whether another file of
    the project names them is for their analysis to read (``unused.unreferenced_module``)."""
    if any(any(word in data for word in _DYNAMIC_IMPORT_WORDS) and _DYNAMIC_IMPORT.search(data)
           for data in texts.values()):
        return set()
    trains = {path for path, data in texts.items() if any(word in data for word in _TRAINS)}  # entry points, trainers: kept
    return {path for path in candidates if trains and path not in trains and path.stem not in _NOT_LIBRARIES
            and path.stem.isidentifier() and not is_test_file(path)}


def linked_candidates(sources: dict[Path, bytes]) -> set[Path]:
    """The files whose facts are worth reading: those that import a module named like another
    scanned file that it could reach (in its folder, above it or below it, or in a package beside
    one of its folders: `from utils.masking import ...` in `models/attn.py`), and those files; a
    file that imports a module by name (`importlib.import_module(args.model)`) and the files its
    quoted words name (the option's default). A lone script that imports only libraries is not
    read twice."""
    by_stem: dict[str, list[tuple[Path, Path]]] = {}
    for path in sources:
        package = path.name == "__init__.py"
        stem = path.parent.name if package else path.stem
        by_stem.setdefault(stem, []).append((path, path.parent.parent if package else path.parent))
    chosen: set[Path] = set()
    above: dict[Path, frozenset[Path]] = {}  # each folder's parents, as a set (a scan has a few dozen folders)

    def parents(folder: Path) -> frozenset[Path]:
        found = above.get(folder)
        if found is None:
            found = above[folder] = frozenset(folder.parents)
        return found

    for path, data in sources.items():
        folder = path.parent
        words = imported_words(data)
        if b"import_module(" in data:  # `importlib.import_module(args.model)`: a module the linker looks for
            chosen.add(path)
            words |= {word.decode("ascii", "replace") for word in _QUOTED_WORD.findall(data)}  # the default's
        for word in words:
            for other, where in by_stem.get(word, ()):
                if other != path and (where == folder or where in parents(folder) or folder in parents(where)
                                      or where.parent in parents(folder)):
                    chosen.update((path, other))
    return chosen


class _Resolver:
    def __init__(self, files: Iterable[Path], roots: Iterable[Path]) -> None:
        self.files = {str(path): path for path in files}  # strings: pathlib is slow to build paths
        self.roots = list(dict.fromkeys(roots))
        self.folders: dict[Path, list[Path]] = {}
        self.listings: dict[Path, set[str]] = {}
        self.memo: dict[tuple[Path, str], tuple[str, Path] | None] = {}
        self.by_name: dict[str, list[Path]] | None = None  # module name -> the folders holding one (`_elsewhere`)

    def module_file(self, folder: Path, parts: list[str]) -> Path | None:
        base = "/".join([str(folder), *parts])
        for candidate in (base + ".py", base + "/__init__.py") if parts else (base + "/__init__.py",):
            found = self.files.get(candidate)
            if found is not None:
                return found
        return None

    def beside(self, path: Path, head: str) -> str | None:
        """`head.py` or the package `head/` in the file's folder, as shown in a note."""
        folder = path.parent
        names = self.listings.get(folder)
        if names is None:
            try:
                names = self.listings[folder] = set(os.listdir(folder))
            except OSError:
                names = self.listings[folder] = set()
        if f"{head}.py" in names:
            return f"{head}.py"
        return f"{head}/" if head in names and (folder / head / "__init__.py").is_file() else None

    def search_folders(self, path: Path) -> list[Path]:
        """Where an absolute import of ``path`` looks: its folder, the folder above its
        package, the scan roots."""
        found = self.folders.get(path.parent)
        if found is None:
            top = path.parent
            while (top / "__init__.py").exists() and top.parent != top:
                top = top.parent
            found = self.folders[path.parent] = list(dict.fromkeys([path.parent, top, *self.roots]))
        return found

    def resolve(self, path: Path, qualified: str) -> tuple[str, Path] | None:
        """(module prefix, module file) of a qualified import name, longest module first."""
        key = (path.parent, qualified)  # the files of one folder import the same modules
        if key not in self.memo:
            self.memo[key] = self._resolve(path, qualified)
        hit = self.memo[key]
        if hit is not None and hit[1] == path:  # `from model import FastSpeech2` in `utils/model.py`: the other `model`
            return self._resolve(path, qualified, skip=path)
        return hit

    def _resolve(self, path: Path, qualified: str, skip: Path | None = None) -> tuple[str, Path] | None:
        level = len(qualified) - len(qualified.lstrip("."))
        parts = [part for part in qualified[level:].split(".") if part]
        if level:
            folder = path.parent
            for _ in range(level - 1):
                folder = folder.parent
            folders = [folder]
        else:
            folders = self.search_folders(path)
            # Python takes the first folder of its path that holds the top name, and looks no
            # further: NGCF's `from NGCF import NGCF` in `NGCF/main.py` is `NGCF/NGCF.py`'s class,
            # not the module `NGCF.NGCF` of the package the folder above holds
            if len(parts) > 2 and parts[0] == path.parent.name and self.module_file(path.parent, []) is not None:
                # audiolm_pytorch/data.py's `from audiolm_pytorch.utils import f`: a module path of
                # two parts names a package, the one the file lies in, not the module
                # `audiolm_pytorch.py` beside it (NGCF's `from NGCF import NGCF` may mean either)
                folders = [folder for folder in folders if folder != path.parent]
            first = next((folder for folder in folders if self.module_file(folder, parts[:1]) not in (None, skip)), None)
            if first is not None:
                folders = [first]
        for end in range(len(parts), -1 if level else 0, -1):
            for folder in folders:
                found = self.module_file(folder, parts[:end])
                if found is not None and found != skip:
                    return "." * level + ".".join(parts[:end]), found
        return None if level or not parts else self._elsewhere(parts, skip)

    def _elsewhere(self, parts: list[str], skip: Path | None) -> tuple[str, Path] | None:
        """An absolute import that no search folder holds, of a module that one folder of the scan
        alone holds: the project puts that folder on the path itself (Speech-Transformer's
        `path.sh` exporting `PYTHONPATH=src/data/:src/solver/:...` for `src/bin/train.py`'s
        `from solver import Solver`). Two folders holding one, or none: not linked."""
        if self.by_name is None:
            self.by_name = {}
            for path in self.files.values():
                name = path.parent.name if path.name == "__init__.py" else path.stem
                folder = path.parent.parent if path.name == "__init__.py" else path.parent
                self.by_name.setdefault(name, []).append(folder)
        folders = self.by_name.get(parts[0], [])
        if len(folders) != 1:
            return None
        for end in range(len(parts), 0, -1):
            found = self.module_file(folders[0], parts[:end])
            if found is not None and found != skip:
                return ".".join(parts[:end]), found
        return None


def link(
    facts: dict[Path, ModuleFacts],
    roots: Iterable[Path],
    show: Callable[[Path], str] = str,
) -> dict[Path, Links]:
    """Links for each file of ``facts`` (files that could not be read are left out); the same
    whatever the order of ``facts`` (they key the cache: a reason that named whichever importer
    came first made every scan analyse those files again)."""
    facts = dict(sorted(facts.items()))
    resolver = _Resolver(facts, roots)
    prefixes: dict[Path, dict[str, Path]] = {}
    missing: dict[Path, list[str]] = {}
    for path, module in facts.items():
        found: dict[str, Path] = {}
        for qualified in [target for _, target in module.imports] + list(module.star_imports):
            by_option = option_of_module(qualified)
            if by_option is not None:
                chosen = _module_of_option(path, module, qualified, *by_option, resolver, facts)
                if chosen is not None:
                    found.setdefault(qualified, chosen)
                continue
            hit = resolver.resolve(path, qualified)
            if hit is not None:
                found.setdefault(*hit)
        for qualified in module.references:  # `import pkg` then `pkg.sub.f()`: a module below a package
            if any(qualified.startswith(prefix + ".") and found[prefix].name == "__init__.py" for prefix in found):
                hit = resolver.resolve(path, qualified)
                if hit is not None:
                    found.setdefault(*hit)
        prefixes[path] = found
        missing[path] = _missing(path, module, found, resolver)
    facts = _layers_through_parts(facts, prefixes)
    cuda = _cuda_reasons(facts, prefixes, show)
    hot = _called_functions(facts, prefixes, lambda module: module.hot_calls)
    # objects a module's `forward` builds of another file's classes (a mask made every step)
    for path, built in _called_functions(facts, prefixes, lambda module: module.forward_calls, constructors=True).items():
        hot.setdefault(path, set()).update(built)
    for path, names in _handed_to_steps(facts, prefixes).items():
        hot.setdefault(path, set()).update(names)
    for path, names in _called_functions(facts, prefixes, lambda module: module.forward_modules).items():
        hot.setdefault(path, set()).update(names)  # `model(x)`, `self.lr(x)`: their class's forward
    for path, names in _factory_forwards(facts, prefixes).items():
        hot.setdefault(path, set()).update(names)  # `model, optim = get_model(...)`, then `model(x)`
    no_grad = _called_functions(facts, prefixes, lambda module: module.no_grad_calls)
    env_updates = _called_functions(facts, prefixes, lambda module: module.env_calls)
    no_grad_methods: dict[str, set[Path]] = {}  # method name -> the files that call it under no_grad
    env_methods: dict[str, set[Path]] = {}  # ... and in a loop that steps an environment
    for path, module in facts.items():
        for name in module.no_grad_methods:
            no_grad_methods.setdefault(name, set()).add(path)
        for name in module.env_methods:
            env_methods.setdefault(name, set()).add(path)
    feeds = _loader_factories(facts, prefixes)
    constructed = _constructions(facts, prefixes, show)
    built_under = _gated_constructions(facts, prefixes)
    methods_used = _methods_used(facts, prefixes)
    kwargs = _kwargs_given(facts, prefixes)
    exported = {path: _exported(path, module, prefixes, facts) for path, module in facts.items()}
    arguments, keywords = _arguments_given(facts, prefixes, exported)
    kwargs = _merged_kwargs(kwargs, keywords)
    networks = _networks_handed(facts, prefixes)
    on_device = _moving_objects_handed(facts, prefixes)
    # a script that chooses them through a helper it calls (`setup_basics()` of utils/gen_utils.py)
    cudnn_helpers = _calls_a_choice(facts, prefixes, exported, lambda function: function.cudnn)
    tf32_helpers = _calls_a_choice(facts, prefixes, exported, lambda function: function.tf32)
    helpers = {path: replace(module, cudnn=module.cudnn or path in cudnn_helpers, tf32=module.tf32 or path in tf32_helpers)
               for path, module in facts.items()}
    cudnn = _imported_by(helpers, prefixes, lambda module: module.cudnn, show)
    unpinned = _imported_by(facts, prefixes, lambda module: module.unpinned_loaders, show)
    cuda_defaults, cudnn_imported, skipping, twice = _importing(facts, prefixes, (
        lambda module: module.cuda_default, lambda module: module.cudnn_at_import,
        lambda module: module.skips_submodules, lambda module: module.double_backward), show)
    tf32 = _imported_by(helpers, prefixes, lambda module: module.tf32, show)
    overrides = _stepping_overrides(facts, prefixes)
    runs = {path: module for path, module in facts.items() if not is_test_file(Path(show(path)))}
    trained_by = _imported_by_another(runs, prefixes, lambda module: module.trains, show)
    beside = _imported_beside_a_trainer(runs, prefixes, show)
    entries = _entry_importers(runs, prefixes, show)
    options = _run_options(facts, prefixes)
    picked = _picked_only(facts, prefixes)
    importers: dict[Path, set[str]] = {}
    for path, found in prefixes.items():
        for target in found.values():
            if target != path:
                importers.setdefault(target, set()).add(show(path))
    links: dict[Path, Links] = {}
    for path, module in facts.items():
        found = dict(prefixes[path])
        star, libraries = _star_names(module, found, prefixes, exported, facts)
        links[path] = Links(
            modules={prefix: exported[target] for prefix, target in found.items()},
            names={prefix: show(target) for prefix, target in found.items()},
            star=star,
            star_libraries=libraries,
            cuda=cuda.get(path),
            hot=tuple(sorted(hot.get(path, ()))),
            no_grad=tuple(sorted(no_grad.get(path, ()))),
            env_updates=tuple(sorted(env_updates.get(path, ()))),
            no_grad_methods=_methods_called_elsewhere(module, path, no_grad_methods),
            env_methods=_methods_called_elsewhere(module, path, env_methods),
            feeds=tuple((name, *uses) for name, uses in sorted(feeds.get(path, {}).items())),
            missing=tuple(missing[path]),
            constructed=tuple(sorted(constructed.get(path, ()))),
            built_under=tuple(sorted(built_under.get(path, ()))),
            methods_used=tuple(sorted(methods_used.get(path, ()))),
            kwargs=kwargs.get(path, ()),
            arguments=arguments.get(path, ()),
            networks=networks.get(path, ()),
            on_device=on_device.get(path, ()),
            cudnn=cudnn.get(path),
            tf32=tf32.get(path),
            unpinned_loaders=unpinned.get(path),
            cuda_default=cuda_defaults.get(path),
            cudnn_imported=cudnn_imported.get(path),
            skips_submodules=skipping.get(path),
            double_backward=twice.get(path),
            stepping_overrides=tuple(sorted(overrides.get(path, ()))),
            trained_by=trained_by.get(path),
            beside_trainer=beside.get(path),
            options=options.get(path, ((), ()))[0],
            option_holders=options.get(path, ((), ()))[1],
            picked_by=picked.get(path, ()),
            importers=tuple(sorted(importers.get(path, ()))),
            entry_importers=entries.get(path, ()),
        )
    return links


def _star_names(module: ModuleFacts, found: dict[str, Path], prefixes: dict[Path, dict[str, Path]],
                exported: dict[Path, ModuleFacts], facts: dict[Path, ModuleFacts]) -> tuple[dict[str, str], dict[str, str]]:
    """Names bound by `from m import *`, through the star imports of `m` itself (a package's
    `__init__.py` doing `from .train_utils import *`). A module reached only that way is added
    to ``found`` under a prefix no import can spell (`*1`). Second, the libraries `m` imports
    (`import torch`, `import torch.nn as nn`): a star import binds those names too, and a script
    that writes `torch.nn.DataParallel` with no import of its own gets `torch` that way (a
    module's `__all__` could leave them out, but then the script could not run)."""
    star: dict[str, str] = {}
    libraries: dict[str, str] = {}
    todo = [(prefix, found[prefix]) for prefix in module.star_imports if prefix in found]
    seen: set[Path] = set()
    while todo:
        prefix, target = todo.pop(0)
        if target in seen:
            continue
        seen.add(target)
        for name in (*exported[target].functions, *exported[target].cuda_names):
            star.setdefault(name.split(".", 1)[0], f"{prefix}.{name.split('.', 1)[0]}")
        for local, qualified in facts[target].imports:
            if not local.startswith("_") and not qualified.startswith(".") and _split(qualified, prefixes[target]) is None:
                libraries.setdefault(local, qualified)
        for inner in exported[target].star_imports:
            if inner in prefixes[target]:
                key = f"*{len(seen)}"
                found[key] = prefixes[target][inner]
                todo.append((key, found[key]))
    return star, libraries


def _module_of_option(path: Path, module: ModuleFacts, name: str, prefix: str, option: str, resolver: _Resolver,
                      facts: dict[Path, ModuleFacts]) -> Path | None:
    """The scanned module that `importlib.import_module(args.model)` (``name``: see
    ``facts.module_by_option``) imports on a run that leaves the option at its default: the one
    the default names (PointNet++'s `--model pointnet_cls`); failing that, the one module the
    import could find that defines every name the file takes from it (`MODEL.get_model`,
    `MODEL.get_loss`). None when neither is known: which module runs is a command line's choice."""
    default = dict(module.options).get(option, "")
    if len(default) > 2 and default[0] == default[-1] and default[0] in "'\"":
        hit = resolver.resolve(path, prefix + default[1:-1])
        if hit is not None and hit[0] == prefix + default[1:-1]:  # the module itself, not a package above it
            return hit[1]
    taken = {reference[len(name) + 1:].split(".", 1)[0] for reference in module.references if reference.startswith(name + ".")}
    if not taken:
        return None
    found = []
    for other, facts_of_other in facts.items():
        if other == path or other.name == "__init__.py" or not all(
                taken_name in facts_of_other.functions or _is_class(facts_of_other, taken_name) for taken_name in taken):
            continue
        hit = resolver.resolve(path, prefix + other.stem)
        if hit is not None and hit[1] == other:
            found.append(other)
    return found[0] if len(found) == 1 else None


def _exported(path: Path, module: ModuleFacts, prefixes: dict[Path, dict[str, Path]],
              facts: dict[Path, ModuleFacts]) -> ModuleFacts:
    """What other files can take from a module: its own functions, CUDA names, constants,
    returned dicts, the layers of its classes and argparse options (the defaults of a parser a script builds with its
    `get_argparse()`), and the functions and CUDA names it imports from other scanned modules
    (`utils/__init__.py` doing `from .train_utils import train`), one level deep."""
    functions = dict(module.functions)
    cuda_names = set(module.cuda_names)
    for local, target in module.imports:
        hit = _split(target, prefixes[path])
        if hit is None or local in functions:
            continue
        other, name = facts[hit[0]], hit[1]
        for key, value in other.functions.items():
            if key == name or key.startswith(name + "."):
                functions.setdefault(local + key[len(name):], value)
        if name in other.cuda_names:
            cuda_names.add(local)
    return ModuleFacts(functions=functions, cuda_names=tuple(sorted(cuda_names)), star_imports=module.star_imports,
                       constants=module.constants, returned_dicts=module.returned_dicts, options=module.options,
                       class_layers=module.class_layers)


def _missing(path: Path, module: ModuleFacts, found: dict[str, Path], resolver: _Resolver) -> list[str]:
    """Modules imported by name that exist beside the file but are not part of the scan."""
    result = set()
    for _, target in module.imports:
        if target.startswith(".") or any(target == prefix or target.startswith(prefix + ".") for prefix in found):
            continue
        shown = resolver.beside(path, target.split(".", 1)[0])
        if shown is not None:
            result.add(shown)
    return sorted(result)


# ``Links.cuda`` of a file whose own code names CUDA (the file's analysis weighs that evidence itself).
NAMES_CUDA_ITSELF = "it names CUDA itself"


def _direct_cuda(path: Path, module: ModuleFacts, found: dict[str, Path], facts: dict[Path, ModuleFacts],
                 show: Callable[[Path], str]) -> str | None:
    """Why the file runs on CUDA by what it takes from other files, or None."""
    if module.cuda:
        return NAMES_CUDA_ITSELF
    if module.lightning:
        return "it defines a LightningModule, which Lightning trains on a GPU when there is one"
    for qualified in (*[target for _, target in module.imports], *module.references):
        hit = _split(qualified, found)
        if hit is None:
            continue
        target, name = hit
        other = facts[target]
        head = name.split(".", 1)[0]
        if head in other.cuda_names:
            return f"`{head}` from {show(target)} is a CUDA device"
        function = other.functions.get(name)
        if function is not None and (function.cuda or other.cuda) and (function.trains or function.steps):
            return f"`{name}` from {show(target)} trains on CUDA"  # TD3's agent class: its `train()` steps
        if other.cuda and _moving_class(other, name):
            return f"`{name}` from {show(target)} copies to a CUDA device"  # SR3's `BaseModel.set_device`
    return None


def _moving_class(module: ModuleFacts, name: str) -> bool:
    """Is ``name`` a class of ``module`` with a method that copies to a device (SR3's `BaseModel`,
    whose `set_device(x)` is `x.to(self.device)`, the device `cuda` when GPUs are configured)?"""
    prefix = name + "."
    return any(method.moves for qualified, method in module.functions.items() if qualified.startswith(prefix))


def _star_cuda(path: Path, prefixes: dict[Path, dict[str, Path]], facts: dict[Path, ModuleFacts],
               show: Callable[[Path], str]) -> str | None:
    """A CUDA device a `from m import *` binds in the file: a module-level name of `m`, or of a
    module `m` star-imports in turn (`from data import *` in train.py, `from conf import *` in
    data.py, `device = torch.device("cuda:0" ...)` in conf.py). A configuration module's device
    is made to be used by the files that take all its names."""
    todo = [prefixes[path][prefix] for prefix in facts[path].star_imports if prefix in prefixes[path]]
    seen: set[Path] = set()
    while todo:
        target = todo.pop(0)
        if target in seen or target == path:
            continue
        seen.add(target)
        if facts[target].cuda_names:
            via = "" if target in prefixes[path].values() else " (through the star imports of the modules it star-imports)"
            return f"`{facts[target].cuda_names[0]}` from {show(target)} is a CUDA device{via}"
        todo.extend(prefixes[target][inner] for inner in facts[target].star_imports if inner in prefixes[target])
    return None


def _longest_prefix(qualified: str, modules: Mapping[str, object]) -> tuple[str, str] | None:
    """(module prefix, the rest) of `engine.train_one_epoch` for the modules known by prefix."""
    parts = qualified.split(".")
    for end in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in modules:
            return prefix, ".".join(parts[end:])
    return None


def _split(qualified: str, found: dict[str, Path]) -> tuple[Path, str] | None:
    hit = _longest_prefix(qualified, found)
    return (found[hit[0]], hit[1]) if hit is not None else None


def _cuda_reasons(facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]],
                  show: Callable[[Path], str]) -> dict[Path, str]:
    """Files that run on CUDA, with the reason; imported modules inherit it from their importers."""
    reasons: dict[Path, str] = {}
    for path, module in facts.items():
        reason = _direct_cuda(path, module, prefixes[path], facts, show) or _star_cuda(path, prefixes, facts, show)
        if reason is not None:
            reasons[path] = reason
    return _spread_to_imports(reasons, prefixes, lambda importer, _: f"{show(importer)}, which imports it, runs on CUDA")


def _spread_to_imports(seeds: dict[Path, T], prefixes: dict[Path, dict[str, Path]],
                       passed: Callable[[Path, T], T]) -> dict[Path, T]:
    """``seeds`` and the files they import, in turn, each with what ``passed`` makes of its
    importer and the importer's value (first in, first out: the nearest importer, the first in
    path order)."""
    found = dict(seeds)
    todo = deque(found)
    while todo:
        importer = todo.popleft()
        for target in prefixes[importer].values():
            if target not in found:
                found[target] = passed(importer, found[importer])
                todo.append(target)
    return found


def _layers_through_parts(facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]]
                          ) -> dict[Path, ModuleFacts]:
    """``facts`` with the layers that classes and factories build through another module's
    (`GCN` of models.py building `GraphConvolution` of layers.py, whose forward calls
    `torch.spmm`: sparse; improved-diffusion's `UNetModel` building `conv_nd(dims, ...)` of nn.py,
    which returns `nn.Conv2d`: convolutions, as the ConvNd a class of the file builds)."""
    changed = True
    for _ in range(3):  # a model, its block, the block's layer
        if not changed:
            break
        changed = False
        for path, module in facts.items():
            updated = {}
            for name, function in module.functions.items():
                found = {part: facts[hit[0]].functions.get(hit[1]) if (hit := _part(part, module, prefixes[path], facts)) else None
                         for part in function.parts}
                others = [other for other in found.values() if other is not None]
                # a star part no star-imported module defines is a local name (`x`, `self`), no part
                read = all(other is not None or part.startswith("*.") for part, other in found.items())
                dims = tuple(sorted(set(function.conv_dims).union(*(other.conv_dims for other in others))))
                sparse = function.sparse or any(other.sparse for other in others)
                rnn = function.rnn or any(other.rnn for other in others)
                matmul, matmuls = function.matmul, function.matmuls
                if read:  # every part read: its matrix products are known
                    matmul = function.matmul_but_parts or any(other.matmul for other in others)
                    matmuls = function.matmuls_but_parts or any(other.matmuls for other in others)
                if (dims, sparse, rnn, matmul, matmuls) != (function.conv_dims, function.sparse, function.rnn,
                                                            function.matmul, function.matmuls):
                    updated[name] = replace(function, conv_dims=dims, sparse=sparse, rnn=rnn, matmul=matmul, matmuls=matmuls)
            if updated:
                facts = {**facts, path: replace(module, functions={**module.functions, **updated})}
                changed = True
    return facts


def _part(part: str, module: ModuleFacts, prefixes: dict[str, Path], facts: dict[Path, ModuleFacts]
          ) -> tuple[Path, str] | None:
    """The module and name of a part a class builds: `layers.GraphConv` as imported, `*.DoubleConv`
    from the first module the file star-imports that defines it."""
    if not part.startswith("*."):
        return _split(part, prefixes)
    return next((hit for star in module.star_imports if (hit := _split(f"{star}{part[1:]}", prefixes)) is not None
                 and hit[1] in facts[hit[0]].functions), None)


def _imported_by(facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]],
                 marks: Callable[[ModuleFacts], bool], show: Callable[[Path], str]) -> dict[Path, str]:
    """The files that a file ``marks`` says something of imports, in turn: file -> that
    importer's file (the nearest one, the first in path order)."""
    marked = {path: show(path) for path, module in facts.items() if marks(module)}
    spread = _spread_to_imports(marked, prefixes, lambda _, shown: shown)
    return {path: shown for path, shown in spread.items() if path not in marked}


def _imported_by_another(facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]],
                         marks: Callable[[ModuleFacts], bool], show: Callable[[Path], str]) -> dict[Path, str]:
    """The files that a file ``marks`` says something of imports, in turn, whether or not they
    are marked themselves: file -> that importer's file (the first in path order)."""
    found: dict[Path, str] = {}
    for seed in sorted(path for path, module in facts.items() if marks(module)):
        for path, shown in _spread_to_imports({seed: show(seed)}, prefixes, lambda _, shown: shown).items():
            if path != seed:
                found.setdefault(path, shown)
    return found


def _calls_a_choice(facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]],
                    exported: dict[Path, ModuleFacts], chooses: Callable[[FunctionFacts], bool]) -> set[Path]:
    """The scripts (with a `__main__` block) that call a module-level function of another file
    that makes the process-wide choice ``chooses`` says, itself or through a helper of its module
    (nanoT5's `main.py` calling `setup_basics()`, re-exported by a package's star import, which
    calls `opti_flags()`, which sets `allow_tf32`)."""
    found: set[Path] = set()
    for path, module in facts.items():
        if not module.main_guard:
            continue
        for callee, slot, _ in module.arguments_given:
            hit = _split(callee, prefixes[path]) if slot == "#" and not callee.startswith("*") else None
            function = _through_stars(hit[0], hit[1], prefixes, exported) if hit is not None and "." not in hit[1] else None
            if function is not None and chooses(function):
                found.add(path)
                break
    return found


def _through_stars(target: Path, name: str, prefixes: dict[Path, dict[str, Path]], exported: dict[Path, ModuleFacts],
                   depth: int = 0) -> FunctionFacts | None:
    """The function ``name`` of the module ``target``, also one its star imports bind."""
    function = exported[target].functions.get(name)
    if function is not None or depth > 2:
        return function
    for inner in exported[target].star_imports:
        other = prefixes[target].get(inner)
        found = _through_stars(other, name, prefixes, exported, depth + 1) if other is not None else None
        if found is not None:
            return found
    return None


def _importing(facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]],
               marks: tuple[Callable[[ModuleFacts], bool], ...], show: Callable[[Path], str]) -> list[dict[Path, str]]:
    """For each of ``marks``, the files that import, in turn, a file it says something of: file ->
    the nearest such file (first in path order), not the file itself. The imports are followed
    once per file for all the marks."""
    found: list[dict[Path, str]] = [{} for _ in marks]
    marked = [{path for path, module in facts.items() if mark(module)} for mark in marks]
    if not any(marked):
        return found
    for path in facts:
        reached = _spread_to_imports({path: None}, prefixes, lambda _, value: value)
        for index, targets in enumerate(marked):
            hit = next((target for target in reached if target != path and target in targets), None) if targets else None
            if hit is not None:
                found[index][path] = show(hit)
    return found


def _entry_importers(runs: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]],
                     show: Callable[[Path], str]) -> dict[Path, tuple[str, ...]]:
    """The files the scripts of ``runs`` (those with a `__main__` block) import, in turn: file ->
    those scripts (as shown)."""
    found: dict[Path, set[str]] = {}
    for seed in sorted(path for path, module in runs.items() if module.main_guard):
        for path in _spread_to_imports({seed: None}, prefixes, lambda _, value: value):
            if path != seed:
                found.setdefault(path, set()).add(show(seed))
    return {path: tuple(sorted(scripts)) for path, scripts in found.items()}


def _imported_beside_a_trainer(runs: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]],
                               show: Callable[[Path], str]) -> dict[Path, str]:
    """The files that a script imports, in turn, beside a library that holds its training loop
    (vall-e's `train.py` reaches `utils/engines.py`, whose loop steps the engines, and the model
    package that defines `AR`): file -> that library's file. A library here has no `__main__`
    block: an evaluation script importing `train.py`, or a model file whose `__main__` block
    trains a toy, says nothing of the files beside it."""
    found: dict[Path, str] = {}
    for seed in sorted(runs):
        reached = _spread_to_imports({seed: show(seed)}, prefixes, lambda _, shown: shown)
        trainers = {path for path in reached if path != seed and path in runs and runs[path].trains
                    and not runs[path].main_guard}
        if trainers:
            for path in reached:
                if path != seed and path not in trainers:
                    found.setdefault(path, show(min(trainers)))
    return found


def _methods_called_elsewhere(module: ModuleFacts, path: Path, callers: dict[str, set[Path]]) -> tuple[str, ...]:
    """The methods of the file's classes that other files call (under `torch.no_grad()`, in a
    loop that steps an environment: ``callers``) on objects of a class they cannot name (not
    `forward`: `model.forward(x)` under no_grad says nothing of every module's forward)."""
    defined = {name.rpartition(".")[2] for name in module.functions if "." in name} - {"forward"}
    return tuple(sorted(name for name in defined if callers.get(name, set()) - {path}))


def is_test_file(path: Path) -> bool:
    """A test (`test_train.py`, `train_test.py`, `conftest.py`, anything in a `tests/` folder of
    the path as shown): its training loops exercise code, they are not the run."""
    return path.name.startswith("test_") or path.name.endswith("_test.py") or path.name == "conftest.py" \
        or any(part in ("tests", "test") for part in path.parent.parts)


def _run_options(facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]]
                 ) -> dict[Path, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]]:
    """The options of the scripts that run each file (see ``Links.options``): each script with a
    parser, its own or one a module it imports defines, hands its options to what it imports, in
    turn; a default the scripts reaching a file disagree on is unknown ("")."""
    reached: dict[Path, tuple[dict[str, set[str]], set[str]]] = {}
    for seed, module in facts.items():
        sources = [module, *(facts[target] for target in prefixes[seed].values())]
        given = [(dest, value) for source in sources for dest, value in source.options]
        if not given:
            continue
        holders = {name for source in sources for name in source.parsed_names}
        todo, seen = deque([seed]), {seed}
        while todo:
            path = todo.popleft()
            defaults, names = reached.setdefault(path, ({}, set()))
            for dest, value in given:
                defaults.setdefault(dest, set()).add(value)
            names |= holders
            for target in prefixes[path].values():
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
    return {path: (tuple(sorted((dest, values.pop() if len(values) == 1 else "") for dest, values in defaults.items())),
                   tuple(sorted(names))) for path, (defaults, names) in reached.items()}


def _picked_only(facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]]
                 ) -> dict[Path, tuple[tuple[str, str, tuple[str, ...]], ...]]:
    """The files the scanned scripts reach only through entries of option-indexed dicts (see
    ``Links.picked_by``): what the files no other file imports reach once the imports of the
    entries by their dicts' files are taken away is reached otherwise; each other file that an
    entry reaches gets that entry's (option, key)."""
    imports = {path: set(found.values()) for path, found in prefixes.items()}
    entries: list[tuple[str, str, tuple[str, ...], Path]] = []
    for path, module in facts.items():
        if not module.dispatches:
            continue
        picks = {qualified for _, pairs in module.dispatches for _, qualified in pairs}
        # a module the file also takes something else from (`Dataset_Pred` beside the dict's loaders) stays imported
        others = {target for _, qualified in module.imports if qualified not in picks
                  and (target := _file_of(qualified, prefixes[path])) is not None}
        for option, pairs in module.dispatches:
            keys = tuple(sorted(key for key, _ in pairs))
            for key, qualified in pairs:
                target = _file_of(qualified, prefixes[path])
                if target is not None and target not in others:
                    imports[path].discard(target)
                    entries.append((option, key, keys, target))
    if not entries:
        return {}
    imported = {target for found in prefixes.values() for target in found.values()}
    reached = _reached([path for path in facts if path not in imported], imports)
    picked: dict[Path, set[tuple[str, str, tuple[str, ...]]]] = {}
    for option, key, keys, target in entries:
        for path in _reached([target], imports):
            if path not in reached:
                picked.setdefault(path, set()).add((option, key, keys))
    return {path: tuple(sorted(pairs)) for path, pairs in picked.items()}


def _file_of(qualified: str, found: dict[str, Path]) -> Path | None:
    """The project file a qualified name is (a module: `models.DLinear`) or is defined in."""
    hit = found.get(qualified)
    return hit if hit is not None else (_split(qualified, found) or (None,))[0]


def _reached(starts: list[Path], imports: dict[Path, set[Path]]) -> set[Path]:
    """``starts`` and the files they import, in turn."""
    seen, todo = set(starts), deque(starts)
    while todo:
        for target in imports.get(todo.popleft(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def _called_functions(facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]],
                      calls: Callable[[ModuleFacts], tuple[str, ...]], *, constructors: bool = False
                      ) -> dict[Path, set[str]]:
    """Functions and methods of each file that another file calls in a certain way: the
    qualified names ``calls`` gives for each file (on every training step, under `no_grad`); with
    ``constructors``, only the `__init__` of the classes built that way."""
    hot: dict[Path, set[str]] = {}
    for path, module in facts.items():
        for qualified in calls(module):
            hit = _split(qualified, prefixes[path])
            if hit is None:
                continue
            target, name = _re_exported(*hit, facts, prefixes)
            if _is_class(facts[target], name):
                if constructors and f"{name}.__init__" in facts[target].functions:
                    hot.setdefault(target, set()).add(f"{name}.__init__")  # an object built there: its constructor runs
            elif name in facts[target].functions and not constructors:
                hot.setdefault(target, set()).add(name)
    return hot


def _re_exported(target: Path, name: str, facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]]
                 ) -> tuple[Path, str]:
    """Where a name a package re-exports lives (`algo.PPO.update` with `from .ppo import PPO` in
    `algo/__init__.py`: ppo.py's `PPO.update`), a few packages deep."""
    for _ in range(3):
        head, dot, rest = name.partition(".")
        if head in facts[target].functions or _is_class(facts[target], head):
            break
        imported = dict(facts[target].imports).get(head)
        hit = _split(imported, prefixes[target]) if imported is not None else None
        if hit is None:
            break
        target, name = hit[0], hit[1] + dot + rest
    return target, name


def _factory_forwards(facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]]) -> dict[Path, set[str]]:
    """The `forward` of the module classes of scanned files that a factory of another file builds
    and returns (`get_model()` returning `FastSpeech2(...).to(device), optimizer`; a static or
    class method returning its module's class, `FastComposerModel.from_pretrained(args)`), when a
    training loop calls the object the factory gave it."""
    hot: dict[Path, set[str]] = {}
    for path, module in facts.items():
        for qualified in module.forward_modules:
            hit = _split(qualified.removesuffix(".forward"), prefixes[path])
            factory = facts[hit[0]].functions.get(hit[1]) if hit is not None else None
            if factory is None or _is_class(facts[hit[0]], hit[1]):
                continue
            if "." in hit[1]:  # `FastComposerModel.from_pretrained(args)`: a method that builds its module's class
                if factory.returns and f"{factory.returns}.forward" in facts[hit[0]].functions:
                    hot.setdefault(hit[0], set()).add(f"{factory.returns}.forward")
                continue
            for part in factory.parts:
                built = _project_class(part, hit[0], facts, prefixes)
                if built is not None and f"{built[1]}.forward" in facts[built[0]].functions:
                    hot.setdefault(built[0], set()).add(f"{built[1]}.forward")
    return hot


def _handed_to_steps(facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]]) -> dict[Path, set[str]]:
    """Functions of each file handed to another file's function whose training loop calls that
    parameter every step (`train_step(..., forward_step_func=forward_step)`, Megatron's way)."""
    hot: dict[Path, set[str]] = {}
    for path, module in facts.items():
        for callee, slot, name in module.handed_functions:
            hit = _split(callee, prefixes[path])
            function = facts[hit[0]].functions.get(hit[1]) if hit is not None else None
            if function is None or not function.calls_params:
                continue
            param = (function.params[int(slot)] if int(slot) < len(function.params) else None) if slot.isdigit() else slot
            if param in function.calls_params:
                hot.setdefault(path, set()).add(name)
    return hot


def _loader_factories(facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]]
                      ) -> dict[Path, dict[str, tuple[bool, bool, bool, tuple[int, ...]]]]:
    """Functions of each file whose returned loader a training loop iterates: one of another
    file, or one of a function it is handed to (`train(args, trainloader, ...)` of a third file,
    whose loop iterates that parameter, every epoch or not); and which elements of the tuple
    they return are iterated (-1: the value itself)."""
    feeds: dict[Path, dict[str, tuple[bool, bool, bool, tuple[int, ...]]]] = {}

    def add(path: Path, qualified: str, uses: tuple[bool, bool, bool], position: int = -1) -> None:
        hit = _split(qualified, prefixes[path])
        if hit is None or hit[1] not in facts[hit[0]].functions:
            return
        found = feeds.setdefault(hit[0], {})
        old = found.get(hit[1], (False, False, False, ()))
        found[hit[1]] = (old[0] or uses[0], old[1] or uses[1], old[2] or uses[2], tuple(sorted({*old[3], position})))

    for path, module in facts.items():
        for qualified, per_epoch, uploads, position in module.loader_calls:
            add(path, qualified, (per_epoch, uploads, False), position)
        for maker, callee, slot, position in module.loader_hands:
            hit = _split(callee, prefixes[path])
            function = facts[hit[0]].functions.get(hit[1]) if hit is not None else None
            if function is None:
                continue
            params = function.params[1:] if function.params[:1] == ("self",) else function.params
            param = params[int(slot)] if slot.isdigit() and int(slot) < len(params) else slot
            if param in function.iterated:
                add(path, maker, (param in function.epochs, function.uploads, param in function.changes), position)
    return feeds


def _handed_objects(facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]]
                    ) -> Iterator[tuple[tuple[Path, str, str], ModuleFacts, str]]:
    """Objects of project classes that a file builds and hands to another file's module-level
    function or class constructor (`fit_one_epoch(model_train, ...)`, `get_data_loader(dataset,
    ...)`): ((that file, the function, the parameter), the facts of the class's module, the class)."""
    for path, module in facts.items():
        for maker, callee, slot, position in module.loader_hands:
            target, built = _split(callee, prefixes[path]), _split(maker, prefixes[path])
            if target is None or built is None or position != -1 or "." in target[1] \
                    or not _is_class(facts[built[0]], built[1]):
                continue
            params = _callable_params(facts[target[0]], target[1])
            if params is None or built[1] not in facts[built[0]].functions:
                continue
            param = params[int(slot)] if slot.isdigit() and int(slot) < len(params) else slot
            yield (target[0], target[1], param), facts[built[0]], built[1]


def _networks_handed(facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]]
                     ) -> dict[Path, tuple[tuple[str, str, bool, bool], ...]]:
    """The networks of project classes handed to each file's module-level functions and class
    constructors (see ``Links.networks``): a parameter handed networks of different kinds is left out."""
    kinds: dict[tuple[Path, str, str], set[tuple[bool, bool]]] = {}
    for where, module, name in _handed_objects(facts, prefixes):
        network = module.functions[name]
        kinds.setdefault(where, set()).add((bool(network.conv_dims), network.matmul))
    found: dict[Path, list[tuple[str, str, bool, bool]]] = {}
    for (path, function, param), seen in sorted(kinds.items()):
        if len(seen) == 1:
            found.setdefault(path, []).append((function, param, *next(iter(seen))))
    return {path: tuple(items) for path, items in found.items()}


def _moving_objects_handed(facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]]
                           ) -> dict[Path, tuple[tuple[str, str], ...]]:
    """The parameters of each file's module-level functions and class constructors that other
    files hand only objects of project classes whose methods copy to a device (see ``Links.on_device``)."""
    moving: dict[tuple[Path, str, str], set[bool]] = {}
    for where, module, name in _handed_objects(facts, prefixes):
        moving.setdefault(where, set()).add(any(
            method.moves or method.makes_on_device for qualified, method in module.functions.items()
            if qualified.startswith(name + ".")))
    found: dict[Path, list[tuple[str, str]]] = {}
    for (path, function, param), seen in sorted(moving.items()):
        if seen == {True}:
            found.setdefault(path, []).append((function, param))
    return {path: tuple(items) for path, items in found.items()}


def _kwargs_given(facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]]
                  ) -> dict[Path, tuple[tuple[str, str, str], ...]]:
    """What the calls of other files pass as `**kwargs` to each file's functions (see ``Links.kwargs``)."""
    given: dict[tuple[Path, str], dict[str, set[str]]] = {}
    unknown: set[tuple[Path, str]] = set()
    for path, module in facts.items():
        for callee, key, value in module.kwargs_given:
            hit = _split(callee, prefixes[path])
            if hit is None or hit[1] not in facts[hit[0]].functions:
                continue
            if key == "*":
                unknown.add(hit)
            else:
                given.setdefault(hit, {}).setdefault(key, set()).add(value)
    found: dict[Path, list[tuple[str, str, str]]] = {}
    for (target, function), keys in sorted(given.items()):
        if (target, function) in unknown:
            continue  # a call whose keys are unknown
        passed = [set(filter(None, listed.split(","))) for listed in keys.pop("#", ())]  # each call's keys
        found.setdefault(target, []).extend(
            (function, key, LEFT_OUT if any(key not in call for call in passed) else values.pop() if len(values) == 1
             else "") for key, values in sorted(keys.items()))
    return {path: tuple(items) for path, items in found.items()}


def _merged_kwargs(*found: dict[Path, tuple[tuple[str, str, str], ...]]) -> dict[Path, tuple[tuple[str, str, str], ...]]:
    """``Links.kwargs`` from dict literals splatted into calls and from keywords no parameter
    takes: a key both give differently is unknown ("")."""
    merged: dict[Path, dict[tuple[str, str], str]] = {}
    for items in found:
        for path, entries in items.items():
            for function, key, value in entries:
                known = merged.setdefault(path, {})
                known[(function, key)] = value if known.get((function, key), value) == value else ""
    return {path: tuple((function, key, value) for (function, key), value in sorted(entries.items()))
            for path, entries in merged.items()}


# The value of a `**kwargs` key that some call leaves out (audiolm's `get_dataloader(ds, **kwargs)`,
# given `num_workers=` by one trainer and not by three others): the callee's default holds there.
LEFT_OUT = "\0left out"


def _arguments_given(facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]],
                     exported: dict[Path, ModuleFacts]
                     ) -> tuple[dict[Path, tuple[tuple[str, str, str], ...]], dict[Path, tuple[tuple[str, str, str], ...]]]:
    """What the calls of other files pass to the parameters of each file's module-level
    functions (see ``Links.arguments``), also of a function a package's `__init__.py` imports
    from a module beside it (``_re_exported``) and of one a star import binds (``_star_names``);
    and, as ``Links.kwargs`` holds them, the keywords that no parameter takes, which go to the
    function's `**kwargs` (audiolm's `get_dataloader(ds, batch_size=..., num_workers=...)`)."""
    calls: dict[tuple[Path, str], list[tuple[str, ...]]] = {}  # the slots each call passes
    values: dict[tuple[Path, str], dict[str, set[str]]] = {}  # slot -> the values passed there
    for path, module in facts.items():
        found, star = prefixes[path], None
        for callee, slot, value in module.arguments_given:
            if callee.startswith("*"):  # a bare name a star import binds (`from ddpm_torch import *`)
                if star is None:
                    found = dict(prefixes[path])
                    star = _star_names(module, found, prefixes, exported, facts)[0]
                callee = star.get(callee[1:], "*")
            hit = _split(callee, found)
            hit = _re_exported(*hit, facts, prefixes) if hit is not None else None  # through a package's `__init__.py`
            if hit is None or "." in hit[1] or _callable_params(facts[hit[0]], hit[1]) is None:
                continue
            if slot == "#":
                calls.setdefault(hit, []).append(tuple(value.split(",")) if value else ())
            else:
                values.setdefault(hit, {}).setdefault(slot, set()).add(value)
    found: dict[Path, list[tuple[str, str, str]]] = {}
    extra: dict[Path, list[tuple[str, str, str]]] = {}
    for (target, function), slots in sorted(values.items()):
        if "*" in slots:
            found.setdefault(target, []).append((function, "*", ""))
            continue
        params = _callable_params(facts[target], function) or ()
        for index, param in enumerate(params):
            passed = [str(index) in call or param in call for call in calls.get((target, function), ())]
            if not any(passed):
                continue  # no call passes it: its default holds
            given = slots.get(str(index), set()) | slots.get(param, set())
            agreed = all(passed) and len(given) == 1
            found.setdefault(target, []).append((function, param, next(iter(given)) if agreed else ""))
        for key, given in sorted(slots.items()):  # keywords no parameter takes: the function's `**kwargs`
            if key.isdigit() or key in params:
                continue
            left_out = any(key not in call for call in calls.get((target, function), ()))
            extra.setdefault(target, []).append(
                (function, key, LEFT_OUT if left_out else next(iter(given)) if len(given) == 1 else ""))
    return {path: tuple(items) for path, items in found.items()}, {path: tuple(items) for path, items in extra.items()}


def _constructions(facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]], show: Callable[[Path], str]
                   ) -> dict[Path, set[tuple[str, str, tuple[str, ...], int, bool]]]:
    """The classes of each file that other files build, with what they pass (a class taken from a
    package's `__init__.py` that imports it from a module beside it counts for that module). What
    a test passes a class that the project's other files build too is left out: the runs build it
    their way (a test's `DGMR(visualize=True)` beside the training script's `DGMR()`)."""
    found: dict[Path, set[tuple[str, str, tuple[str, ...], int, bool]]] = {}
    tested: dict[Path, set[tuple[str, str, tuple[str, ...], int, bool]]] = {}
    for path, module in facts.items():
        for qualified, method, keywords, count, star in module.constructions:
            hit = _project_class(qualified, path, facts, prefixes)
            if hit is not None:
                kept = tested if is_test_file(Path(show(path))) else found
                kept.setdefault(hit[0], set()).add((hit[1], method, keywords, count, star))
    for path, built in tested.items():
        by_runs = {construction[0] for construction in found.get(path, ())}
        kept = {construction for construction in built if construction[0] not in by_runs}
        if kept:
            found.setdefault(path, set()).update(kept)
    return found


def _stepping_overrides(facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]]) -> dict[Path, set[str]]:
    """For each file, `Class.method` of its classes that a subclass in another file overrides
    with a method that takes a step (safe-rlhf's `SupervisedTrainer.train_step`, abstract there,
    defined by the DPO and reward trainers)."""
    found: dict[Path, set[str]] = {}
    for path, module in facts.items():
        for name, bases in module.class_bases:
            stepping = [key.split(".", 1)[1] for key, function in module.functions.items()
                        if key.startswith(name + ".") and function.steps]
            for base in bases if stepping else ():
                hit = _project_class(base, path, facts, prefixes)
                if hit is not None and hit[0] != path:
                    found.setdefault(hit[0], set()).update(f"{hit[1]}.{method}" for method in stepping)
    return found


def _gated_constructions(facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]]
                         ) -> dict[Path, set[tuple[str, tuple[str, ...]]]]:
    """For each file, its classes other files build and the flags each such construction needs."""
    found: dict[Path, set[tuple[str, tuple[str, ...]]]] = {}
    for path, module in facts.items():
        for qualified, gates in module.gated_constructions:
            hit = _project_class(qualified, path, facts, prefixes)
            if hit is not None:
                found.setdefault(hit[0], set()).add((hit[1], gates))
    return found


def _methods_used(facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]]) -> dict[Path, set[str]]:
    """The methods of each file's classes that other files call on objects they build
    (`Class.method`)."""
    found: dict[Path, set[str]] = {}
    for path, module in facts.items():
        for qualified, method in module.object_methods:
            hit = _project_class(qualified, path, facts, prefixes)
            if hit is not None:
                found.setdefault(hit[0], set()).add(f"{hit[1]}.{method}")
    return found


def _project_class(qualified: str, path: Path, facts: dict[Path, ModuleFacts], prefixes: dict[Path, dict[str, Path]]
                   ) -> tuple[Path, str] | None:
    """(its file, its name there) of a project class that ``path`` names by ``qualified`` (a
    class taken from a package's `__init__.py` that imports it from a module beside it counts
    for that module: ``_re_exported``)."""
    hit = _split(qualified, prefixes[path])
    if hit is None:
        return None
    target, name = _re_exported(*hit, facts, prefixes)
    return (target, name) if name in facts[target].functions else None


def _callable_params(module: ModuleFacts, name: str) -> tuple[str, ...] | None:
    """The parameters a call of the module-level function or class ``name`` fills (a class's
    `__init__` without `self`), None when it is neither or a class without its own `__init__`."""
    if _is_class(module, name):
        init = module.functions.get(f"{name}.__init__")
        return init.params[1:] if init is not None else None
    function = module.functions.get(name)
    return function.params if function is not None else None


def _is_class(module: ModuleFacts, name: str) -> bool:
    return any(other.startswith(name + ".") for other in module.functions)
