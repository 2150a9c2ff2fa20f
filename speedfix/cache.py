"""A content-hash cache of scan results, so a second scan of an unchanged tree is near-instant.

One JSON file per (speedfix version, settings fingerprint) in ``.speedfix_cache/`` under the
project root: any change of version, configuration or rule selection starts a fresh cache.
Entries are keyed by path and validated by the SHA-256 of the file's bytes, so an edited file
is always re-analysed. The folder carries its own ``.gitignore``. A damaged cache file is
ignored, never an error.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from speedfix import __version__
from speedfix.source import write_atomic

CACHE_DIR = ".speedfix_cache"


def content_key(data: bytes, rule_codes: tuple[str, ...], details: bool) -> str:
    digest = hashlib.sha256(data)
    digest.update(repr((rule_codes, details)).encode())
    return digest.hexdigest()


class ScanCache:
    def __init__(self, root: Path, fingerprint: str) -> None:
        name = hashlib.sha256(f"{__version__}|{fingerprint}".encode()).hexdigest()[:16]
        self.folder = root / CACHE_DIR
        self.path = self.folder / f"scan-{__version__}-{name}.json"
        self.entries: dict[str, dict[str, Any]] = {}
        self.dirty = False
        try:
            loaded = json.loads(self.path.read_text(encoding="utf-8"))
            if isinstance(loaded, dict):
                self.entries = loaded
        except (OSError, ValueError):
            pass

    def get(self, path: Path, key: str) -> dict[str, Any] | None:
        entry = self.entries.get(str(path.resolve()))
        if entry is not None and entry.get("key") == key:
            return entry.get("result")
        return None

    def put(self, path: Path, key: str, result: dict[str, Any]) -> None:
        self.entries[str(path.resolve())] = {"key": key, "result": result}
        self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            ignore = self.folder / ".gitignore"
            if not ignore.exists():
                ignore.write_text("# Created by speedfix\n*\n", encoding="utf-8")
            write_atomic(self.path, json.dumps(self.entries).encode("utf-8"))
        except OSError:
            pass  # a read-only tree still scans, just without a cache


def cache_enabled(flag: bool) -> bool:
    return flag and not os.environ.get("SPEEDFIX_NO_CACHE")
