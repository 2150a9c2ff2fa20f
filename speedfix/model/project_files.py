"""The files of a project that a script's analysis reads besides the script: its configuration.

Frameworks keep a run's settings outside the script: hydra and LightningCLI YAML, DeepSpeed
JSON, Accelerate config files, the command lines of launch scripts, the torch a project pins.
``ProjectFiles`` is the one way an analysis reads them, and it reads only inside the project:

- only below a *root*: the scan's root folder, the current folder, the script's own folder
  (whichever contain the script); a path is resolved first, so neither `..` nor a symbolic link
  leads out of them;
- only regular files of at most ``MAX_BYTES``, read without blocking (``read_bytes``);
- nothing is imported or executed: the callers parse what they get as data.

Every file looked at (read, listed, or found missing) is recorded in ``inputs`` with a digest
of what was seen, so that the scan cache can tell when a script's findings are stale: a result
is reused only while every input is unchanged (``inputs_unchanged``). ``problems`` holds what
could not be read (too big, a link out, not text), for the report's notes.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, TypeVar

from speedfix.syntax.source import SourceError, read_bytes

MAX_BYTES = 1024 * 1024
# A file or folder with one of these marks the top of a project (where the walk up stops).
PROJECT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg", ".project-root")
_ABSENT = "-"
_LISTING = "listing:"  # the key of a folder's listing in ``inputs``
T = TypeVar("T")
_SKIPPED = frozenset({"node_modules", "venv", "env", "site-packages", "build", "dist"})


@dataclass(frozen=True)
class Location:
    """A span in a file other than the script: 1-based line and column, end exclusive; the
    text of its line (a `# noqa` there suppresses the finding)."""

    path: Path
    line: int
    column: int
    end_line: int
    end_column: int
    line_text: str = ""

    def shown(self, relative_to: Path | None = None) -> str:
        """`configs/trainer/default.yaml:12`, relative to ``relative_to`` when below it."""
        path = self.path
        if relative_to is not None:
            try:
                path = self.path.relative_to(relative_to)
            except ValueError:
                pass
        return f"{path.as_posix()}:{self.line}"


@dataclass
class ProjectFiles:
    """Reads a script's project files inside its roots (see the module docstring)."""

    script: Path
    roots: tuple[Path, ...] = ()
    inputs: dict[str, str] = field(default_factory=dict)  # path -> digest of what was seen
    problems: list[str] = field(default_factory=list)
    _texts: dict[Path, str | None] = field(default_factory=dict, repr=False)
    _inside: dict[Path, bool] = field(default_factory=dict, repr=False)

    @classmethod
    def for_script(cls, script: Path, roots: tuple[Path, ...] = ()) -> ProjectFiles:
        """The reader for ``script``: its own folder is always a root; of the others, those
        that hold the script (the scan's root, the current folder)."""
        script = Path(os.path.abspath(script))
        kept = [script.parent]
        for root in roots:
            root = Path(os.path.abspath(root))
            if _below(script, root) and root not in kept:
                kept.append(root)
        return cls(script, tuple(kept))

    @property
    def folder(self) -> Path:
        return self.script.parent

    @cached_property
    def scope(self) -> tuple[Path, ...]:
        """The roots, as far as what lies inside them goes: the outermost one alone when it holds
        the others, links resolved (as ``for_script`` makes them, unless a link leads a root
        out), so that the scripts of every folder of a project share what a scan keeps."""
        outermost = min(self.roots, key=lambda r: len(r.parts))
        nested = all(_below(root, outermost) and _below(_real(root), _real(outermost)) for root in self.roots)
        return (outermost,) if nested else self.roots

    def top(self) -> Path:
        """The project's top folder: going up from the script's folder, the first folder with a
        project marker (`.git`, `pyproject.toml`, ...), never above the outermost root."""
        outermost = min(self.roots, key=lambda r: len(r.parts))
        return _top(self.folder, outermost)

    def folders_up(self) -> list[Path]:
        """The script's folder and those above it, up to ``top()``."""
        top = self.top()
        found = [self.folder]
        while found[-1] != top and found[-1].parent != found[-1]:
            found.append(found[-1].parent)
        return found

    # ------------------------------------------------------------------ finding files
    def resolve(self, name: str, base: Path | None = None) -> Path | None:
        """``name`` (relative to ``base``, the script's folder by default) as a path inside a
        root, or None: an absolute path, or one that leads out through `..` or a link."""
        if not name or "\0" in name:
            return None
        candidate = Path(name).expanduser() if name.startswith("~") else Path(name)
        if candidate.is_absolute():
            return None  # another machine's path, or outside the project: not ours to read
        path = Path(os.path.normpath((base or self.folder) / candidate))
        if not self.inside(path):
            return None
        return path

    def inside(self, path: Path) -> bool:
        """Is ``path`` (followed through links) below one of the roots?"""
        found = self._inside.get(path)
        if found is None:
            found = self._inside[path] = kept_for_scan(("inside", self.scope, path), lambda: self._inside_roots(path))
        return found

    def _inside_roots(self, path: Path) -> bool:
        real = kept_for_scan(("real", path), lambda: Path(os.path.realpath(path)))
        return any(_below(path, root) and _below(real, _real(root)) for root in self.roots)

    def recorded(self, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()`` (which reads this project's files), once per scan for every script with
        the same roots (within ``listings_kept``); each script records the files it looked at
        and their problems as if it had computed it itself."""
        if _KEPT is None:
            return compute()
        full = ("recorded", self.scope, key)
        if full not in _KEPT:
            outer, problems = self.inputs, len(self.problems)
            self.inputs = {}  # what compute() looks at, each file recorded even when seen before
            try:
                value = compute()
            finally:
                read, self.inputs = self.inputs, outer
            _KEPT[full] = (value, read, self.problems[problems:])
        value, read, problems_seen = _KEPT[full]
        self.inputs.update(read)
        self.problems.extend(problem for problem in problems_seen if problem not in self.problems)
        return value

    def find(self, name: str, bases: tuple[Path, ...] = ()) -> Path | None:
        """The first existing file ``name`` relative to one of ``bases`` (default: the script's
        folder, then the current folder), inside the roots."""
        for base in bases or (self.folder, Path.cwd()):
            path = self.resolve(name, base)
            if path is not None and self.is_file(path):
                return path
        return None

    def is_file(self, path: Path) -> bool:
        """Is ``path`` a readable project file? (Recorded either way: its contents, or that it
        is missing.)"""
        if not kept_for_scan(("is file", path), lambda: _is_file(path)):
            self.inputs.setdefault(str(path), _ABSENT)
            return False
        return self.text(path) is not None

    def listing(self, folder: Path, suffixes: tuple[str, ...] = ()) -> list[Path]:
        """The regular files of ``folder`` (sorted; with one of ``suffixes`` if given)."""
        key = _LISTING + "\0".join((str(folder), *suffixes))
        digest, paths = kept_for_scan(key, lambda: _files(folder, suffixes)) if self.inside(folder) else (_digest(b""), [])
        self.inputs[key] = digest
        return list(paths)

    def note(self, path: Path, message: str) -> None:
        """Say in the report that a project file could not be used, and why."""
        self.problems.append(f"{display_path(path)}: {message}")

    def subfolders(self, folder: Path) -> list[Path]:
        """The folders in ``folder`` (sorted, inside the roots; hidden ones and virtual
        environments left out), recorded like a listing."""
        key = _LISTING + str(folder) + "\0/"
        digest, found = kept_for_scan(key, lambda: _subfolders(folder)) if self.inside(folder) else (_digest(b""), [])
        self.inputs[key] = digest
        # below a folder inside the roots, only a link can lead out
        return [path for path, link in found if not link or self.inside(path)]

    # ------------------------------------------------------------------ reading
    def quiet_text(self, path: Path) -> str | None:
        """``text``, without a note in the report when the file cannot be read: for a file read
        only to look for a word, where an unreadable one (a data set's large JSON) is passed over."""
        problems, seen = len(self.problems), path in self._texts
        text = self.text(path)
        if not seen:
            del self.problems[problems:]
        return text

    def marked_above(self) -> bool:
        """Is there a project marker (`.git`, `pyproject.toml`, ...) in a folder above the
        outermost root? Then the project goes on beyond what the scan may read."""
        outermost = min(self.roots, key=lambda r: len(r.parts))
        return kept_for_scan(("marked above", outermost), lambda: any(
            (folder / marker).exists() for folder in outermost.parents for marker in PROJECT_MARKERS))

    def text(self, path: Path) -> str | None:
        """The text of a project file, or None (missing, outside, too big, not UTF-8: the
        reason is in ``problems`` unless the file is simply missing)."""
        kept = _KEPT.get(("text", self.scope, path)) if _KEPT is not None else None
        if kept is not None:  # read already in this scan: recorded again (see ``recorded``)
            self.inputs[str(path)], problems, text = kept
            if path not in self._texts:
                self.problems.extend(problems)
                self._texts[path] = text
            return text
        if path in self._texts:
            return self._texts[path]
        problems_before = len(self.problems)
        text = None
        if not self.inside(path):
            self.note(path, "not read, it lies outside the project (a link or `..`)")
            self.inputs[str(path)] = _ABSENT
        else:
            try:
                data = read_bytes(path, MAX_BYTES)
            except SourceError as exc:
                self.inputs[str(path)] = _ABSENT
                if path.exists():
                    self.note(path, str(exc))
            else:
                self.inputs[str(path)] = _digest(data)
                try:
                    text = data.decode("utf-8-sig")
                except UnicodeDecodeError:
                    self.note(path, "not read, it is not UTF-8 text")
        self._texts[path] = text
        if _KEPT is not None:
            _KEPT[("text", self.scope, path)] = (self.inputs[str(path)], self.problems[problems_before:], text)
        return text


def inputs_unchanged(inputs: dict[str, str], seen: dict[str, str] | None = None) -> bool:
    """Do the recorded inputs still hold what they held? ``seen``: digests computed earlier in
    this run, by path (several scripts share a project's files)."""
    memo = seen if seen is not None else {}
    for path, digest in inputs.items():
        if path not in memo:
            memo[path] = current_digest(path)
        if memo[path] != digest:
            return False
    return True


def current_digest(path: str) -> str:
    """What ``ProjectFiles`` would record for ``path`` now (a listing: its folder and suffixes)."""
    if path.startswith(_LISTING):
        folder, *suffixes = path[len(_LISTING):].split("\0")
        if suffixes == ["/"]:  # the subfolders
            names = _folders(Path(folder))
        else:
            names = _names(Path(folder), tuple(suffixes))
        return _digest("\n".join(names).encode())
    try:
        return _digest(read_bytes(Path(path), MAX_BYTES))
    except SourceError:
        return _ABSENT


def display_path(path: Path) -> str:
    """Paths relative to the current folder when they are below it (as ruff prints them)."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if relative.startswith("..") else relative


# Within one scan (``listings_kept``), a folder is listed and a file read once for all the scripts
# that look at it: each script's launch commands and configs are looked for in the same folders.
_KEPT: dict[Hashable, Any] | None = None


@contextmanager
def listings_kept() -> Iterator[None]:
    """Keep the folder listings and file texts that ``ProjectFiles`` reads until the block ends
    (a scan reads each project's files as they are when it starts; every script still records
    them in its ``inputs`` for the scan cache, and their problems in its notes)."""
    global _KEPT
    outer = _KEPT
    if outer is None:
        _KEPT = {}
    try:
        yield
    finally:
        _KEPT = outer


def kept_for_scan(key: Hashable, compute: Callable[[], T]) -> T:
    """``compute()``, once per scan within ``listings_kept`` (a folder's listing, a path's real
    path, what a project file's text says: what does not depend on the script that asks)."""
    if _KEPT is None:
        return compute()
    if key not in _KEPT:
        _KEPT[key] = compute()
    return _KEPT[key]


def _top(folder: Path, outermost: Path) -> Path:
    """The first folder with a project marker going up from ``folder``, never above
    ``outermost``; once per folder in a scan (the scripts of a project share their parents)."""
    def find() -> Path:
        if folder == outermost or any((folder / marker).exists() for marker in PROJECT_MARKERS):
            return folder
        if not _below(folder.parent, outermost) or folder.parent == folder:
            return folder
        return _top(folder.parent, outermost)

    return kept_for_scan(("top", folder, outermost), find)


def _files(folder: Path, suffixes: tuple[str, ...]) -> tuple[str, list[Path]]:
    """The digest of ``folder``'s names (with one of ``suffixes``) and its regular files among them."""
    names = _names(folder, suffixes)
    return _digest("\n".join(names).encode()), [folder / name for name in names if (folder / name).is_file()]


def _subfolders(folder: Path) -> tuple[str, list[tuple[Path, bool]]]:
    """The digest of ``folder``'s folder names and each folder with whether it is a link."""
    names = _folders(folder)
    return _digest("\n".join(names).encode()), [(folder / name, os.path.islink(folder / name)) for name in names]


def _folders(folder: Path) -> list[str]:
    """The sorted names of the folders in ``folder``, hidden ones and environments left out."""
    try:
        with os.scandir(folder) as entries:
            return sorted(entry.name for entry in entries if not entry.name.startswith((".", "_"))
                          and entry.name not in _SKIPPED and entry.is_dir())
    except OSError:
        return []


def _names(folder: Path, suffixes: tuple[str, ...]) -> list[str]:
    """The sorted names in ``folder`` that end with one of ``suffixes`` (any, without)."""
    try:
        return sorted(name for name in os.listdir(folder) if not suffixes or name.endswith(suffixes))
    except OSError:
        return []


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:
        return False


def _below(path: Path, folder: Path) -> bool:
    depth = len(path.parts) - len(folder.parts)  # ``folder in path.parents`` built every parent
    return path == folder or (depth > 0 and path.parents[depth - 1] == folder)


@lru_cache(maxsize=64)
def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))
