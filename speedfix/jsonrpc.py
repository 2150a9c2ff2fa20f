"""JSON-RPC messages on standard input, framed as LSP frames them, for `speedfix server`.

pygls reads standard input itself, and trusts it: a ``Content-Length`` of 100 GB is allocated
(a MemoryError ends the server), a header it does not expect (``content-length`` in lower case,
lines ended by ``\\n`` alone, garbage glued to the next header) loses the messages after it, and a
body that is not JSON, or whose parameters do not fit the method (a position on line -1), is
logged and never answered. Here:

- ``Frames`` cuts the byte stream into message bodies: header names in any case, any line ending,
  a ``Content-Length`` found at the end of a garbage line, and a body over ``MAX_MESSAGE`` never
  read into memory (its first bytes tell the request's id, to answer it);
- ``Inbox`` reads in a thread, so that the server learns that input is waiting (``arrived``)
  while it analyses: the editor's next keystroke cancels work on a text that is already stale,
  and everything read so far is handled before any analysis, so that 30 quick edits are
  analysed once, in their last version;
- ``error_frame`` is the answer to a request that cannot be handled (JSON-RPC's error codes).
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
from dataclasses import dataclass
from typing import BinaryIO, Union

# A 10 MB file sent whole on every change (full sync) is about 11 MB of JSON; 64 MiB leaves room.
MAX_MESSAGE = 64 * 1024 * 1024
# A header line longer than this is garbage: it is dropped rather than buffered.
MAX_HEADER_LINE = 64 * 1024
# How much of a skipped body is kept to find the request's id.
HEAD_KEPT = 4096

# JSON-RPC error codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602

_LENGTH = re.compile(rb"content-length[ \t]*:[ \t]*(\d+)[ \t]*$", re.IGNORECASE)
_ID = re.compile(rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")')


@dataclass(frozen=True)
class Oversized:
    """A body over the size limit, skipped; ``head``: its first bytes."""

    size: int
    head: bytes

    def request_id(self) -> int | str | None:
        """The id of the request, when its first bytes say it."""
        match = _ID.search(self.head)
        return json.loads(match.group(1)) if match else None


Frame = Union[bytes, Oversized]


class Frames:
    """Cuts a stream of bytes into message bodies: ``feed`` what was read, get the bodies it
    completes.

    A body over the limit is not read: it is reported (``Oversized``, with its first bytes) and
    the bytes after its header are read as headers again, as garbage, up to the next
    ``Content-Length`` (JSON bodies are one line, so the next header is found at the end of the
    body's line). A length that lies is survived the same way."""

    def __init__(self, limit: int = MAX_MESSAGE) -> None:
        self.limit = limit
        self.buffer = bytearray()
        self.length: int | None = None  # of the next body, once its header is read
        self.in_body = False

    def feed(self, data: bytes) -> list[Frame]:
        self.buffer += data
        frames: list[Frame] = []
        while True:
            if self.in_body:
                assert self.length is not None
                if len(self.buffer) < self.length:
                    return frames
                frames.append(bytes(self.buffer[: self.length]))
                del self.buffer[: self.length]
                self.in_body, self.length = False, None
                continue
            end = self.buffer.find(b"\n")
            if end < 0:
                if len(self.buffer) > MAX_HEADER_LINE:  # garbage: keep only where a header may start
                    del self.buffer[:-64]
                return frames
            line = bytes(self.buffer[:end]).rstrip(b"\r")
            del self.buffer[: end + 1]
            if line.strip():
                match = _LENGTH.search(line)  # at the end of a garbage line too: `}Content-Length: 52`
                if match:
                    self.length = int(match.group(1))
            elif self.length is not None and self.length > self.limit:
                frames.append(Oversized(self.length, bytes(self.buffer[:HEAD_KEPT])))
                self.length = None
            elif self.length is not None:
                self.in_body = True


class Inbox:
    """Reads frames from ``stream`` in a thread; ``batch()`` returns everything read so far."""

    END = None  # the stream ended

    def __init__(self, stream: BinaryIO, limit: int = MAX_MESSAGE) -> None:
        self.fd = stream.fileno()
        self.frames = Frames(limit)
        self.queue: queue.Queue[list[Frame] | None] = queue.Queue()
        self.arrived = threading.Event()  # set while read frames wait to be handled
        self.ended = False
        threading.Thread(target=self._read, name="speedfix-stdin", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 1024 * 1024)
            except OSError:
                data = b""
            if not data:
                self.queue.put(self.END)
                self.arrived.set()
                return
            frames = self.frames.feed(data)
            if frames:
                self.queue.put(frames)
                self.arrived.set()

    def batch(self) -> list[Frame] | None:
        """The frames read so far, waiting for one if there are none; None at the end of input."""
        if self.ended:
            return None
        first = self.queue.get()
        self.arrived.clear()  # before draining: a frame put after this sets it again
        frames: list[Frame] = []
        pending: list[list[Frame] | None] = [first]
        while True:
            try:
                pending.append(self.queue.get_nowait())
            except queue.Empty:
                break
        for item in pending:
            if item is self.END:
                self.ended = True
                break
            frames.extend(item)
        return frames if frames or not self.ended else None


def frame(message: dict[str, object]) -> bytes:
    """``message`` with its LSP header."""
    body = json.dumps(message).encode("utf-8")
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def error_frame(request_id: int | str | None, code: int, message: str) -> bytes:
    """The answer to a request that cannot be handled (``request_id`` None: unknown)."""
    return frame({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})
