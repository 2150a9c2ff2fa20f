"""LSP's framing of JSON-RPC messages, read from input nobody vouches for (speedfix.jsonrpc)."""

from __future__ import annotations

import json

import pytest

from speedfix.jsonrpc import Frames, Oversized


def body(number: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": number, "method": "shutdown"}).encode()


def framed(data: bytes, header: bytes = b"Content-Length: %d\r\n\r\n") -> bytes:
    return header % len(data) + data


def cut(stream: bytes, step: int | None = None, limit: int = 1000) -> list[object]:
    """The frames of ``stream``, fed whole or ``step`` bytes at a time."""
    frames = Frames(limit)
    if step is None:
        return frames.feed(stream)
    found: list[object] = []
    for start in range(0, len(stream), step):
        found += frames.feed(stream[start:start + step])
    return found


@pytest.mark.parametrize("step", [None, 1, 7])
def test_frames_are_cut_however_the_bytes_arrive(step):
    stream = framed(body(1)) + framed(body(2), b"Content-Length: %d\r\nContent-Type: application/vscode-jsonrpc\r\n\r\n")
    assert cut(stream, step) == [body(1), body(2)]


@pytest.mark.parametrize(
    "header",
    [b"content-length: %d\n\n", b"CONTENT-LENGTH:%d\r\n\r\n", b"GET / HTTP/1.1\r\nnonsense\r\n\r\nContent-Length: %d\r\n\r\n"],
    ids=["lower case, \\n line ends", "upper case, no space", "garbage before"],
)
def test_headers_pygls_did_not_read(header):
    assert cut(framed(body(1), header) + framed(body(2))) == [body(1), body(2)]


def test_a_header_glued_to_garbage_is_found():
    assert cut(b"}{garbage" + framed(body(1)) + framed(body(2))) == [body(1), body(2)]


def test_an_oversized_body_is_reported_with_its_id_and_never_buffered():
    big = b'{"jsonrpc": "2.0", "id": 7, "method": "x", "params": "' + b"a" * 5000 + b'"}'
    frames = Frames(limit=1000)
    found = frames.feed(framed(big)[:2000])
    assert len(frames.buffer) <= 2000
    found += frames.feed(framed(big)[2000:] + framed(body(2)))
    (oversized, after) = found
    assert isinstance(oversized, Oversized) and oversized.size == len(big) and oversized.request_id() == 7
    assert after == body(2)  # the next message is read as usual


def test_a_length_that_lies_loses_only_its_own_message():
    assert cut(b"Content-Length: 99999999999999\r\n\r\n" + body(1) + framed(body(2)))[1:] == [body(2)]


def test_garbage_without_line_ends_is_not_kept():
    frames = Frames()
    frames.feed(b"x" * 1_000_000)
    assert len(frames.buffer) < 100_000
    assert frames.feed(b"\n" + framed(body(1))) == [body(1)]
