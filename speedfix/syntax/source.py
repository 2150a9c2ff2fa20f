"""Reading and writing user files without losing a byte.

A file is kept as the raw bytes it was read from. libcst parses those bytes itself (it honours
the coding cookie and a UTF-8 BOM, and ``Module.bytes`` writes them back the same way), and
keeps every line ending as it found it. Writes are atomic: a temporary file in the same folder,
fsync, then ``os.replace`` with the original's permission bits.

Reads accept regular files only (a FIFO would block, ``/dev/zero`` never ends) and stop at a size
cap. A write can be told what the file held when it was read; right before the replace it reads
the file again and refuses (``FileChanged``) if an editor saved something in between. A symbolic
link is written through: its target gets the new content and the link stays a link.
"""

from __future__ import annotations

import errno
import io
import os
import re
import stat
import tempfile
import tokenize
from dataclasses import dataclass
from pathlib import Path


class SourceError(Exception):
    """A file that cannot be read as Python source; the message names the problem."""


class FileChanged(OSError):
    """The file on disk is no longer what was read: it was not written."""


# The default of the `max-file-size-mb` setting: a bigger file is skipped, never read.
DEFAULT_MAX_FILE_SIZE = 10 * 1024 * 1024
_MB = 1024 * 1024
_READ_BLOCK = 1024 * 1024


@dataclass(frozen=True)
class SourceFile:
    path: Path
    data: bytes
    text: str
    encoding: str

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()


# A line as Python ends lines (\r\n, \r or \n; not form feeds or \u2028, where str.splitlines
# would also cut), its ending kept.
LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")


def split_lines(text: str) -> list[str]:
    """``text`` split after each line ending, endings kept."""
    return LINE.findall(text)


def decode_source(data: bytes) -> tuple[str, str]:
    """Decode Python source bytes as the interpreter would: BOM, coding cookie, else UTF-8."""
    if b"\0" in data:  # anywhere: a NUL after the first 8 KB makes it just as binary
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


def read_source(path: Path, max_bytes: int | None = DEFAULT_MAX_FILE_SIZE) -> SourceFile:
    data = read_bytes(path, max_bytes)
    text, encoding = decode_source(data)
    return SourceFile(path=path, data=data, text=text, encoding=encoding)


def size_limit_text(max_bytes: int) -> str:
    return f"{round(max_bytes / _MB, 3):g} MB"


def read_bytes(path: Path, max_bytes: int | None = DEFAULT_MAX_FILE_SIZE) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (None: any size); SourceError else.

    The file is opened without blocking (a FIFO would wait for a writer) and checked with
    ``fstat`` on the open descriptor, so a file swapped for something else after discovery is
    caught too; the read stops one byte past the cap, in case the file grows (or lies)."""
    try:
        kind = _special_kind(os.stat(path).st_mode)
        if kind is not None:  # a socket cannot even be opened: say what it is first
            raise SourceError(f"skipped: not a regular file ({kind})")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SourceError("skipped: symbolic link loop") from None
        raise SourceError(f"cannot read file: {exc.strerror or exc}") from None
    try:
        kind = _special_kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise SourceError(f"skipped: not a regular file ({kind})")
        chunks: list[bytes] = []
        total = 0
        while True:
            block = os.read(fd, _READ_BLOCK)
            if not block:
                break
            chunks.append(block)
            total += len(block)
            if max_bytes is not None and total > max_bytes:
                raise SourceError(
                    f"skipped: larger than {size_limit_text(max_bytes)} (raise `max-file-size-mb` or pass --max-file-size-mb)"
                )
        return b"".join(chunks)
    except OSError as exc:
        raise SourceError(f"cannot read file: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _special_kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    for test, name in (
        (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a plain file"


def write_atomic(path: Path, data: bytes, *, expected: bytes | None = None) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file.

    With ``expected`` (the bytes the file held when it was read), the file is read again right
    before the replace and ``FileChanged`` is raised, writing nothing, if it differs. A symbolic
    link is followed: its target is replaced and the link is kept."""
    path = _write_target(Path(path))
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
        if expected is not None and not _still(path, expected):
            raise FileChanged(f"{path}: changed on disk after speedfix read it; not written (run speedfix again)")
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise


def _write_target(path: Path) -> Path:
    """The file a write to ``path`` must replace: the final target of a symbolic link."""
    if not path.is_symlink():
        return path
    try:
        return path.resolve(strict=True)
    except RuntimeError:  # Python < 3.13 reports a loop this way
        raise OSError(errno.ELOOP, "symbolic link loop", str(path)) from None


def _still(path: Path, expected: bytes) -> bool:
    """Does ``path`` still hold exactly ``expected``?"""
    try:
        current = read_bytes(path, len(expected))
    except SourceError:  # grown past the old size, deleted, or replaced by something else
        return False
    return current == expected


def diff_labels(path: str) -> tuple[str, str]:
    """Diff header names: git's `a/`, `b/` before a relative path; an absolute path as it is."""
    if path.startswith("/"):
        return path, path
    return f"a/{path}", f"b/{path}"
