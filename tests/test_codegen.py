"""Fix edits keep the call's own layout."""

from __future__ import annotations

import libcst as cst
import pytest

from speedfix.fixes.codegen import append_args, insert_first_arg, keyword_arg, remove_arg


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
        ("f(x,\n  y=1)", "f(x,\n  y=1,\n  a=True)"),
    ],
)
def test_append_keeps_the_layout(before, after):
    assert grow(before, "a") == after


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
