"""Per-file limits: a time limit, input libcst's parser cannot finish, and parse errors that say
what happened (issue 13, item 4). No test here depends on the real clock."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import libcst as cst
import pytest

import speedfix.syntax.deadline
from speedfix.engine.analysis import analyze
from speedfix.engine.registry import all_rules
from speedfix.fixes.fixer import fix_code
from speedfix.model.versions import v
from speedfix.syntax.names import dotted_name
from speedfix.syntax.source import SourceFile
from speedfix.syntax.parsing import NestingTooDeep, parse_module



def flat_sum(terms: int) -> str:
    return "total = " + " + ".join(f"a{i}" for i in range(terms)) + "\n"


@pytest.fixture
def slow_clock(monkeypatch):
    """A clock that advances 100 s each time the time limit looks at it."""
    ticks = itertools.count(step=100)
    monkeypatch.setattr(speedfix.syntax.deadline, "clock", lambda: float(next(ticks)))


def test_an_analysis_gives_way_once_it_is_called_off(good_script, tmp_path):
    # The editor server's next message calls off the analysis of a text that is stale already.
    event = threading.Event()
    source = SourceFile(tmp_path / "train.py", good_script.encode(), good_script, "utf-8")
    with speedfix.syntax.deadline.cancelled_by(event):
        assert analyze(source, "train.py", all_rules(), v("2.4")).findings  # not called off: done
        event.set()
        with pytest.raises(speedfix.syntax.deadline.Cancelled):
            analyze(source, "train.py", all_rules(), v("2.4"))


def test_a_file_over_the_time_limit_is_skipped_and_reported(good_script, run_cli, write, tmp_path, slow_clock):
    slow = write("slow.py", good_script)
    result = run_cli("scan", slow, "--file-time-limit", "150", "--no-summary")
    assert result.exit_code == 2
    assert "slow.py: error: skipped: analysing it took longer than 150 s" in result.stderr
    assert "--file-time-limit" in result.stderr and "Traceback" not in result.stderr
    result = run_cli("apply", slow, "--file-time-limit", "150")
    assert result.exit_code == 2 and "took longer than 150 s" in result.stderr
    assert slow.read_text() == good_script


def test_the_time_limit_applies_per_file_and_zero_disables_it(good_script, run_cli, write, tmp_path, slow_clock):
    write("a.py", good_script)
    write("b.py", good_script)
    result = run_cli("scan", tmp_path, "--file-time-limit", "150", "--no-summary", "--jobs", "1")
    assert result.stderr.count("took longer than 150 s") == 2  # each file got its own deadline
    result = run_cli("scan", tmp_path, "--file-time-limit", "0", "--no-summary")
    assert result.exit_code == 1 and result.stderr == ""


def test_time_limit_from_the_configuration(good_script, run_cli, write, tmp_path, slow_clock):
    write("pyproject.toml", "[tool.speedfix]\nfile-time-limit = 150\n")
    write("slow.py", good_script)
    result = run_cli("scan", tmp_path, "--no-summary")
    assert result.exit_code == 2 and "took longer than 150 s" in result.stderr


@pytest.mark.parametrize("terms", [20_000, 1_500], ids=["far beyond the limit", "beyond the limit"])
def test_a_huge_flat_expression_is_refused_before_libcst_sees_it(good_script, run_cli, write, tmp_path, terms):
    # 20,000 terms: libcst's parser (about N**2) would not finish; the scan answers at once.
    write("generated.py", "import torch\n" + flat_sum(terms) + "x = torch.zeros(3).cuda()\n")
    write("good.py", good_script)
    result = run_cli("scan", tmp_path, "--no-summary")
    assert result.exit_code == 2
    assert "generated.py:2:1: error: cannot parse: the code is nested too deeply (" in result.stderr
    assert f"line 2 nests {terms:,} expressions; the limit is 1,000" in result.stderr
    assert "good.py:4:10: SF102" in result.stdout


def test_code_nested_deeper_than_the_limit_is_refused_with_its_line():
    parse_module("import torch\n" + flat_sum(900))  # under the limit: parsed
    with pytest.raises(NestingTooDeep, match="line 1 nests"):
        parse_module(flat_sum(1_001))
    with pytest.raises(NestingTooDeep):
        parse_module("x = " + "-" * 1_100 + "1\n")  # one character per level


@pytest.mark.parametrize(
    "code",
    ["import torch\nx = (((((((((((((((((((((((((((((((1" + ")" * 30 + "\n", "import torch\n" + "[" * 300 + "]" * 300 + "\n"],
)
def test_parse_failures_never_print_an_empty_message(run_cli, write, code):
    path = write("deep.py", code)
    result = run_cli("scan", path)
    for line in result.stderr.splitlines():
        assert not line.rstrip().endswith(":"), line
    assert "cannot parse: \n" not in result.stderr


# Code libcst nests although Python's ast keeps it flat. The first three crashed scan, apply and the
# editor server with a segmentation fault (libcst's native parser); the others stopped with a
# RecursionError that named no line.
DEEP_SHAPES = {
    "and_chain.py": ("def train(model, loader):\n    for batch in loader:\n        if " + " and ".join(["ok(batch)"] * 8_000) + ":\n            model(batch)\n", 3),
    "dotted_import.py": ("import " + ".".join(["m"] * 8_000) + "\n", 1),
    "from_import.py": ("def f():\n    from " + ".".join(["m"] * 8_000) + " import x\n", 2),
    "or_chain.py": ("x = " + " or ".join(["a"] * 1_500) + "\n", 1),
    "concatenation.py": ("x = (\n" + '"a"\n' * 1_500 + ")\n", 2),
    "comprehension.py": ("x = [a " + " ".join(f"for a{i} in b" for i in range(1_500)) + "]\n", 1),
    "elif_chain.py": ("if a:\n    pass\n" + "elif a:\n    pass\n" * 1_500, 2_001),  # the 1,000th elif
}


def test_code_libcst_nests_deeply_is_refused_with_its_line_and_never_crashes(tmp_path, good_script):
    for name, (code, _) in DEEP_SHAPES.items():
        (tmp_path / name).write_text(good_script + code)  # 8 lines, with a finding
    (tmp_path / "good.py").write_text(good_script)
    command = [sys.executable, "-m", "speedfix", "scan", "--no-cache", "--no-summary", "."]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result  # not -11: a crash would lose every other file's report
    for name, (_, line) in DEEP_SHAPES.items():
        line += 8
        assert f"{name}:{line}:1: error: cannot parse: the code is nested too deeply (line {line} nests" in result.stderr
    assert "good.py:4:10: SF102" in result.stdout
    result = subprocess.run([*command[:3], "apply", "."], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Fixed 1 finding in 1 file" in result.stdout, result
    assert result.stderr.count("nested too deeply") == len(DEEP_SHAPES)


@pytest.mark.parametrize("shape", ["and", "elif", "concatenation"])
def test_code_nested_just_under_the_limit_is_fixed(run_cli, write, good_script, shape):
    deep = {
        "and": "if " + " and ".join(["a"] * 990) + ":\n    pass\n",
        "elif": "if a:\n    pass\n" + "elif a:\n    pass\n" * 990,
        "concatenation": "x = (" + " ".join(['"a"'] * 990) + ")\n",
    }[shape]
    path = write("train.py", good_script + deep)
    result = run_cli("apply", path)  # a RecursionError from libcst's code generation before
    assert result.exit_code == 1 and "Fixed 1 finding in 1 file" in result.stdout, result
    assert "pin_memory=True" in path.read_text() and path.read_text().endswith(deep)


HEX = "0x" + "f" * 4_400  # Python cannot print this number: str() raises ValueError


def test_an_integer_too_long_to_print_is_no_count(run_cli, write):
    # A ValueError from SF103's message ("starts its <num_workers> worker processes") before.
    path = write("train.py", f"""\
        import torch
        from torch.utils.data import DataLoader

        loader = DataLoader(ds, batch_size=32, num_workers={HEX})
        for epoch in range({HEX}):
            for x, y in loader:
                model(x.cuda(0x0)).sum().backward()
        """)
    result = run_cli("scan", path, "--no-summary", "--output-format", "json")
    assert result.exit_code == 1 and result.stderr == ""
    assert {finding["code"] for finding in json.loads(result.stdout)} >= {"SF102", "SF202"}


def test_a_hexadecimal_device_number_is_written_as_a_device_string():
    # `.cuda(0x1)` became `.to("cuda:0x1", ...)` before, which torch refuses at run time.
    code = textwrap.dedent("""\
        import torch
        import torchvision

        model = torchvision.models.resnet50().cuda(0x1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            x = x.cuda(0x1)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y.cuda(0x1))
            loss.backward()
            opt.step()
        """)
    fixed = fix_code(code, path="train.py", select=["SF206"]).code
    assert 'x.to("cuda:1", memory_format=torch.channels_last)' in fixed


def test_a_deepspeed_json_nested_too_deeply_is_a_note_about_the_json(run_cli, write, tmp_path):
    # The script lost every finding before: "the file is nested too deeply to analyse".
    (tmp_path / "ds.json").write_text('{"train_batch_size": ' + "[" * 50_000 + "]" * 50_000 + "}")
    path = write("train.py", """\
        import deepspeed
        from torch.utils.data import DataLoader

        loader = DataLoader(ds, batch_size=32)
        engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=params, config="ds.json")
        for x, y in loader:
            engine.backward(engine(x.cuda(non_blocking=True)).sum())
        """)
    result = run_cli("scan", path, "--no-summary")
    assert result.exit_code == 1 and result.stderr == ""
    assert "train.py:4:10: SF102" in result.stdout
    assert "SF905 DeepSpeed config not checked: ds.json is nested too deeply to read" in result.stdout


@pytest.mark.parametrize("depth", [300, 50_000], ids=["read by json, too deep to walk", "too deep for json"])
def test_a_project_config_nested_too_deeply_is_left_unread_and_the_script_analysed(run_cli, write, tmp_path, depth):
    # A deep hydra YAML or DeepSpeed JSON stopped the analysis of the script with a RecursionError.
    # Past the recursion limit the YAML nests block sequences (`- - - 1`), which PyYAML reads in linear
    # time; its scanner takes quadratic time in flow nesting (`[[[`: 11 s to the same RecursionError).
    deep = "[" * depth + "]" * depth if depth < 1000 else "\n  " + "- " * depth + "1"
    write("conf/train.yaml", "_target_: lightning.pytorch.Trainer\nmax_epochs: " + deep + "\n")
    write("ds.json", '{"train_batch_size": ' + "[" * depth + "]" * depth + "}")
    write("train.py", """\
        import deepspeed
        import hydra
        from torch.utils.data import DataLoader

        @hydra.main(version_base="1.3", config_path="conf", config_name="train")
        def main(cfg):
            trainer = hydra.utils.instantiate(cfg)
            loader = DataLoader(ds, batch_size=32)
            engine, optimizer, _, _ = deepspeed.initialize(model=model, config="ds.json")
            for x, y in loader:
                engine.backward(engine(x.cuda(non_blocking=True)).sum())
        """)
    result = run_cli("scan", ".", "--no-summary", cwd=tmp_path)
    assert result.exit_code == 1 and "Traceback" not in result.stderr, result.stderr
    assert "train.py:8:14: SF102" in result.stdout
    assert "ds.json is nested too deeply to read" in result.stdout
    assert "train.py: note: conf/train.yaml: not read: " in result.stdout
    if depth > 1000:
        assert "train.py: note: conf/train.yaml: not read: nested too deeply to read" in result.stdout


NEWER_SYNTAX = """\
    import torch
    from torch.utils.data import DataLoader

    type Batch = list[torch.Tensor]


    def first[T](items: list[T]) -> T:
        return items[0]


    label = f"{"nested quotes"} {f"{f"{first([1])}"}"}"
    loader = DataLoader(ds, batch_size=32)
    for x, y in loader:
        loss = model(x.cuda(non_blocking=True)).sum()
        loss.backward()
    """


def test_code_for_a_newer_python_is_analysed_with_libcsts_grammar(run_cli, write):
    # SF000 "invalid syntax" at `type Batch` before, and no finding.
    path = write("train.py", NEWER_SYNTAX)
    result = run_cli("scan", path, "--no-summary")
    assert result.exit_code == 1 and "SF000" not in result.stdout
    assert "train.py:12:10: SF102" in result.stdout
    result = run_cli("apply", path)
    assert result.exit_code == 1 and "pin_memory=True" in path.read_text()
    assert '"nested quotes"' in path.read_text()


def test_invalid_code_is_still_a_syntax_error_with_newer_syntax_beside_it(run_cli, write):
    path = write("train.py", "import torch\ntype Batch = list[torch.Tensor]\nprint 'python 2'\n")
    result = run_cli("scan", path, "--no-summary")
    assert result.exit_code == 1 and "SF000" in result.stdout


def test_the_nesting_of_newer_syntax_is_bounded_from_its_tokens(run_cli, write):
    deep = " and ".join(["a"] * 8_000)
    path = write("train.py", f"import torch\ntype Batch = list[torch.Tensor]\nif {deep}:\n    pass\n")
    result = run_cli("scan", path)
    assert result.exit_code == 2 and "train.py:3:1: error: cannot parse: the code is nested too deeply" in result.stderr


# ------------------------------------------------------------------ file size and time (issue 27, item 5)
def loaders_module(count: int, in_functions: bool) -> str:
    """``count`` loaders, each iterated every epoch with a training step: at module level, or
    one per training function (all named `loader`)."""
    step = "for epoch in range(10):\n    for x, y in {0}:\n        loss = model(x.cuda()).sum()\n        loss.backward()\n        opt.step()\n"
    if in_functions:
        blocks = (f"def train{i}(model, ds, opt):\n    loader = DataLoader(ds, batch_size=32, num_workers=4)\n"
                  + textwrap.indent(step.format("loader"), "    ") for i in range(count))
    else:
        blocks = (f"loader{i} = DataLoader(ds, batch_size=32, num_workers=4)\n" + step.format(f"loader{i}") for i in range(count))
    return "import torch\nfrom torch.utils.data import DataLoader\n\n" + "".join(blocks)


def work_of(code: str) -> int:
    """How many times the rules asked the helpers that tick the time limit (not a clock)."""
    source = SourceFile(Path("train.py"), code.encode(), code, "utf-8")
    before = next(speedfix.syntax.deadline._ticks)
    analysis = analyze(source, "train.py", all_rules(), v("2.4"))
    assert analysis.error is None and len(analysis.findings) > count_of(code)
    return next(speedfix.syntax.deadline._ticks) - before


def count_of(code: str) -> int:
    return code.count("DataLoader(")


@pytest.mark.parametrize("in_functions", [False, True], ids=["module level", "in functions"])
def test_rules_work_in_proportion_to_the_file(in_functions):
    # SF103 asked every call and loop of the file for each loader, SF202 every call for each
    # backward, SF104 every loop for each copy: 400 loaders cost four times the work of 200 (a
    # 4.8 MB file ran over 500 s).
    small, big = work_of(loaders_module(200, in_functions)), work_of(loaders_module(400, in_functions))
    assert big < 2.5 * small, (small, big)


EVALUATED_BLOCK = """
def train{i}(model, ds, val):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(ds, batch_size=32, num_workers=4)
    spare{i} = DataLoader(val, batch_size=32)
    for epoch in range(10):
        for batch in loader:
            batch = {{k: v.cuda() for k, v in batch.items()}}
            loss = model(batch["x"]).sum()
            loss.backward()
            opt.step()
    for x in val:
        print(model(x.cuda()).argmax().item())
"""


def python_calls_of(code: str) -> int:
    """How many Python functions the analysis of ``code`` calls (a count, not a clock)."""
    source = SourceFile(Path("train.py"), code.encode(), code, "utf-8")
    calls = itertools.count()
    sys.setprofile(lambda frame, event, arg: next(calls) if event == "call" else None)
    try:
        analysis = analyze(source, "train.py", all_rules(), v("2.4"))
    finally:
        sys.setprofile(None)
    assert analysis.error is None and len(analysis.findings) > 5 * code.count("def train")
    return next(calls)


def test_trained_models_batches_and_unread_loaders_are_found_once_per_file():
    # SF702 asked every call of the file for optimizers at each forward pass, the batch names every
    # loop for each `.items()` and every call for each method, SF101/SF102 every assignment for
    # each loader nothing reads: 100 training functions cost 3.2 times the work of 50.
    module = "import torch\nfrom torch.utils.data import DataLoader\n"
    small = python_calls_of(module + "".join(EVALUATED_BLOCK.format(i=i) for i in range(50)))
    big = python_calls_of(module + "".join(EVALUATED_BLOCK.format(i=i) for i in range(100)))
    assert big < 2.5 * small, (small, big)


def test_the_time_limit_stops_a_rule_inside_its_loop(good_script, run_cli, write, monkeypatch):
    # Checked only between rules before: a 400 KB file with a 10 s limit took 51 s.
    from speedfix.rules.sf103_dataloader_no_persistent_workers import DataloaderNoPersistentWorkers as Slow

    late = []
    monkeypatch.setattr(speedfix.syntax.deadline, "clock", lambda: 1_000.0 if late else 0.0)

    def endless(self):  # a rule that would never finish, asking the helpers every rule asks
        late.append(True)
        while True:
            dotted_name(cst.Name("x"))

    monkeypatch.setattr(Slow, "finish", endless)
    path = write("train.py", good_script.replace("batch_size=32", "batch_size=32, num_workers=4"))
    result = run_cli("scan", path, "--file-time-limit", "150")
    assert result.exit_code == 2 and "took longer than 150 s" in result.stderr


def nested_sums(count: int, indent: str = "    ") -> str:
    return "".join(f"{indent}total = " + " + ".join(f"a{i}" for i in range(990)) + "\n" for _ in range(count))


def test_a_statement_too_costly_to_parse_in_one_piece_is_refused(run_cli, write, good_script):
    # A training function of 990-term sums: 4 MB ran out of memory (6 GB, the process aborted),
    # 2 MB took 202 s; libcst parses a statement in one piece, and nothing interrupts it.
    write("sums.py", good_script + "\n\ndef train():\n" + nested_sums(60))  # 8 lines, then the function
    write("literal.py", good_script + "DATA = [\n" + "    0.123456789,\n" * 160_000 + "]\n")  # 2.6 MB
    path = write("good.py", good_script)
    result = run_cli("scan", path.parent, "--no-summary")
    assert result.exit_code == 2 and "good.py:4:10: SF102" in result.stdout
    assert ("sums.py:11:1: error: skipped: lines 11-71 are one statement whose expressions nest as much as 59 "
            "expressions 1,000 levels deep") in result.stderr
    assert "literal.py:9:1: error: skipped: lines 9-160,010 are one statement of 2.6 MB" in result.stderr


def test_nested_sums_at_module_level_are_parsed_in_pieces_the_time_limit_can_stop():
    pieces = []
    code = "import torch\n" + nested_sums(12, indent="")
    parse_module(code, between_chunks=lambda: pieces.append(True))
    assert len(pieces) == 3  # four sums a piece (about a second of libcst), in a file far under the chunking size
