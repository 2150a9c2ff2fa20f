"""Reading and writing user files without losing a byte.

A file is kept as the raw bytes it was read from. libcst parses those bytes itself (it honours
the coding cookie and a UTF-8 BOM, and ``Module.bytes`` writes them back the same way), and
keeps every line ending as it found it. Writes are atomic: a temporary file in the same folder
gets the original's owner, group, extended attributes (POSIX ACLs among them) and permission
bits, is fsynced, then ``os.replace``s it.

Reads accept regular files only (a FIFO would block, ``/dev/zero`` never ends) and stop at a size
cap. A write is refused (``WriteRefused``, nothing written) for a read-only file (its owner may
not write it), when the owner, group or an extended attribute cannot be kept, for a symbolic link
whose target lies outside the folders the caller allows, and, when told what the file held when it
was read, if an editor saved something else in between (``FileChanged``). Any other symbolic link
is written through: its target gets the new content and the link stays a link.
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
from typing import Sequence


class SourceError(Exception):
    """A file that cannot be read as Python source; the message names the problem."""


class FileTooLarge(SourceError):
    """A file over the size cap (it was not read to its end)."""


class WriteRefused(OSError):
    """A file that was not written, on purpose: ``reason`` says why, ``str()`` adds the path."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.reason = reason


class FileChanged(WriteRefused):
    """The file on disk is no longer what was read: it was not written."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, "changed on disk while speedfix worked on it; not written (run speedfix again)")


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
                raise FileTooLarge(
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


def write_atomic(path: Path, data: bytes, *, expected: bytes | None = None, within: Sequence[Path] | None = None) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file, with
    the old one's owner, group, extended attributes and permission bits.

    Raises ``WriteRefused``, writing nothing, for a file that ``write_refusal`` refuses (``within``:
    the folders a symbolic link may lead into), and with ``expected`` (the bytes the file held when
    it was read) ``FileChanged`` if the file differs right before the replace. A symbolic link is
    followed: its target is replaced and the link is kept."""
    path = Path(path)
    reason = write_refusal(path, within)
    if reason is not None:
        raise WriteRefused(path, reason)
    path = _write_target(path)
    try:
        old: os.stat_result | None = path.stat()
    except FileNotFoundError:
        old = None
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".speedfix-tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if old is not None:
            reason = _keep_metadata(path, tmp_name, old)
            if reason is not None:
                raise WriteRefused(path, reason)
        if expected is not None and not _still(path, expected):
            raise FileChanged(path)
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise


def write_refusal(path: Path, within: Sequence[Path] | None = None) -> str | None:
    """Why ``path`` must not be rewritten (None: it may be): a symbolic link to a file outside the
    folders ``within`` (when given), or a read-only file: one its owner has no write permission on
    (root could write it anyway; a user who made it read-only wants it left alone)."""
    path = Path(path)
    try:
        target = _write_target(path)
        if within is not None and path.is_symlink() and not _inside(target, within):
            return f"a symbolic link to {target}, outside the project; not written (fix that file where it is)"
        mode = target.stat().st_mode
    except FileNotFoundError:
        return None
    if not mode & stat.S_IWUSR:
        return f"read-only (mode {stat.S_IMODE(mode):04o}); not written (make it writable to fix it)"
    return None


def _inside(target: Path, folders: Sequence[Path]) -> bool:
    real = os.path.realpath(target)
    for folder in folders:
        base = os.path.realpath(folder)
        try:
            if os.path.commonpath([real, base]) == base:
                return True
        except ValueError:  # another drive on Windows
            continue
    return False


def _keep_metadata(path: Path, tmp_name: str, old: os.stat_result) -> str | None:
    """Give the temporary file the owner, group, extended attributes and permission bits of
    ``path``; None when done, else why they cannot all be kept. The owner and group come first
    (changing them clears set-user-ID bits and file capabilities), the permission bits last (a
    POSIX ACL, an extended attribute, sets the group bits too)."""
    new = os.stat(tmp_name)
    if (new.st_uid, new.st_gid) != (old.st_uid, old.st_gid) and hasattr(os, "chown"):
        try:
            os.chown(tmp_name, old.st_uid, old.st_gid)
        except OSError:
            return (f"owned by user {old.st_uid}, group {old.st_gid}, which speedfix cannot give the rewritten file; "
                    "not written (run it as that user)")
    reason = _copy_xattrs(path, tmp_name)
    if reason is not None:
        return reason
    os.chmod(tmp_name, stat.S_IMODE(old.st_mode))
    return None


def _copy_xattrs(source: Path, target: str) -> str | None:
    """Copy the extended attributes of ``source`` to ``target`` (where the system has them)."""
    if not hasattr(os, "listxattr"):
        return None
    try:
        names = os.listxattr(source)
    except OSError:  # not supported by this file system: there are none to keep
        return None
    for name in names:
        try:
            value = os.getxattr(source, name)
        except OSError as exc:  # removed meanwhile, or not readable: it cannot be copied
            return f"its extended attribute {name} cannot be read ({exc.strerror or exc}); not written"
        try:
            os.setxattr(target, name, value)
        except OSError as exc:
            if _xattr(target, name) != value:  # unless the new file has it already (a default ACL)
                return f"its extended attribute {name} cannot be kept ({exc.strerror or exc}); not written"
    try:
        extra = set(os.listxattr(target)) - set(names)
    except OSError:
        extra = set()
    for name in sorted(extra):  # inherited by the new file (a folder's default ACL) but not on the old one
        try:
            os.removexattr(target, name)
        except OSError:
            pass
    return None


def _xattr(path: str, name: str) -> bytes | None:
    try:
        return os.getxattr(path, name)
    except OSError:
        return None


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
    path = printable(path)
    if path.startswith("/"):
        return path, path
    return f"a/{path}", f"b/{path}"


# C0 controls but tab, DEL, C1 controls, and the bidirectional overrides that reorder what a
# terminal shows ("Trojan source").
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def printable(text: str) -> str:
    """``text`` with its control characters written as escapes (``\\x1b``, ``\\n``), for a line
    a terminal or a log shows: a file name or a message that holds an ESC sequence or a newline
    must not repaint the screen or forge a line of the report."""
    return _CONTROL.sub(lambda match: _NAMED.get(match.group()) or ascii(match.group())[1:-1], text)
