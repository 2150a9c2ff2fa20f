"""Which files a scan reads.

Directories are walked in sorted order without following symlinked folders; version-control
folders, virtual environments (any folder holding ``pyvenv.cfg``), caches and build output are
skipped, as are files git ignores (``respect-gitignore``, on by default) and ``exclude`` patterns
from the configuration. Files named on the command line are always read (that is how a pre-commit
hook passes them), whatever their extension, unless ``--force-exclude`` is given, or unless they
are plainly not Python: a launch script or a configuration file (``NOT_PYTHON_SUFFIXES``) is not
parsed as code (the scan says so in a note); the scripts it runs read it for their settings.
"""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from speedfix.syntax.source import SourceError, read_bytes
from speedfix.workspace.config import Settings, real_path

SOURCE_SUFFIXES = (".py", ".ipynb")
# Named on the command line, these are skipped rather than parsed as Python (`scan train.py run.sh`).
NOT_PYTHON_SUFFIXES = (
    ".sh", ".bash", ".zsh", ".slurm", ".json", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".txt", ".md", ".rst",
)
SKIPPED_DIRS = frozenset(
    {
        ".git", ".hg", ".svn", ".bzr", "__pycache__", ".venv", "venv", ".env", ".tox", ".nox",
        ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis", ".ipynb_checkpoints",
        ".eggs", "build", "dist", "_build", "site-packages", "node_modules", "__pypackages__",
        ".speedfix_cache", ".speedfix-bench", ".direnv", "buck-out",
    }
)


# Folders that hold superseded code by their name (`old/train.py` beside `train.py`): their files
# are scanned for what other files import from them, and their own findings are left out unless
# a file outside such a folder imports them, or they are named on the command line.
SUPERSEDED_DIRS = frozenset(
    {"old", "legacy", "deprecated", "archive", "archived", "obsolete", "outdated", "backup", "backups", "unused"}
)


def superseded_folder(path: Path, folders: list[Path]) -> str | None:
    """The first folder below the scanned folder holding ``path`` (the deepest of ``folders``)
    whose name says superseded code (``SUPERSEDED_DIRS``), as a relative path (`old/`), or None."""
    holders = [folder for folder in folders if path.is_relative_to(folder)]
    if not holders:
        return None
    parts = path.relative_to(max(holders, key=lambda root: len(root.parts))).parts[:-1]
    for index, part in enumerate(parts):
        if part.lower() in SUPERSEDED_DIRS:
            return "/".join(parts[: index + 1]) + "/"
    return None


@dataclass(frozen=True)
class Target:
    path: Path
    explicit: bool  # named on the command line


class MissingPath(Exception):
    pass


def _excluded(relative: str, name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(relative, p) or fnmatch.fnmatch(name, p) for p in patterns)


def iter_targets(paths: list[Path], settings: Settings, skipped: list[Path] | None = None) -> Iterator[Target]:
    """Files to scan, in a stable order. Raises MissingPath for a path that does not exist.
    Files named on the command line that are not Python go to ``skipped``."""
    seen: set[Path] = set()
    for path in paths:
        if not path.exists() and not path.is_symlink():
            raise MissingPath(f"{path}: no such file or directory")
        if path.is_dir():
            files = list(_walk(path, settings))
            if settings.respect_gitignore:
                ignored = git_ignored(path, files)
                files = [file for file in files if file not in ignored]
            for file in files:
                key = real_path(file)
                if key not in seen:
                    seen.add(key)
                    yield Target(file, explicit=False)
        else:
            key = real_path(path)
            if settings.force_exclude and _excluded_file(path, settings):
                continue
            if path.suffix.lower() in NOT_PYTHON_SUFFIXES:
                if skipped is not None and key not in seen:
                    skipped.append(path)
                seen.add(key)
                continue
            if key not in seen:
                seen.add(key)
                yield Target(path, explicit=True)


def git_ignored(top: Path, files: list[Path]) -> set[Path]:
    """The files git ignores (.gitignore, .git/info/exclude, the global excludes file), asked
    once per folder argument; nothing outside a git work tree or without git."""
    if not files:
        return set()
    try:
        result = subprocess.run(
            ["git", "-C", str(top), "check-ignore", "--no-index", "--stdin", "-z"],
            input=b"\0".join(os.fsencode(real_path(file)) for file in files),
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return set()
    if result.returncode not in (0, 1):  # 128: not a git work tree
        return set()
    ignored = {Path(os.fsdecode(item)) for item in result.stdout.split(b"\0") if item}
    return {file for file in files if real_path(file) in ignored}


def _walk(top: Path, settings: Settings) -> Iterator[Path]:
    root = real_path(settings.root)
    found: list[Path] = []
    for folder, dirnames, filenames in os.walk(top, followlinks=False):
        base = Path(folder)
        kept = []
        for name in sorted(dirnames):
            child = base / name
            if name in SKIPPED_DIRS or (child / "pyvenv.cfg").exists() or child.is_symlink():
                continue
            if name.endswith(".egg-info"):
                continue
            if settings.exclude and _excluded(_rel(child, root), name, settings.exclude):
                continue
            kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            if not name.endswith(SOURCE_SUFFIXES):
                continue
            file = base / name
            if settings.exclude and _excluded(_rel(file, root), name, settings.exclude):
                continue
            found.append(file)
    yield from sorted(found)


_PACKAGING = re.compile(rb"^\[(?:project|tool\.poetry|build-system)\]", re.MULTILINE)


def in_distributed_package(path: Path) -> bool:
    """Is ``path`` a module of a package the project distributes (its folder has an
    `__init__.py`, and a folder above it a `setup.py`, a `setup.cfg` or a `pyproject.toml` with
    a `[project]` table): its users may import any of its modules."""
    folder = path.parent
    if not (folder / "__init__.py").is_file():
        return False
    for above in [folder, *folder.parents][:12]:
        if (above / "setup.py").is_file() or (above / "setup.cfg").is_file():
            return True
        pyproject = above / "pyproject.toml"
        if pyproject.is_file():
            try:
                if _PACKAGING.search(read_bytes(pyproject, 1024 * 1024)):
                    return True
            except SourceError:
                pass
        if (above / ".git").exists():
            return False
    return False


def _excluded_file(path: Path, settings: Settings) -> bool:
    """With --force-exclude, a file named on the command line (as pre-commit passes them) is
    skipped when a directory walk would have skipped it."""
    relative = _rel(path, real_path(settings.root))
    if settings.exclude and any(
        _excluded(relative, part, settings.exclude) or fnmatch.fnmatch(relative, p.rstrip("/*") + "/*")
        for part in Path(relative).parts for p in settings.exclude
    ):
        return True
    return any(part in SKIPPED_DIRS for part in Path(relative).parts[:-1])


def _rel(path: Path, root: Path) -> str:
    try:
        return real_path(path).relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def is_scanned(output: Path, paths: list[Path], settings: Settings) -> bool:
    """Is ``output`` one of the files a scan of ``paths`` reads (so that writing a report over
    it would destroy an input)? Symbolic links and relative spellings count as the same file."""
    wanted = real_path(output)
    if not output.name.endswith(SOURCE_SUFFIXES):  # a folder walk finds sources only: no second walk
        return any(real_path(path) == wanted for path in paths if not path.is_dir())
    try:
        return any(real_path(target.path) == wanted for target in iter_targets(paths, settings))
    except MissingPath:
        return False  # the scan itself reports it
