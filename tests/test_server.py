"""`speedfix server`: speak LSP (JSON-RPC with Content-Length framing) to the real process."""

from __future__ import annotations

import json
import queue
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from typer.testing import CliRunner

from speedfix.cli import app
from speedfix.commands.scan import scan_paths
from speedfix.workspace.config import resolve_settings

pytest.importorskip("pygls")

ROOT = Path(__file__).resolve().parent.parent
SD = ROOT / "fixtures" / "sd.py"
TIMEOUT = 60.0  # seconds; generous so that a busy machine cannot fail the test


class Client:
    """A minimal LSP client: requests, notifications, and a queue of what the server sends."""

    def __init__(self, cwd: Path, stderr: Path) -> None:
        self._stderr = stderr.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "speedfix", "server"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, cwd=cwd,
        )
        self.messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.pending: list[dict[str, Any]] = []  # read, not yet asked for
        self._next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        stream = self.process.stdout
        assert stream is not None
        while True:
            length = None
            while True:  # headers, up to an empty line
                line = stream.readline()
                if not line:
                    self.messages.put(None)
                    return
                if not line.strip():
                    break
                name, _, value = line.decode("ascii").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            assert length is not None
            self.messages.put(json.loads(stream.read(length)))

    def send(self, message: dict[str, Any]) -> None:
        self.raw(framed(message))

    def raw(self, data: bytes) -> None:
        """``data`` in one write: the server reads it all at once."""
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def next_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def answer(self, number: int) -> dict[str, Any]:
        return self.wait_for(lambda m: m.get("id") == number and "method" not in m)

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        self.send({"method": method, "params": params or {}})

    def wait_for(self, accept: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The first message ``accept`` takes (earlier ones kept); answers server requests."""
        for index, message in enumerate(self.pending):
            if accept(message):
                return self.pending.pop(index)
        while True:
            try:
                message = self.messages.get(timeout=TIMEOUT)
            except queue.Empty:
                raise AssertionError(f"no answer from the server in {TIMEOUT} s") from None
            if message is None:
                raise AssertionError("the server closed its output")
            if "method" in message and "id" in message:  # a request to the client
                self.send({"id": message["id"], "result": None})
            if accept(message):
                return message
            self.pending.append(message)

    def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        number = self.next_id()
        self.send({"id": number, "method": method, "params": params or {}})
        answer = self.answer(number)
        assert "error" not in answer, answer
        return answer["result"]

    def diagnostics(self, uri: str, version: int | None = None) -> list[dict[str, Any]]:
        message = self.wait_for(
            lambda m: m.get("method") == "textDocument/publishDiagnostics"
            and m["params"]["uri"] == uri
            and (version is None or m["params"].get("version") == version)
        )
        return message["params"]["diagnostics"]

    def open(self, path: Path, text: str | None = None) -> list[dict[str, Any]]:
        uri = path.as_uri()
        text = path.read_text(encoding="utf-8") if text is None else text
        self.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}})
        return self.diagnostics(uri, 1)

    def stop(self) -> int:
        """shutdown, exit, and the process's exit status."""
        assert self.request("shutdown") is None
        self.notify("exit")
        try:
            return self.process.wait(timeout=TIMEOUT)
        finally:
            self._stderr.close()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._stderr.close()


def framed(message: dict[str, Any]) -> bytes:
    body = json.dumps({"jsonrpc": "2.0", **message}).encode("utf-8")
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def start(folder: Path) -> Client:
    client = Client(folder, folder / "server.stderr")
    result = client.request("initialize", {"processId": None, "rootUri": folder.as_uri(), "capabilities": {}})
    assert result["serverInfo"]["name"] == "speedfix"
    capabilities = result["capabilities"]
    assert capabilities["codeActionProvider"]["codeActionKinds"] == ["quickfix", "source.fixAll.speedfix"]
    client.notify("initialized")
    return client


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    client = start(tmp_path_factory.mktemp("lsp"))
    yield client
    client.kill()


@pytest.fixture
def script(tmp_path: Path) -> Path:
    """A copy of fixtures/sd.py in a folder with no configuration."""
    path = tmp_path / "sd.py"
    shutil.copyfile(SD, path)
    return path


def apply_edits(text: str, edits: list[dict[str, Any]]) -> str:
    """Apply LSP text edits (all relative to ``text``; characters in UTF-16 units, lines ended
    by \n, \r\n or \r only), as an editor does."""
    starts = [0, *(match.end() for match in re.finditer(r"\r\n|\r|\n", text))]

    def offset(position: dict[str, int]) -> int:
        if position["line"] >= len(starts):
            return len(text)
        start = starts[position["line"]]
        units = 0
        while units < position["character"] and start < len(text):
            units += 2 if ord(text[start]) > 0xFFFF else 1
            start += 1
        return start

    for edit in sorted(edits, key=lambda e: offset(e["range"]["start"]), reverse=True):
        start, end = offset(edit["range"]["start"]), offset(edit["range"]["end"])
        text = text[:start] + edit["newText"] + text[end:]
    return text


def codes(diagnostics: list[dict[str, Any]]) -> list[tuple[str, int, int]]:
    return sorted((d["code"], d["range"]["start"]["line"], d["range"]["start"]["character"]) for d in diagnostics)


def run_apply(path: Path, *args: str) -> str:
    """The text `speedfix apply` writes for ``path`` (on a copy)."""
    copy = path.with_name(f"applied_{path.name}")
    shutil.copyfile(path, copy)
    result = CliRunner().invoke(app, ["apply", str(copy), *args])
    assert result.exit_code in (0, 1) and isinstance(result.exception, (SystemExit, type(None))), result.output
    return copy.read_text(encoding="utf-8")


def finding_range(diagnostics: list[dict[str, Any]], code: str) -> dict[str, Any]:
    return next(d for d in diagnostics if d["code"] == code)["range"]


def test_diagnostics_on_open_are_the_scan_findings(client: Client, script: Path) -> None:
    diagnostics = client.open(script)
    scanned = scan_paths([script], resolve_settings([script]), use_cache=False)
    assert codes(diagnostics) == sorted((f.code, f.line - 1, f.column - 1) for f in scanned.findings)
    assert {"SF102", "SF103", "SF104", "SF203", "SF301", "SF401", "SF501"} <= {d["code"] for d in diagnostics}
    pin = next(d for d in diagnostics if d["code"] == "SF102")
    assert pin["source"] == "speedfix"
    assert pin["severity"] == 2  # warning
    assert pin["range"]["start"] == {"line": 141, "character": 19}
    assert pin["codeDescription"]["href"].startswith("https://")
    assert "pin_memory" in pin["message"]


def test_quick_fix_is_the_fix_apply_writes(client: Client, script: Path) -> None:
    diagnostics = client.open(script)
    uri = script.as_uri()
    where = finding_range(diagnostics, "SF102")
    actions = client.request(
        "textDocument/codeAction",
        {"textDocument": {"uri": uri}, "range": where, "context": {"diagnostics": []}},
    )
    fix = next(a for a in actions if a["title"].startswith("SF102"))
    assert fix["kind"] == "quickfix" and fix["isPreferred"] is True
    assert fix["diagnostics"][0]["code"] == "SF102"
    fixed = apply_edits(script.read_text(encoding="utf-8"), fix["edit"]["changes"][uri])
    assert "pin_memory=True" in fixed
    assert fixed == run_apply(script, "--select", "SF102")

    # An unsafe fix is offered, marked, and never preferred.
    unsafe = client.request(
        "textDocument/codeAction",
        {"textDocument": {"uri": uri}, "range": finding_range(diagnostics, "SF401"), "context": {"diagnostics": []}},
    )
    fused = next(a for a in unsafe if a["title"].startswith("SF401"))
    assert fused["title"].endswith("(unsafe)") and fused["isPreferred"] is False


def test_fixes_sharing_an_import_rewrite_go_together(client: Client, script: Path) -> None:
    # Both SF203 fixes rewrite `from torch.cuda.amp import GradScaler, autocast`: fixing the
    # GradScaler alone would leave `autocast(enabled=...)` calling torch.amp's autocast wrongly.
    diagnostics = client.open(script)
    uri = script.as_uri()
    actions = client.request(
        "textDocument/codeAction",
        {"textDocument": {"uri": uri}, "range": finding_range(diagnostics, "SF203"), "context": {"diagnostics": []}},
    )
    (amp,) = [a for a in actions if a["title"].startswith("SF203")]
    assert "1 more SF203" in amp["title"] and len(amp["diagnostics"]) == 2
    fixed = apply_edits(script.read_text(encoding="utf-8"), amp["edit"]["changes"][uri])
    assert fixed == run_apply(script, "--select", "SF203")


def test_fix_all_is_speedfix_apply(client: Client, script: Path) -> None:
    client.open(script)
    uri = script.as_uri()
    start = {"line": 0, "character": 0}
    actions = client.request(
        "textDocument/codeAction",
        {"textDocument": {"uri": uri}, "range": {"start": start, "end": start}, "context": {"diagnostics": [], "only": ["source.fixAll"]}},
    )
    assert [a["kind"] for a in actions] == ["source.fixAll.speedfix"]
    fixed = apply_edits(script.read_text(encoding="utf-8"), actions[0]["edit"]["changes"][uri])
    assert fixed == run_apply(script)


def test_change_updates_diagnostics_and_noqa_suppresses(client: Client, script: Path) -> None:
    before = client.open(script)
    uri = script.as_uri()
    lines = script.read_text(encoding="utf-8").splitlines(keepends=True)
    assert "DataLoader(" in lines[141]
    lines[141] = lines[141].rstrip("\n") + "  # noqa: SF102\n"
    client.notify(
        "textDocument/didChange",
        {"textDocument": {"uri": uri, "version": 2}, "contentChanges": [{"text": "".join(lines)}]},
    )
    after = client.diagnostics(uri, 2)
    assert [c for c in codes(before) if c[0] != "SF102"] == codes(after)
    assert "SF103" in {d["code"] for d in after if d["range"]["start"]["line"] == 141}

    client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    assert client.diagnostics(uri) == []


def test_configuration_is_discovered_from_the_document(client: Client, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[tool.speedfix]\nignore = ["SF301"]\nexclude = ["generated/*"]\n')
    train = project / "src" / "train.py"
    shutil.copyfile(SD, train)
    found = {d["code"] for d in client.open(train)}
    assert "SF301" not in found and "SF102" in found
    (project / "generated").mkdir()
    excluded = project / "generated" / "train.py"
    shutil.copyfile(SD, excluded)
    assert client.open(excluded) == []



def test_a_file_of_a_project_is_checked_with_the_files_beside_it(client: Client, tmp_path: Path) -> None:
    """utils.py's helper runs on every step of engine.py's loop: its `.item()` is a per-step sync,
    as `speedfix scan FOLDER` says; the same file on its own says nothing."""
    helper = "def log_loss(loss):\n    print(loss.item())\n"
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "utils.py").write_text(helper)
    (tmp_path / "project" / "engine.py").write_text(
        "import torch\nfrom utils import log_loss\n\n"
        "def train(model, loader, opt):\n    for x, y in loader:\n        loss = model(x.cuda(), y.cuda())\n"
        "        loss.backward()\n        opt.step()\n        log_loss(loss)\n"
    )
    (tmp_path / "alone").mkdir()
    (tmp_path / "alone" / "utils.py").write_text(helper)
    assert ("SF301", 1, 10) in codes(client.open(tmp_path / "project" / "utils.py"))
    assert "SF301" not in {d["code"] for d in client.open(tmp_path / "alone" / "utils.py")}

def test_configuration_error_is_shown(client: Client, tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.speedfix]\nselect = ["SF999"]\n')
    train = tmp_path / "train.py"
    shutil.copyfile(SD, train)
    assert client.open(train) == []
    shown = client.wait_for(lambda m: m.get("method") == "window/showMessage")
    assert "SF999" in shown["params"]["message"] and shown["params"]["type"] == 1


def test_syntax_error_is_a_diagnostic(client: Client, tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\n\ndef f(:\n    pass\n")
    (problem,) = client.open(broken)
    assert problem["code"] == "SF000" and problem["severity"] == 1  # as `scan` reports it
    assert problem["range"]["start"]["line"] == 2


def test_positions_count_utf16_units(client: Client, tmp_path: Path) -> None:
    lines = SD.read_text(encoding="utf-8").splitlines(keepends=True)
    assert lines[164].strip() == "x = x.to(device)"
    lines[164] = lines[164].replace("x = ", 's = "\U0001F600"; x = ', 1)
    script = tmp_path / "emoji.py"
    script.write_text("".join(lines), encoding="utf-8")
    blocking = [d["range"]["start"] for d in client.open(script) if d["code"] == "SF104"]
    # The emoji is one code point (the engine's unit) but two UTF-16 units (LSP's default).
    assert {"line": 164, "character": lines[164].index("x.to") + 1} in blocking


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("a\r\n\x0cb\r\nc", "a\r\n\x0cB\r\nc\r\nd"),  # CRLF, a form feed (not a line break in LSP)
        ("s = '\U0001F600'\rx = 1\r", "import y\rs = '\U0001F600'\rx = 2\r"),  # CR, an astral character
        ("x = 1\n", ""),
        ("", "x = 1"),
    ],
)
def test_text_edits_turn_old_into_new(old: str, new: str) -> None:
    from pygls.workspace.position_codec import PositionCodec

    from speedfix.server import LineIndex, text_edits

    edits = text_edits(old, new, LineIndex(old, PositionCodec()))
    position = lambda p: {"line": p.line, "character": p.character}  # noqa: E731
    wire = [{"range": {"start": position(e.range.start), "end": position(e.range.end)}, "newText": e.new_text} for e in edits]
    assert apply_edits(old, wire) == new


def test_shutdown_and_exit(tmp_path: Path) -> None:
    client = start(tmp_path)
    try:
        assert client.stop() == 0
    finally:
        client.kill()


def test_scan_does_not_import_pygls() -> None:
    code = "import sys, speedfix.cli, speedfix.commands.scan, speedfix.commands.apply; sys.exit('pygls' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_missing_pygls_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "speedfix.server", raising=False)
    monkeypatch.setitem(sys.modules, "pygls", None)  # "not installed"
    monkeypatch.setitem(sys.modules, "pygls.lsp", None)
    monkeypatch.setitem(sys.modules, "pygls.lsp.server", None)
    result = CliRunner().invoke(app, ["server"])
    assert result.exit_code == 2
    assert "speedfix[server]" in result.output


# ------------------------------------------------------------------ hostile clients (issue 27, item 7)
SMALL = "import torch\nfrom torch.utils.data import DataLoader\n\nloader = DataLoader(ds, batch_size=32)\nfor x, y in loader:\n    x = x.cuda()\n"


def actions_request(number: int, uri: str, line: int = 3) -> dict[str, Any]:
    where = {"start": {"line": line, "character": 10}, "end": {"line": line, "character": 10}}
    return {"id": number, "method": "textDocument/codeAction",
            "params": {"textDocument": {"uri": uri}, "range": where, "context": {"diagnostics": []}}}


def change(uri: str, version: int, text: str) -> dict[str, Any]:
    return {"method": "textDocument/didChange",
            "params": {"textDocument": {"uri": uri, "version": version}, "contentChanges": [{"text": text}]}}


def published_versions(client: Client, uri: str, until: int) -> list[int]:
    """The versions of ``uri`` whose diagnostics came, up to the one of version ``until``."""
    versions = []
    while not versions or versions[-1] != until:
        message = client.wait_for(lambda m: m.get("method") == "textDocument/publishDiagnostics" and m["params"]["uri"] == uri)
        versions.append(message["params"]["version"])
    return versions


def test_quick_edits_are_analysed_once_in_their_last_version(client: Client, tmp_path: Path) -> None:
    # Before, every change was analysed in turn, and a request waited for all 30 analyses.
    uri = (tmp_path / "typing.py").as_uri()
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": SMALL}})
    client.diagnostics(uri, 1)
    number = client.next_id()
    edits = [change(uri, version, SMALL + f"y = {version}\n") for version in range(2, 32)]
    client.raw(b"".join(framed(message) for message in [*edits, actions_request(number, uri)]))
    answer = client.answer(number)  # about version 31, the text it was asked on
    assert "pin_memory=True" in json.dumps(answer["result"])
    assert published_versions(client, uri, 31) == [31]


def test_a_request_is_answered_before_documents_waiting_for_analysis(client: Client, tmp_path: Path) -> None:
    # Before, opening a big document analysed it at once, and the request behind it waited.
    small, big = (tmp_path / "small.py").as_uri(), (tmp_path / "big.py").as_uri()
    client.notify("textDocument/didOpen", {"textDocument": {"uri": small, "languageId": "python", "version": 1, "text": SMALL}})
    client.diagnostics(small, 1)
    number = client.next_id()
    opened = {"method": "textDocument/didOpen",
              "params": {"textDocument": {"uri": big, "languageId": "python", "version": 1, "text": SMALL * 200}}}
    client.raw(framed(opened) + framed(actions_request(number, small)))
    order = []
    while len(order) < 2:
        message = client.wait_for(lambda m: m.get("id") == number or m.get("params", {}).get("uri") == big)
        order.append("answer" if message.get("id") == number else "big")
    assert order == ["answer", "big"]


def test_malformed_messages_are_answered_and_the_next_request_too(tmp_path: Path) -> None:
    client = start(tmp_path)
    try:
        uri = (tmp_path / "x.py").as_uri()
        client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": SMALL}})
        client.diagnostics(uri, 1)
        # not JSON: a parse error, for no id
        client.raw(b"Content-Length: 5\r\n\r\n{abc}")
        assert client.wait_for(lambda m: m.get("error", {}).get("code") == -32700)["id"] is None
        # a position on line -1: invalid parameters (never answered before)
        number = client.next_id()
        client.send(actions_request(number, uri, line=-1))
        assert client.answer(number)["error"]["code"] == -32602
        # garbage, then a header in lower case and lines ended by \n alone (lost before)
        number = client.next_id()
        body = framed(actions_request(number, uri)).split(b"\r\n\r\n", 1)[1]
        client.raw(b"GET / HTTP/1.1\r\nnonsense\n\ncontent-length: %d\n\n" % len(body) + body)
        assert "pin_memory" in json.dumps(client.answer(number)["result"])
        # a Content-Length of 100 TB: a MemoryError ended the server before
        number = client.next_id()
        client.raw(b"Content-Length: 99999999999999\r\n\r\n" + json.dumps({"jsonrpc": "2.0", "id": number, "method": "x"}).encode())
        assert client.answer(number)["error"]["code"] == -32600
        assert client.request("textDocument/codeAction", actions_request(0, uri)["params"]) is not None
        # after shutdown, a request is refused, not left waiting
        assert client.request("shutdown") is None
        number = client.next_id()
        client.send(actions_request(number, uri))
        assert client.answer(number)["error"]["code"] == -32600
        client.notify("exit")
        assert client.process.wait(timeout=TIMEOUT) == 0
    finally:
        client.kill()


def test_exit_without_shutdown_exits_with_1(tmp_path: Path) -> None:
    client = start(tmp_path)  # 0 before: LSP says 1 when no shutdown request came first
    try:
        client.notify("exit")
        assert client.process.wait(timeout=TIMEOUT) == 1
    finally:
        client.kill()


@pytest.mark.parametrize(
    ("text", "uri_tail", "expected"),
    [
        (SMALL + "s = '\ud800'\n", "", "a lone surrogate"),  # JSON can carry one, no file can hold it
        (SMALL, "%00", "SF102"),  # a NUL in the path: checked as an unsaved buffer
    ],
    ids=["lone surrogate", "NUL in the URI"],
)
def test_a_document_is_never_dropped_in_silence(client: Client, tmp_path: Path, text: str, uri_tail: str, expected: str) -> None:
    uri = (tmp_path / "odd.py").as_uri() + uri_tail
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}})
    assert expected in json.dumps(client.diagnostics(uri, 1))


def test_deep_code_is_a_diagnostic_not_a_crash(client: Client, tmp_path: Path) -> None:
    # A segmentation fault ended the server before (issue 27, item 4).
    uri = (tmp_path / "deep.py").as_uri()
    text = SMALL + "if " + " and ".join(["x"] * 8_000) + ":\n    pass\n"
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}})
    (problem,) = client.diagnostics(uri, 1)
    assert "nested too deeply" in problem["message"] and problem["range"]["start"]["line"] == 6
    assert client.request("textDocument/codeAction", actions_request(0, uri)["params"]) is None  # still answering
