"""The methods ``dataclasses`` generates, kept compiled between runs as bytecode is.

``@dataclass`` writes each class's ``__init__``, ``__repr__``, ``__eq__``... as source text and
compiles it with ``exec`` when the class is defined, every time the module is imported: bytecode
(``.pyc``) keeps the module's own code, not these. libcst defines about two hundred node classes
this way, and compiling their thousand methods was half of the time a scan took to load the
engine (0.15 s of 0.3 s on a 2-core machine, measured with Python 3.11, which compiles each
method on its own).

``generated_code_kept()`` keeps the compiled code of those texts in one file beside this
module's bytecode (where Python would write ``generated.<tag>.pyc``), named by the interpreter's
cache tag and checked against its bytecode magic number, so that another Python never reads it.
The texts are the keys: a text compiles to the same code whoever asks. Like bytecode, it is
written only when Python may write bytecode (not under ``PYTHONDONTWRITEBYTECODE``), atomically,
and only when a text was new; an unreadable or foreign file is ignored and rewritten. It is
trusted as the bytecode beside it is: whoever can write one can write the other.
"""

from __future__ import annotations

import builtins
import dataclasses
import hashlib
import importlib.util
import marshal
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from types import CodeType
from typing import Any, Iterator

_SUFFIX = ".functions"


def store_path() -> Path | None:
    """Where the compiled texts are kept; None where this Python keeps no bytecode."""
    try:
        compiled = importlib.util.cache_from_source(__file__)
    except (NotImplementedError, ValueError):  # no cache tag
        return None
    return Path(compiled).with_suffix(_SUFFIX)


def _key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _read(path: Path) -> dict[bytes, CodeType]:
    try:
        data = path.read_bytes()
    except OSError:
        return {}
    magic = importlib.util.MAGIC_NUMBER
    if not data.startswith(magic):
        return {}
    try:
        table = marshal.loads(data[len(magic):])
    except (EOFError, ValueError, TypeError):
        return {}
    if not isinstance(table, dict):
        return {}
    return {key: code for key, code in table.items() if isinstance(key, bytes) and isinstance(code, CodeType)}


def _write(path: Path, table: dict[bytes, CodeType]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as stream:
                stream.write(importlib.util.MAGIC_NUMBER + marshal.dumps(table))
            os.chmod(temporary, Path(__file__).stat().st_mode & 0o666)  # as Python sets a .pyc's
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError:
        pass  # a read-only installation: compiled again next time, as without bytecode


class _Kept:
    """``exec`` for ``dataclasses``: a text it was given before runs from its compiled code."""

    def __init__(self, known: dict[bytes, CodeType]) -> None:
        self.known = known
        self.used: dict[bytes, CodeType] = {}
        self.new = False

    def __call__(self, source: Any, globals: Any = None, locals: Any = None) -> None:
        if isinstance(source, str):
            key = _key(source)
            code = self.known.get(key)
            if code is None:
                # Compiled as `exec(text)` compiles it from inside `dataclasses` (no
                # `from __future__` flags there): not inheriting this module's.
                code = compile(source, "<string>", "exec", dont_inherit=True)
                self.new = True
            self.used[key] = code
            source = code
        builtins.exec(source, globals, locals)


@contextmanager
def generated_code_kept(path: Path | None = None) -> Iterator[None]:
    """Within the block, the methods of classes that ``@dataclass`` makes come from the kept
    compiled code (``path``, by default ``store_path()``); what was compiled anew is kept when
    the block ends."""
    path = store_path() if path is None else path
    if path is None or hasattr(dataclasses, "exec"):  # no place, or someone else's `exec` there
        yield
        return
    kept = _Kept(_read(path))
    dataclasses.exec = kept  # type: ignore[attr-defined]  # the module's global shadows the builtin
    try:
        yield
    finally:
        if vars(dataclasses).get("exec") is kept:
            del dataclasses.exec  # type: ignore[attr-defined]
        if kept.new and not sys.dont_write_bytecode:
            _write(path, kept.used)
