"""The compiled methods of ``@dataclass`` classes, kept between runs (``speedfix.syntax.generated``)."""

from __future__ import annotations

import dataclasses
import importlib.util
import marshal
import sys
from dataclasses import dataclass, field

import pytest

from speedfix.syntax import generated
from speedfix.syntax.generated import generated_code_kept


def _define() -> type:
    @dataclass(frozen=True, order=True)
    class Point:
        x: int
        y: "list[int]" = field(default_factory=list)
        name: str = "p"

    return Point


@pytest.fixture
def writable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", False)


def _same_class(kept: type, plain: type) -> None:
    assert kept.__init__.__annotations__ == plain.__init__.__annotations__  # not turned into strings
    assert kept.__init__.__defaults__ == plain.__init__.__defaults__
    assert repr(kept(1)).replace(kept.__qualname__, "") == repr(plain(1)).replace(plain.__qualname__, "")
    assert kept(1, [2]) == kept(1, [2]) and kept(1) < kept(2) and kept(1).y is not kept(1).y
    with pytest.raises(dataclasses.FrozenInstanceError):
        kept(1).x = 2  # type: ignore[misc]


def test_methods_compiled_once_then_read_back(tmp_path, writable, monkeypatch) -> None:
    store = tmp_path / "kept.functions"
    plain = _define()
    with generated_code_kept(store):
        first = _define()
    assert not hasattr(dataclasses, "exec")
    _same_class(first, plain)
    assert store.read_bytes().startswith(importlib.util.MAGIC_NUMBER)

    def no_compiling(*args: object, **kwargs: object) -> None:
        raise AssertionError("compiled again")

    monkeypatch.setattr(generated, "compile", no_compiling, raising=False)
    written = store.stat().st_mtime_ns
    with generated_code_kept(store):
        second = _define()
    _same_class(second, plain)
    assert store.stat().st_mtime_ns == written  # nothing new: not written again


def test_a_broken_or_foreign_file_is_ignored_and_rewritten(tmp_path, writable) -> None:
    store = tmp_path / "kept.functions"
    for content in (b"", b"garbage", importlib.util.MAGIC_NUMBER + b"\x00broken",
                    b"\x00\x00\x00\x00" + marshal.dumps({}), importlib.util.MAGIC_NUMBER + marshal.dumps([1, 2])):
        store.write_bytes(content)
        with generated_code_kept(store):
            _same_class(_define(), _define())
        assert generated._read(store), content


def test_nothing_written_without_bytecode_or_a_writable_place(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    store = tmp_path / "kept.functions"
    with generated_code_kept(store):
        _define()
    assert not store.exists()
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    blocked = tmp_path / "a-file" / "kept.functions"
    (tmp_path / "a-file").write_text("not a folder")
    with generated_code_kept(blocked):
        _same_class(_define(), _define())
    assert list(tmp_path.iterdir()) == [tmp_path / "a-file"]


def test_the_block_ends_cleanly_on_an_error_and_leaves_another_exec_alone(tmp_path, writable, monkeypatch) -> None:
    store = tmp_path / "kept.functions"
    with pytest.raises(KeyError), generated_code_kept(store):
        _define()
        raise KeyError("stop")
    assert not hasattr(dataclasses, "exec") and generated._read(store)
    mine = object()
    monkeypatch.setattr(dataclasses, "exec", mine, raising=False)
    with generated_code_kept(store):
        assert dataclasses.exec is mine  # type: ignore[attr-defined]
    assert dataclasses.exec is mine  # type: ignore[attr-defined]


def test_the_store_sits_with_the_bytecode() -> None:
    path = generated.store_path()
    assert path is not None and path.name == f"generated.{sys.implementation.cache_tag}.functions"
    assert path.parent == generated.Path(importlib.util.cache_from_source(generated.__file__)).parent
