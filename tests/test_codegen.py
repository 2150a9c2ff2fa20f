"""Fix edits keep the call's own layout."""

from __future__ import annotations

import libcst as cst
import pytest

from speedfix.fixes.codegen import append_args, insert_first_arg, keyword_arg, remove_arg
from speedfix.fixes.fixer import fix_code


def grow(code: str, *names: str) -> str:
    call = cst.parse_expression(code)
    assert isinstance(call, cst.Call)
    grown = append_args(call, *(keyword_arg(n, "True") for n in names))
    return cst.Module([]).code_for_node(grown)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("f()", "f(a=True)"),
        ("f(x)", "f(x, a=True)"),
        ("f(x, y=1)", "f(x, y=1, a=True)"),
        ("f(\n    x,\n    y=1,\n)", "f(\n    x,\n    y=1,\n    a=True,\n)"),
        ("f(\n    x,\n    y=1\n)", "f(\n    x,\n    y=1,\n    a=True\n)"),
        ("f(\n    x,\n)", "f(\n    x,\n    a=True,\n)"),
        ("f(x, z,\n  y=1)", "f(x, z,\n  y=1, a=True)"),
        ("f(x,\n  y=1)", "f(x,\n  y=1, a=True)"),  # `)` stays on its line, with what follows it
        ("f(x, **kw)", "f(x, a=True, **kw)"),
        ("f(\n    x,\n    **kw,\n)", "f(\n    x,\n    a=True,\n    **kw,\n)"),
    ],
)
def test_append_keeps_the_layout(before, after):
    assert grow(before, "a") == after


# Issue 27: a keyword added to a multi-line call moved the last argument's comment onto the new
# argument and copied the comment of the line before onto the last argument's line.
ISSUE_27 = """loader = DataLoader(ds,
    batch_size=64,  # per-GPU batch size
    shuffle=True,  # reshuffle every epoch
    num_workers=4,  # tuned for the 8-core box
)"""


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param(ISSUE_27, ISSUE_27[:-1] + "    pin_memory=True,\n)", id="trailing comma"),
        pytest.param(
            ISSUE_27.replace("4,  # tuned", "4  # tuned"),
            ISSUE_27.replace("4,  # tuned", "4,  # tuned")[:-1] + "    pin_memory=True\n)",
            id="no trailing comma",
        ),
        pytest.param(
            "DataLoader(ds,\n    shuffle=True,  # reshuffle\n    num_workers=4)  # tuned",
            "DataLoader(ds,\n    shuffle=True,  # reshuffle\n    num_workers=4, pin_memory=True)  # tuned",
            id="closing paren on the last argument's line",
        ),
        pytest.param(
            "DataLoader(  # the loader\n    ds,  # data\n)",
            "DataLoader(  # the loader\n    ds,  # data\n    pin_memory=True,\n)",
            id="comment after the open paren",
        ),
        pytest.param(
            "DataLoader(ds,  # data\n    num_workers=4,  # tuned\n    # more options here\n)",
            "DataLoader(ds,  # data\n    num_workers=4,  # tuned\n    pin_memory=True,\n    # more options here\n)",
            id="comment line before the closing paren",
        ),
        pytest.param(
            "DataLoader(ds,  # data\n    num_workers=4,  # tuned\n    # the rest\n    **kwargs  # from the config\n)",
            "DataLoader(ds,  # data\n    num_workers=4,  # tuned\n    pin_memory=True,\n    # the rest\n"
            "    **kwargs  # from the config\n)",
            id="kwargs last",
        ),
        pytest.param(
            "DataLoader(ds, batch_size=64,\n           shuffle=True,  # reshuffle\n           num_workers=4,  # tuned\n)",
            "DataLoader(ds, batch_size=64,\n           shuffle=True,  # reshuffle\n           num_workers=4,  # tuned\n"
            "           pin_memory=True,\n)",
            id="aligned, two arguments on the first line",
        ),
        pytest.param(
            "DataLoader(ds, batch_size=64,  # small\n    shuffle=True, num_workers=4,  # tuned\n)",
            "DataLoader(ds, batch_size=64,  # small\n    shuffle=True, num_workers=4, pin_memory=True,  # tuned\n)",
            id="packed",
        ),
        pytest.param("DataLoader(ds, num_workers=4)  # tuned", "DataLoader(ds, num_workers=4, pin_memory=True)  # tuned",
                     id="one line"),
        pytest.param(
            "DataLoader(train_dataset, batch_size=batch_size, num_workers=4  # tuned\n)",
            "DataLoader(train_dataset, batch_size=batch_size, num_workers=4, pin_memory=True  # tuned\n)",
            id="grows past 80 characters, a comment inside: not laid out again",
        ),
        pytest.param(
            "DataLoader(a_dataset_with_a_long_name, batch_size=64, shuffle=True, num_workers=4  # tuned\n)",
            "DataLoader(a_dataset_with_a_long_name, batch_size=64, shuffle=True, num_workers=4, pin_memory=True  # tuned\n)",
            id="long line ending in a comment: never laid out again",
        ),
    ],
)
def test_an_added_argument_leaves_every_comment_on_its_line(before, after):
    assert add_to_outer_call(before, keyword_arg("pin_memory", "True")) == after


class _AddToOuterCall(cst.CSTTransformer):
    def __init__(self, *new: cst.Arg) -> None:
        super().__init__()
        self.new, self.depth = new, 0

    def visit_Call(self, node: cst.Call) -> None:
        self.depth += 1

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        self.depth -= 1
        return append_args(updated_node, *self.new) if self.depth == 0 else updated_node


def add_to_outer_call(code: str, *new: cst.Arg) -> str:
    """``code`` (a module: the comment after ``)`` is the statement's) with ``new`` added to its
    outermost calls."""
    return cst.parse_module(code).visit(_AddToOuterCall(*new)).code


def test_a_one_line_call_that_grows_too_long_is_laid_out_one_argument_per_line():
    long = grow("DataLoader(train_dataset, batch_size=batch_size, shuffle=True)", "persistent_workers", "pin_memory")
    assert long == (
        "DataLoader(\n    train_dataset,\n    batch_size=batch_size,\n    shuffle=True,\n"
        "    persistent_workers=True,\n    pin_memory=True,\n)"
    )


def test_a_call_that_was_already_long_keeps_its_single_line():
    code = "DataLoader(train_set, batch_size=BATCH_SIZE, shuffle=True, num_workers=4, drop_last=True)"
    assert grow(code, "pin_memory") == code[:-1] + ", pin_memory=True)"


def test_insert_first_and_remove():
    call = cst.parse_expression("GradScaler(enabled=use_amp)")
    assert isinstance(call, cst.Call)
    first = insert_first_arg(call, cst.Arg(cst.SimpleString('"cuda"')))
    assert cst.Module([]).code_for_node(first) == 'GradScaler("cuda", enabled=use_amp)'
    tall = cst.parse_expression("GradScaler(\n    init_scale=1024,\n    enabled=use_amp,\n)")
    assert isinstance(tall, cst.Call)
    first = insert_first_arg(tall, cst.Arg(cst.SimpleString('"cuda"')))
    assert cst.Module([]).code_for_node(first) == 'GradScaler(\n    "cuda",\n    init_scale=1024,\n    enabled=use_amp,\n)'
    zero = cst.parse_expression("opt.zero_grad(set_to_none=False)")
    assert isinstance(zero, cst.Call)
    assert cst.Module([]).code_for_node(remove_arg(zero, zero.args[0])) == "opt.zero_grad()"
    two = cst.parse_expression("f(\n    x,\n    set_to_none=False,\n)")
    assert isinstance(two, cst.Call)
    assert cst.Module([]).code_for_node(remove_arg(two, two.args[1])) == "f(\n    x,\n)"


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("GradScaler(  # fp16 only\n)", 'GradScaler(  # fp16 only\n    "cuda"\n)'),
        ("GradScaler(\n    # fp16 only\n)", 'GradScaler(\n    # fp16 only\n    "cuda"\n)'),
    ],
)
def test_the_first_argument_of_an_empty_call_with_a_comment_gets_a_line_of_its_own(before, after):
    call = cst.parse_expression(before)
    assert isinstance(call, cst.Call)
    assert cst.Module([]).code_for_node(insert_first_arg(call, cst.Arg(cst.SimpleString('"cuda"')))) == after


def test_insert_first_leaves_the_comment_after_the_open_paren():
    call = cst.parse_expression("GradScaler(  # fp16 only\n    # the default scale\n    init_scale=1024,  # tuned\n)")
    assert isinstance(call, cst.Call)
    first = insert_first_arg(call, cst.Arg(cst.SimpleString('"cuda"')))
    assert cst.Module([]).code_for_node(first) == (
        'GradScaler(  # fp16 only\n    "cuda",\n    # the default scale\n    init_scale=1024,  # tuned\n)'
    )


@pytest.mark.parametrize(
    ("before", "index", "after"),
    [
        ("f(\n    a=1,  # keep\n    b=2,  # gone\n)", 1, "f(\n    a=1,  # keep\n    # gone\n)"),
        ("f(\n    a=1,  # keep\n    b=2  # gone\n)", 1, "f(\n    a=1  # keep\n    # gone\n)"),
        ("f(\n    a=1,  # gone\n    b=2,  # keep\n)", 0, "f(\n    # gone\n    b=2,  # keep\n)"),
        ("f(\n    a=1,  # keep\n    b=2,  # gone\n    # about c\n    c=3,\n)", 1,
         "f(\n    a=1,  # keep\n    # gone\n    # about c\n    c=3,\n)"),
        ("f(x,  # keep\n    y)", 1, "f(x  # keep\n)"),
        ("f(x, y=1)", 1, "f(x)"),
        ("f(x, y=1, z=2)", 1, "f(x, z=2)"),
    ],
)
def test_remove_keeps_every_comment(before, index, after):
    call = cst.parse_expression(before)
    assert isinstance(call, cst.Call)
    assert cst.Module([]).code_for_node(remove_arg(call, call.args[index])) == after


def test_safe_fixes_of_the_issue_example_keep_each_comment_on_its_line():
    code = (
        "import torch\nfrom torch.utils.data import DataLoader\n\nmodel = torch.nn.Linear(2, 2).cuda()\n"
        f"{ISSUE_27}\n"
        "opt = torch.optim.AdamW(model.parameters(),\n    lr=1e-3,  # base lr\n    weight_decay=0.01  # decoupled\n)\n"
        "for x in loader:\n    pass\n"
    )
    fixed = fix_code(code, path="train.py", select=["SF102", "SF401"]).code
    assert fixed == code.replace("8-core box\n)", "8-core box\n    pin_memory=True,\n)").replace(
        "0.01  # decoupled\n)", "0.01,  # decoupled\n    fused=True\n)"
    )
