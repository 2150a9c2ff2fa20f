"""Which files a scan reads.

Directories are walked in sorted order without following symlinked folders; version-control
folders, virtual environments (any folder holding ``pyvenv.cfg``), caches and build output are
skipped, as are ``exclude`` patterns from the configuration. Files named on the command line
are always read (that is how a pre-commit hook passes them), whatever their extension.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from speedfix.config import Settings

SOURCE_SUFFIXES = (".py", ".ipynb")
SKIPPED_DIRS = frozenset(
    {
        ".git", ".hg", ".svn", ".bzr", "__pycache__", ".venv", "venv", ".env", ".tox", ".nox",
        ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis", ".ipynb_checkpoints",
        ".eggs", "build", "dist", "_build", "site-packages", "node_modules", "__pypackages__",
        ".speedfix_cache", ".speedfix-bench", ".direnv", "buck-out",
    }
)


@dataclass(frozen=True)
class Target:
    path: Path
    explicit: bool  # named on the command line


class MissingPath(Exception):
    pass


def _excluded(relative: str, name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(relative, p) or fnmatch.fnmatch(name, p) for p in patterns)


def iter_targets(paths: list[Path], settings: Settings, ignored_by_git: set[Path] | None = None) -> Iterator[Target]:
    """Files to scan, in a stable order. Raises MissingPath for a path that does not exist."""
    seen: set[Path] = set()
    for path in paths:
        if not path.exists() and not path.is_symlink():
            raise MissingPath(f"{path}: no such file or directory")
        if path.is_dir():
            for file in _walk(path, settings, ignored_by_git or set()):
                key = file.resolve()
                if key not in seen:
                    seen.add(key)
                    yield Target(file, explicit=False)
        else:
            key = path.resolve()
            if settings.force_exclude and _excluded_file(path, settings):
                continue
            if key not in seen:
                seen.add(key)
                yield Target(path, explicit=True)


def _walk(top: Path, settings: Settings, ignored_by_git: set[Path]) -> Iterator[Path]:
    root = settings.root.resolve()
    found: list[Path] = []
    for folder, dirnames, filenames in os.walk(top, followlinks=False):
        base = Path(folder)
        kept = []
        for name in sorted(dirnames):
            child = base / name
            if name in SKIPPED_DIRS or (child / "pyvenv.cfg").exists() or child.is_symlink():
                continue
            if name.endswith(".egg-info") or child.resolve() in ignored_by_git:
                continue
            if settings.exclude and _excluded(_rel(child, root), name, settings.exclude):
                continue
            kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            if not name.endswith(SOURCE_SUFFIXES):
                continue
            file = base / name
            if file.resolve() in ignored_by_git:
                continue
            if settings.exclude and _excluded(_rel(file, root), name, settings.exclude):
                continue
            found.append(file)
    yield from sorted(found)


def _excluded_file(path: Path, settings: Settings) -> bool:
    """With --force-exclude, a file named on the command line (as pre-commit passes them) is
    skipped when a directory walk would have skipped it."""
    relative = _rel(path, settings.root.resolve())
    if settings.exclude and any(
        _excluded(relative, part, settings.exclude) or fnmatch.fnmatch(relative, p.rstrip("/*") + "/*")
        for part in Path(relative).parts for p in settings.exclude
    ):
        return True
    return any(part in SKIPPED_DIRS for part in Path(relative).parts[:-1])


def _rel(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()
