"""Reading and writing user files without losing a byte.

A file is kept as the raw bytes it was read from. libcst parses those bytes itself (it honours
the coding cookie and a UTF-8 BOM, and ``Module.bytes`` writes them back the same way), and
keeps every line ending as it found it. Writes are atomic: a temporary file in the same folder,
fsync, then ``os.replace`` with the original's permission bits.
"""

from __future__ import annotations

import io
import os
import stat
import tempfile
import tokenize
from dataclasses import dataclass
from pathlib import Path


class SourceError(Exception):
    """A file that cannot be read as Python source; the message names the problem."""


@dataclass(frozen=True)
class SourceFile:
    path: Path
    data: bytes
    text: str
    encoding: str

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()


def decode_source(data: bytes) -> tuple[str, str]:
    """Decode Python source bytes as the interpreter would: BOM, coding cookie, else UTF-8."""
    if b"\0" in data[:8192]:
        raise SourceError("binary file (contains NUL bytes)")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:  # undecodable first lines, an unknown codec, or a BOM + other cookie
        if "invalid or missing encoding declaration" in str(exc):
            raise SourceError("not valid UTF-8 text and no coding declaration") from None
        raise SourceError(f"cannot determine the encoding: {exc.msg}") from None
    try:
        return data.decode(encoding), encoding
    except (UnicodeDecodeError, LookupError) as exc:
        raise SourceError(f"not valid {encoding.upper() if encoding.startswith('utf') else encoding} text: {exc}") from None


def read_source(path: Path) -> SourceFile:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SourceError(f"cannot read file: {exc.strerror or exc}") from None
    text, encoding = decode_source(data)
    return SourceFile(path=path, data=data, text=text, encoding=encoding)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file."""
    path = Path(path)
    try:
        mode: int | None = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = None
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".speedfix-tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise


def diff_labels(path: str) -> tuple[str, str]:
    """Diff header names: git's `a/`, `b/` before a relative path; an absolute path as it is."""
    if path.startswith("/"):
        return path, path
    return f"a/{path}", f"b/{path}"
