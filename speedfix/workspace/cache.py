"""A content-hash cache of scan results, so a second scan of an unchanged tree is near-instant.

One JSON file per (speedfix version and build, settings fingerprint) in ``.speedfix_cache/``
under the project root: any change of version, configuration or rule selection starts a fresh
cache, and so does a new build of the same version (``pip install .`` of an updated clone, an
edited checkout): the build is the size and time of each of speedfix's modules.
Entries are keyed by path and validated by the SHA-256 of the file's bytes and of what the other
files of the project tell it (``Links.digest()``), so an edited file is always re-analysed, and
so is every file whose findings depend on it (``engine.py`` when ``config.py`` stops saying
``DEVICE = "cuda"``). The project facts of each file are cached beside its result, validated by
its bytes alone. The folder carries its own ``.gitignore``. A damaged cache file (bad JSON,
or JSON of another shape) is ignored and rewritten, never an error. A cache folder or file that
is a symbolic link is never followed: the scan warns and runs without a cache, so it cannot
write outside the project.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from speedfix import __version__
from speedfix.engine.catalog import rules_folders
from speedfix.syntax.source import SourceError, read_bytes, write_atomic
from speedfix.workspace.config import real_path

CACHE_DIR = ".speedfix_cache"


def file_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def content_key(data_digest: str, rule_codes: tuple[str, ...], details: bool, links_digest: str = "") -> str:
    """The key of a file's result: its bytes (``file_digest``), the rules, and the digest of
    what the other files of the project tell it."""
    return hashlib.sha256(repr((data_digest, rule_codes, details, links_digest)).encode()).hexdigest()


class ScanCache:
    def __init__(self, root: Path, fingerprint: str, warn: Callable[[str], None] | None = None) -> None:
        name = hashlib.sha256(f"{__version__}|{_build()}|{fingerprint}".encode()).hexdigest()[:16]
        self.folder = root / CACHE_DIR
        self.path = self.folder / f"scan-{__version__}-{name}.json"
        self.entries: dict[str, dict[str, Any]] = {}
        self.dirty = False
        self.refused = _outside_reason(self.folder, self.path)
        if self.refused is not None:
            (warn or _warn)(f"warning: {self.refused}; the scan cache is neither read nor written")
            return
        try:
            loaded = json.loads(read_bytes(self.path, _MAX_CACHE_BYTES))
        except (SourceError, ValueError, RecursionError):  # missing, damaged, nested too deeply, or not a file: start afresh
            return
        if isinstance(loaded, dict):  # valid JSON of another shape is as good as no cache
            self.entries = {k: v for k, v in loaded.items() if isinstance(k, str) and isinstance(v, dict)}

    def get(self, path: Path, key: str) -> dict[str, Any] | None:
        entry = self.entries.get(str(real_path(path)))
        if entry is not None and entry.get("key") == key and isinstance(entry.get("result"), dict):
            return entry["result"]
        return None

    def put(self, path: Path, key: str, result: dict[str, Any]) -> None:
        self.entries.setdefault(str(real_path(path)), {}).update(key=key, result=result)
        self.dirty = True

    def get_facts(self, path: Path, data_digest: str) -> dict[str, Any] | None:
        """The project facts of a file whose bytes hash to ``data_digest``."""
        entry = self.entries.get(str(real_path(path)))
        if entry is not None and entry.get("facts_key") == data_digest and isinstance(entry.get("facts"), dict):
            return entry["facts"]
        return None

    def put_facts(self, path: Path, data_digest: str, facts: dict[str, Any] | None) -> None:
        self.entries.setdefault(str(real_path(path)), {}).update(facts_key=data_digest, facts=facts)
        self.dirty = True

    def get_record(self, name: str, key: str) -> Any:
        """What ``put_record`` kept under ``name`` with the same ``key`` (None: nothing)."""
        entry = self.entries.get(_RECORD + name)
        return entry.get("record") if entry is not None and entry.get("key") == key else None

    def put_record(self, name: str, key: str, record: Any) -> None:
        """Keep a result of the whole scan (not of one file) under ``name``."""
        self.entries[_RECORD + name] = {"key": key, "record": record}
        self.dirty = True

    def save(self) -> None:
        if not self.dirty or self.refused is not None:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            if _outside_reason(self.folder, self.path) is not None:  # appeared while scanning
                return
            ignore = self.folder / ".gitignore"
            if not ignore.exists() and not ignore.is_symlink():
                ignore.write_text("# Created by speedfix\n*\n", encoding="utf-8")
            write_atomic(self.path, json.dumps(self.entries).encode("utf-8"))
        except OSError:
            pass  # a read-only tree still scans, just without a cache


_RECORD = "\0"  # the entries of whole-scan records start with it (no path does)

# A cache file bigger than this is damaged or not ours: it is ignored and rewritten.
_MAX_CACHE_BYTES = 1024 * 1024 * 1024


@lru_cache(maxsize=1)
def _build() -> str:
    """The digest of the size and modification time of every module of this speedfix (the rules
    included): results cached by another build of the same version are not reused."""
    import speedfix

    found: list[str] = []
    todo = [*speedfix.__path__, *rules_folders()]
    seen: set[str] = set()
    while todo:
        folder = os.path.realpath(todo.pop())
        if folder in seen:
            continue
        seen.add(folder)
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False) and not entry.name.startswith((".", "__pycache__")):
                todo.append(entry.path)
            elif entry.name.endswith(".py"):
                try:
                    info = entry.stat()
                except OSError:
                    continue
                found.append(f"{entry.path}\0{info.st_size}\0{info.st_mtime_ns}")
    return hashlib.sha256("\n".join(sorted(found)).encode()).hexdigest()


def _outside_reason(folder: Path, path: Path) -> str | None:
    """Why the cache must not be used: a symbolic link (or something else that is not a plain
    folder and file) would make the scan read and write outside the project."""
    for item, what in ((folder, "folder"), (path, "file")):
        if item.is_symlink():
            return f"{item} is a symbolic link (to {os.readlink(item)}), not a {what} of the project"
        if item.exists() and not (item.is_dir() if what == "folder" else item.is_file()):
            return f"{item} is not a plain {what}"
    return None


def _warn(message: str) -> None:
    sys.stderr.write(message + "\n")


def cache_enabled(flag: bool) -> bool:
    return flag and not os.environ.get("SPEEDFIX_NO_CACHE")
