"""The engine's understanding of a file: names through imports, training-loop context,
CUDA detection, argument resolution, and the fast walker's equivalence with libcst's."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from speedfix.engine.analysis import analyze
from speedfix.engine.registry import all_rules, rule_by_code
from speedfix.engine.results import SYNTAX_ERROR_CODE
from speedfix.model.context import FileContext
from speedfix.model.devices import uses_cuda
from speedfix.model.versions import TorchVersion
from speedfix.syntax.source import SourceFile, decode_source
from speedfix.syntax.walk import walk_batched

TARGET = TorchVersion.parse("2.4")


def scan(code: str, *codes: str, torch: str = "2.4") -> list[tuple[str, int]]:
    code = textwrap.dedent(code)
    data = code.encode()
    rules = [rule_by_code(c) for c in codes] if codes else list(all_rules())
    analysis = analyze(SourceFile(Path("t.py"), data, *decode_source(data)), "t.py", rules, TorchVersion.parse(torch))
    assert analysis.error is None, analysis.error
    return [(f.code, f.line) for f in analysis.findings]


def context(code: str) -> FileContext:
    module = cst.parse_module(textwrap.dedent(code))
    ctx = FileContext(module, "t.py", TARGET)
    walk_batched(module, [ctx])
    return ctx


@pytest.mark.parametrize(
    "imports, call",
    [
        ("import torch", "torch.utils.data.DataLoader"),
        ("import torch as T", "T.utils.data.DataLoader"),
        ("import torch.utils.data", "torch.utils.data.DataLoader"),
        ("import torch.utils.data as tud", "tud.DataLoader"),
        ("from torch.utils.data import DataLoader", "DataLoader"),
        ("from torch.utils.data import DataLoader as DL", "DL"),
        ("from torch.utils import data", "data.DataLoader"),
        ("from torch.utils.data.dataloader import DataLoader", "DataLoader"),
    ],
)
def test_dataloader_through_every_import_form(imports, call):
    code = f"{imports}\nloader = {call}(ds, batch_size=4)\n"
    assert scan(code, "SF101") == [("SF101", 2)]


@pytest.mark.parametrize(
    "code",
    [
        "from mylib import DataLoader\nloader = DataLoader(ds)\n",
        "from .data import DataLoader\nloader = DataLoader(ds)\n",
        "import torch\nclass DataLoader:\n    pass\nloader = DataLoader(ds)\n",
        "import torch\ndef DataLoader(ds):\n    return ds\nloader = DataLoader(ds)\n",
        "import torch\nloader = DataLoader(ds)\n",  # never imported from torch
    ],
)
def test_a_projects_own_dataloader_is_never_reported(code):
    assert scan(code, "SF101") == []


def test_a_projects_own_compile_and_zero_grad_are_not_torchs():
    code = """
        import torch
        from myproject import compile
        model = Net().cuda()
        model = compile(model, "max-autotune")
        opt = MyOptimizer(model.parameters())
        for x, y in loader:
            loss = model(x.cuda()).sum()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
    """
    assert scan(code, "SF402", "SF501") == []


def test_step_loops_epoch_loops_and_one_level_of_calls():
    ctx = context(
        """
        def train_step(model, batch, opt):
            loss = model(batch).sum()
            loss.backward()
            opt.step()

        def train_epoch(model, loader, opt):
            for batch in loader:          # a step loop (through train_step)
                train_step(model, batch, opt)

        def evaluate(model, loader):
            for batch in loader:          # no backward: not a step loop
                model(batch)

        for epoch in range(10):           # only contains the step loop: not itself one
            train_epoch(model, loader, opt)
            evaluate(model, val_loader)

        while True:                       # an optimizer step directly in the body
            loss = model(next(it)).sum()
            loss.backward()
            optimizer.step()
            scheduler.step()
        """
    )
    loops = list(ctx.loops)
    assert [loop in ctx.step_loops for loop in loops] == [True, False, False, True]


def test_scheduler_step_alone_is_not_a_training_step():
    ctx = context(
        """
        import torch
        scheduler = torch.optim.lr_scheduler.StepLR(opt, 10)
        for epoch in range(10):
            scheduler.step()
        """
    )
    assert not ctx.step_loops


def test_hot_path_excludes_periodic_logging_and_once_per_epoch_code():
    code = """
        import torch
        def train(model, loader, opt):
            for epoch in range(3):
                for i, (x, y) in enumerate(loader):
                    loss = model(x.cuda()).sum()
                    loss.backward()
                    opt.step()
                    a = loss.item()                  # hot
                    if i % 100 == 0:
                        b = loss.item()              # logging
                    if rank == 0:
                        c = loss.item()              # still every step
                d = loss.item()                      # once per epoch
    """
    # One finding per step, on its first sync (the others are named in it); without that one,
    # the `rank == 0` sync, which still runs every step, is the finding.
    assert scan(code, "SF301") == [("SF301", 9)]
    assert scan(code.replace("a = loss.item()", "a = 0"), "SF301") == [("SF301", 13)]


def test_lightning_training_step_is_hot():
    code = """
        import torch
        import lightning as L
        class Model(L.LightningModule):
            def training_step(self, batch, batch_idx):
                loss = self.model(batch).sum()
                self.log("loss", loss.item())
                return loss
        trainer = L.Trainer(accelerator="cuda")
    """
    assert scan(code, "SF301") == [("SF301", 7)]


def test_cuda_detection():
    assert uses_cuda(context("import torch\nx = torch.zeros(1).cuda()\n"))
    assert uses_cuda(context('import torch\ndevice = "cuda:0"\n'))
    assert uses_cuda(context("import torch\ndev = torch.accelerator.current_accelerator()\n"))
    assert not uses_cuda(context('import torch\ndevice = "cpu"\nx = torch.zeros(1, device=device)\n'))
    # a DeepSpeed engine trains on the GPU, whatever device string its batches are given
    engine = "import deepspeed\nengine, optimizer, _, _ = deepspeed.initialize(model=model, config=ds_config)\n"
    assert uses_cuda(context(engine)) and not uses_cuda(context("import deepspeed\nprint(deepspeed.__version__)\n"))


def test_kwargs_dict_literals_are_resolved_and_unknowns_mean_silence():
    resolved = """
        from torch.utils.data import DataLoader
        def main():
            kw = dict(batch_size=8, num_workers=0)
            loader = DataLoader(ds, **kw)
            return loader
        if __name__ == "__main__":
            main()
    """
    assert scan(resolved, "SF101") == [("SF101", 5)]
    conditionally_updated = """
        from torch.utils.data import DataLoader
        kw = {"batch_size": 8}
        if cuda:
            kw.update({"num_workers": 2})
        loader = DataLoader(ds, **kw)
    """
    assert scan(conditionally_updated, "SF101") == []
    unrelated_update = """
        from torch.utils.data import DataLoader
        kw = {"batch_size": 8}
        kw.update({"shuffle": True})
        loader = DataLoader(ds, **kw)
    """
    assert scan(unrelated_update, "SF101") == [("SF101", 5)]
    item_assignment = """
        from torch.utils.data import DataLoader
        kw = {"batch_size": 8}
        kw["num_workers"] = n
        loader = DataLoader(ds, **kw)
    """
    assert scan(item_assignment, "SF101") == []


def test_constants_and_argparse_defaults_are_resolved():
    code = """
        import argparse
        from torch.utils.data import DataLoader
        WORKERS = 0
        parser = argparse.ArgumentParser()
        parser.add_argument("--num-workers", type=int, default=0)
        parser.add_argument("--j", dest="jobs", type=int, default=8)
        args = parser.parse_args()
        a = DataLoader(ds, num_workers=WORKERS)
        b = DataLoader(ds, num_workers=args.num_workers)
        c = DataLoader(ds, num_workers=args.jobs)
        d = DataLoader(ds, num_workers=args.unknown)
    """
    assert scan(code, "SF101") == [("SF101", 9), ("SF101", 10)]


def test_version_dependent_advice():
    bare = """
        import torch
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        optimizer.zero_grad()
    """
    assert scan(bare, "SF402", torch="1.13") == [("SF402", 4)]
    assert scan(bare, "SF402", torch="2.0") == []
    compiled = "import torch\nmodel = Net().cuda()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    assert scan(compiled, "SF501", torch="1.13") == []
    assert scan(compiled, "SF501", torch="2.0") == [("SF501", 2)]


def test_deterministic_mode_names_autotuning_too_when_the_script_leaves_it_off():
    """SF601 is silent where determinism is asked for: SF602, which questions that choice, says
    what dropping it should come with."""
    code = """
        import torch
        import torch.backends.cudnn as cudnn
        cudnn.deterministic = True
        model = ConvNet().cuda()
        for x, y in loader:
            model(x.cuda()).sum().backward()
    """
    data = textwrap.dedent(code).encode()

    def message(source: bytes) -> str:
        found = analyze(SourceFile(Path("t.py"), source, *decode_source(source)), "t.py",
                        [rule_by_code("SF602")], TorchVersion.parse("2.4")).findings
        assert len(found) == 1
        return found[0].message

    assert "also set `cudnn.benchmark = True`" in message(data)
    assert "cudnn.benchmark" not in message(data.replace(b"True\n", b"True\ncudnn.benchmark = True\n", 1))


SAMPLES = [
    *(
        example.code
        for rule in all_rules()
        if rule.code != SYNTAX_ERROR_CODE  # its examples do not parse, by design
        for example in [*rule.VALID, *rule.INVALID]
    ),
    """
    @decorator(arg)
    class A(Base, metaclass=Meta):
        x: int = 1
        async def f(self, *args, key=lambda v: v[0], **kw) -> "A":
            async with lock as l, other():
                async for i in aiter():
                    yield [j async for j in g() if j]
            try:
                pass
            except* ValueError as e:
                raise
            finally:
                del x
            match cmd:
                case [1, *rest] if rest:
                    pass
            return f"{x!r:>{width}} {y=}"
    """,
]


class _Recorder(cst.BatchableCSTVisitor):
    """Records every visit/leave of node types rules look at."""

    TYPES = ("Call", "Name", "Attribute", "For", "While", "If", "With", "FunctionDef", "ClassDef",
             "Assign", "AugAssign", "Import", "ImportFrom", "SimpleString", "Param", "Arg", "Decorator")

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str, int]] = []

    def get_visitors(self):  # type: ignore[no-untyped-def]
        table = {}
        for name in self.TYPES:
            table[f"visit_{name}"] = lambda node, n=name: self.events.append(("visit", n, id(node)))
            table[f"leave_{name}"] = lambda node, n=name: self.events.append(("leave", n, id(node)))
        for owner, field in (("For", "body"), ("While", "body"), ("If", "body"), ("With", "body")):
            table[f"visit_{owner}_{field}"] = lambda node, n=f"{owner}.{field}": self.events.append(("enter", n, id(node)))
            table[f"leave_{owner}_{field}"] = lambda node, n=f"{owner}.{field}": self.events.append(("exit", n, id(node)))
        return table


@pytest.mark.parametrize("code", SAMPLES)
def test_fast_walker_makes_the_same_calls_as_libcst(code):
    module = cst.parse_module(textwrap.dedent(code))
    ours, theirs = _Recorder(), _Recorder()
    walk_batched(module, [ours])
    cst.visit_batched(module, [theirs])
    assert sorted(ours.events) == sorted(theirs.events)
    # pre-order: a node is visited before its children and left after them
    for recorder in (ours, theirs):
        order = {event: i for i, event in enumerate(recorder.events)}
        for kind, name, ident in recorder.events:
            if kind == "visit":
                assert order[("visit", name, ident)] < order[("leave", name, ident)]


def test_each_visitor_gets_exactly_the_hooks_its_class_defines():
    from speedfix.syntax.walk import Visitor

    class Base(Visitor):
        def visit_Call(self, node): ...
        def leave_For_body(self, node): ...

    class Child(Base):
        visit_Call = cst.BatchableCSTVisitor.visit_Call  # switched off again: a no-op stub
        def leave_Name(self, node): ...

    for cls in (Base, Child, FileContext, *all_rules()):
        Visitor._method_names.pop(cls, None)
        hooks = set(Visitor.get_visitors(cls.__new__(cls)))
        # what libcst's own lookup finds, less its no-op stubs
        assert hooks == {name for name in dir(cls) if name.startswith(("visit_", "leave_"))
                         and not getattr(getattr(cls, name), "_is_no_op", False)}, cls
    assert set(Visitor.get_visitors(Child())) == {"leave_For_body", "leave_Name"}


POSITION_SAMPLES = [*SAMPLES, *(p.read_text() for p in sorted((Path(__file__).parent.parent / "fixtures").glob("*.py")))]
POSITION_SAMPLES.append('# header comment\n\n"""doc"""\nimport torch; import os\n\n\n@dec\n# between\n@dec2(1)\ndef f():\n    return 1\n\n\nclass A:  # c\n    x = [\n        1,\n    ]\n')


@pytest.mark.parametrize("code", POSITION_SAMPLES)
def test_sparse_positions_equal_libcsts_positions(code):
    from libcst.metadata import MetadataWrapper, PositionProvider

    from speedfix.syntax.positions import positions_for

    code = textwrap.dedent(code)
    module = cst.parse_module(code)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    top_of: dict = {}
    walk_batched(module, [], top_of)
    nodes = [node for node in expected if id(node) in top_of and node is not module]  # the nodes the walk visits
    assert nodes
    for chunk in (nodes, nodes[::7], nodes[-3:]):
        got = positions_for(module, chunk, text=code, top_of=top_of)
        assert {n: got[n] for n in chunk} == {n: expected[n] for n in chunk}


FIXTURES = Path(__file__).parent.parent / "fixtures"


@pytest.mark.parametrize("name", ["cnn_classifier.py", "imagenet_resnet.py", "sd.py"])
def test_an_analysed_files_tree_is_freed_as_soon_as_its_result_is_dropped(name):
    """No reference cycle and no per-file cache holds the context (and through it the tree):
    it goes with the last reference, without the cyclic garbage collector, so a long scan's
    memory stays flat and no collection walks the trees of files analysed earlier."""
    import gc
    import weakref

    data = (FIXTURES / name).read_bytes()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        analysis = analyze(SourceFile(Path(name), data, *decode_source(data)), name, all_rules(), TARGET)
        assert analysis.findings and any(f.fix is not None for f in analysis.findings)
        context = weakref.ref(analysis.context)
        del analysis
        assert context() is None
    finally:
        if was_enabled:
            gc.enable()
