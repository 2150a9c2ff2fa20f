"""The JSON files a DeepSpeed script names, and where they are read from.

A config file is read from beside the script, else from the current folder (where `python
train.py` is run) or below them, never through `..`, an absolute path or a link out of those
folders, and never bigger than ``MAX_BYTES`` (``locate``). The scan keys a script's cached
results by the files it names too (``named_json_files``), without parsing it: this module needs
no syntax tree.
"""

from __future__ import annotations

import re
from pathlib import Path

MAX_BYTES = 1024 * 1024
# A script that can pass a DeepSpeed config has one of these (SF905 runs only there too).
MARKERS = (b"deepspeed", b"DeepSpeed", b"ds_config")
_JSON_NAME = re.compile(rb"""["']([^"'\r\n]{1,200}\.json)["']""")


def named_json_files(script: Path, data: bytes) -> list[Path]:
    """The JSON files a DeepSpeed script's string literals name that exist where ``locate`` finds them:
    what its findings depend on besides its own bytes (other scripts' data files are not read)."""
    if not any(marker in data for marker in MARKERS):
        return []
    found = []
    for match in _JSON_NAME.finditer(data):
        path = locate(script, match.group(1).decode("utf-8", "replace"))
        if path is not None:
            found.append(path)
    return found


def locate(script: Path, name: str) -> Path | None:
    """``name`` in the script's folder or the current one (or below them), a regular file of at
    most ``MAX_BYTES``; never an absolute path, a `..` or a link that leads out of that folder."""
    candidate = Path(name)
    if candidate.is_absolute() or ".." in candidate.parts:
        return None  # another machine's path, or outside the project: not ours to read
    for folder in (script.parent, Path.cwd()):
        path = folder / candidate
        try:
            if not path.is_file() or path.stat().st_size > MAX_BYTES:
                continue
            if not path.resolve().is_relative_to(folder.resolve()):
                continue  # a link out of the folder
            return path
        except (OSError, RuntimeError):  # RuntimeError: a symlink loop
            continue
    return None
