"""A fix only writes a name that means the module at the place it inserts it (issue 13, item 6).

With ``import torch as t`` and ``for t, (x, y) in enumerate(loader)``, ``t`` is an int inside the
loop: SF202 must not write ``t.autocast(...)`` there. The patched scripts below are run against a
stand-in ``torch`` module, so each test checks that the result works, not just how it reads.
"""

from __future__ import annotations

import contextlib
import sys
import textwrap
import types

import pytest

from speedfix.fixes.fixer import fix_code


def fixed(code: str, rule: str, torch_version: str | None = None) -> str:
    return fix_code(textwrap.dedent(code), path="train.py", select=[rule], unsafe=True, torch_version=torch_version).code


class FakeTorch(types.ModuleType):
    """Just enough of torch for the patched scripts: records the autocast regions entered."""

    bfloat16 = "bfloat16"

    def __init__(self) -> None:
        super().__init__("torch")
        self.autocasts: list[tuple[str, str]] = []
        self.compiled: list[object] = []

    def autocast(self, device: str, dtype: str) -> contextlib.AbstractContextManager[None]:
        self.autocasts.append((device, dtype))
        return contextlib.nullcontext()

    def compile(self, model: object) -> object:
        self.compiled.append(model)
        return model


class Loss:
    def sum(self) -> Loss:
        return self

    def backward(self) -> None:
        pass


def run(code: str, monkeypatch, entry: str, *args: object) -> tuple[FakeTorch, object]:
    torch = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    namespace: dict[str, object] = {"__name__": "patched"}
    exec(compile(code, "train.py", "exec"), namespace)
    return torch, namespace[entry](*args)  # type: ignore[operator]


def model(x: object) -> Loss:
    return Loss()


OPT = types.SimpleNamespace(step=lambda: None)
LOADER = [(1, 2), (3, 4)]

TRAIN = """\
    import torch as t

    DEVICE = "cuda"


    def train(model, loader, opt):
        # one pass over the data
        for t, (x, y) in enumerate(loader):
            # forward
            loss = model(x).sum()  # scalar
            loss.backward()
            opt.step()
        return t
"""


def test_autocast_is_not_spelled_with_a_name_the_loop_rebinds(monkeypatch):
    code = fixed(TRAIN, "SF202")
    assert "t.autocast" not in code.replace("torch.autocast", "")
    assert code.startswith("import torch as t\nimport torch\n")
    # The comments stay: above the statement that moves into the `with`, and at its end.
    assert "        # forward\n        with torch.autocast(" in code and "model(x).sum()  # scalar\n" in code
    torch, steps = run(code, monkeypatch, "train", model, LOADER, OPT)
    assert steps == 1 and torch.autocasts == [("cuda", "bfloat16")] * 2


def test_an_alias_that_nothing_rebinds_is_still_used(monkeypatch):
    code = fixed(TRAIN.replace("for t, (x, y)", "for step, (x, y)").replace("return t", "return step"), "SF202")
    assert "with t.autocast(\"cuda\", dtype=t.bfloat16):" in code and "import torch\n" not in code
    torch, _ = run(code, monkeypatch, "train", model, LOADER, OPT)
    assert len(torch.autocasts) == 2


@pytest.mark.parametrize(
    "rebinding",
    [
        "def train(model, loader, opt, t=None):",  # a parameter
        "def train(model, loader, opt):\n    with memoryview(b'') as t:\n        pass",
        "def train(model, loader, opt):\n    try:\n        pass\n    except ValueError as t:\n        pass",
        "def train(model, loader, opt):\n    if (t := len(loader)) > 5:\n        pass",
        "def train(model, loader, opt):\n    t: int",
        "def train(model, loader, opt):\n    global t",
    ],
    ids=["parameter", "with-as", "except-as", "walrus", "annotation", "global"],
)
def test_every_kind_of_rebinding_in_the_function_is_respected(monkeypatch, rebinding):
    code = TRAIN.replace("for t, (x, y)", "for step, (x, y)").replace("return t", "return step")
    code = code.replace("    def train(model, loader, opt):", textwrap.indent(rebinding, "    "))
    out = fixed(code, "SF202")
    assert "torch.autocast(\"cuda\", dtype=torch.bfloat16)" in out and "import torch\n" in out
    torch, _ = run(out, monkeypatch, "train", model, LOADER, OPT)
    assert len(torch.autocasts) == 2


def test_a_fresh_name_is_imported_when_torch_is_taken_too(monkeypatch):
    code = TRAIN.replace("def train(model, loader, opt):", "def train(model, loader, opt, torch=None):")
    out = fixed(code, "SF202")
    assert "import torch as torch_\n" in out and "with torch_.autocast(\"cuda\", dtype=torch_.bfloat16):" in out
    torch, _ = run(out, monkeypatch, "train", model, LOADER, OPT)
    assert len(torch.autocasts) == 2


def test_module_level_rebinding_is_respected_by_code_inserted_after_the_imports():
    code = """\
        import torch as t

        model = t.nn.Linear(10, 10).cuda()
        for t, (x, y) in enumerate(loader):
            loss = model(x.cuda()).sum()
            loss.backward()
            opt.step()
    """
    out = fixed(code, "SF201")
    assert 'torch.set_float32_matmul_precision("high")' in out and "import torch\n" in out


def test_compile_is_spelled_with_a_name_that_means_torch_where_it_goes(monkeypatch):
    code = """\
        import torch as t

        def train(model, loader, opt, device="cuda"):
            opt = t.optim.AdamW(model.parameters(), fused=True)
            for t, (x, y) in enumerate(loader):
                loss = model(x).sum()
                loss.backward()
                opt.step()
    """
    out = fixed(code, "SF501", torch_version="2.1")  # before 2.2: `model = torch.compile(model)`
    assert "model = torch.compile(model)" in out and "import torch\n" in out


def test_os_cpu_count_respects_a_parameter_named_os():
    code = """\
        import torch
        from torch.utils.data import DataLoader

        def main(os):
            loader = DataLoader(train_set, batch_size=64, shuffle=True)
            return loader

        if __name__ == "__main__":
            main()
    """
    out = fixed(code, "SF101")
    assert "num_workers=min(8, os_.cpu_count() or 1)" in out and "import os as os_\n" in out
