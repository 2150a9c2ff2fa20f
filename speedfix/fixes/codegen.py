"""Small, formatting-preserving edits on libcst nodes, shared by the fixes.

A fix should read like the user wrote it: a keyword added to a one-line call stays on that line,
one added to a call laid out one argument per line gets its own line with the same indentation,
and a trailing comma stays where it was.
"""

from __future__ import annotations

from typing import Callable

import libcst as cst

from speedfix.engine.findings import AddImport, FixOp, InsertStatements, Transform
from speedfix.model.context import FileContext
from speedfix.model.frames import Stack
from speedfix.syntax.names import line_binds
from speedfix.syntax.nodes import code_of

NO_SPACE = cst.SimpleWhitespace("")


def keyword_arg(name: str, value: cst.BaseExpression | str) -> cst.Arg:
    if isinstance(value, str):
        value = cst.parse_expression(value)
    return cst.Arg(
        value=value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=NO_SPACE, whitespace_after=NO_SPACE),
    )


def _separator(call: cst.Call, args: list[cst.Arg]) -> cst.BaseParenthesizableWhitespace:
    """The whitespace the call already puts before an argument (after a comma, or after `(`).

    One argument per line: a line break with the same indentation. Several per line, with the
    odd continuation line: a space, so the new argument joins the last line.
    """
    between = [arg.comma.whitespace_after for arg in args[:-1] if isinstance(arg.comma, cst.Comma)]
    if any(isinstance(ws, cst.SimpleWhitespace) for ws in between):
        return cst.SimpleWhitespace(" ")
    if between:
        return between[-1]
    if isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):
        return call.whitespace_before_args
    return cst.SimpleWhitespace(" ")


# A one-line call that grows past this many characters is laid out one argument per line.
WRAP_AT = 80


def _is_multiline(call: cst.Call) -> bool:
    if isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):
        return True
    return any(
        isinstance(arg.comma, cst.Comma) and isinstance(arg.comma.whitespace_after, cst.ParenthesizedWhitespace)
        for arg in call.args
    )


def explode(call: cst.Call, indent: str) -> cst.Call:
    """One argument per line, a trailing comma, `)` back at the statement's indentation."""
    def newline(extra: str) -> cst.ParenthesizedWhitespace:
        return cst.ParenthesizedWhitespace(indent=True, last_line=cst.SimpleWhitespace(extra))

    args = [
        arg.with_changes(
            comma=cst.Comma(whitespace_after=newline(indent if i < len(call.args) - 1 else "")),
            whitespace_after_arg=NO_SPACE,
        )
        for i, arg in enumerate(call.args)
    ]
    return call.with_changes(args=args, whitespace_before_args=newline(indent))


def append_args(call: cst.Call, *new_args: cst.Arg, indent: str = "    ") -> cst.Call:
    """``call`` with ``new_args`` added at the end, in the call's own layout (a one-line call
    that becomes too long is laid out one argument per line, as black would)."""
    grown = _append(call, new_args)
    if _is_multiline(call) or len(code_of(call)) > WRAP_AT:  # a long line stays the author's choice
        return grown
    return explode(grown, indent) if len(code_of(grown)) > WRAP_AT else grown


def _append(call: cst.Call, new_args: tuple[cst.Arg, ...]) -> cst.Call:
    args = list(call.args)
    for new in new_args:
        if not args:
            args = [new]
            continue
        last = args[-1]
        separator = _separator(call, args)
        if isinstance(last.comma, cst.Comma):
            # Trailing comma: it (and the line break before `)`) moves to the new last argument.
            args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=separator))
            args.append(new.with_changes(comma=last.comma))
        else:
            args[-1] = last.with_changes(
                comma=cst.Comma(whitespace_after=separator), whitespace_after_arg=NO_SPACE
            )
            args.append(new.with_changes(whitespace_after_arg=last.whitespace_after_arg))
    return call.with_changes(args=args)


def insert_first_arg(call: cst.Call, new: cst.Arg) -> cst.Call:
    """``call`` with ``new`` as its first argument (``GradScaler()`` -> ``GradScaler("cuda")``)."""
    args = list(call.args)
    if not args:
        return call.with_changes(args=[new])
    before = call.whitespace_before_args
    separator = before if isinstance(before, cst.ParenthesizedWhitespace) else cst.SimpleWhitespace(" ")
    return call.with_changes(args=[new.with_changes(comma=cst.Comma(whitespace_after=separator)), *args])


def remove_arg(call: cst.Call, target: cst.Arg) -> cst.Call:
    """``call`` without ``target``; commas and the line break before ``)`` stay tidy."""
    args = list(call.args)
    index = next(i for i, arg in enumerate(args) if arg is target)
    del args[index]
    if args and index == len(args):  # removed the last argument
        previous = args[-1]
        args[-1] = previous.with_changes(
            comma=target.comma if isinstance(target.comma, cst.Comma) else cst.MaybeSentinel.DEFAULT,
            whitespace_after_arg=target.whitespace_after_arg,
        )
    return call.with_changes(args=args)


def replace_arg_value(call: cst.Call, target: cst.Arg, value: cst.BaseExpression) -> cst.Call:
    return call.with_changes(args=[arg.with_changes(value=value) if arg is target else arg for arg in call.args])


def find_arg(call: cst.Call, original: cst.Arg) -> cst.Arg | None:
    """The argument of an *updated* call that corresponds to ``original`` (same keyword/slot)."""
    if original.keyword is not None:
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == original.keyword.value:
                return arg
        return None
    return original if any(arg is original for arg in call.args) else None


def value_replaced(call: cst.Call, original: cst.Arg, value: cst.BaseExpression) -> Transform:
    """The op that gives ``call``'s argument ``original`` a new value (seen through earlier edits)."""
    return Transform(call, lambda updated: replace_arg_value(updated, find_arg(updated, original) or original, value))


def arg_removed(call: cst.Call, original: cst.Arg) -> Transform:
    """The op that drops ``call``'s argument ``original``."""
    return Transform(call, lambda updated: remove_arg(updated, find_arg(updated, original) or original))


def reference(ctx: FileContext, qualified: str, ops: list[FixOp], stack: Stack = ()) -> str:
    """Spell ``qualified`` for code inserted at ``stack`` (the frames around the insertion
    point; ``()`` for module level), adding an import when needed. Every fix that writes a
    reference to a module (``torch.``, ``os.``) goes through here.

    ``import torch as t`` gives ``t.compile``, unless ``t`` may hold something else there (``for
    t, batch in enumerate(loader)``); then, as in a file with only ``from torch import nn``,
    ``import torch`` is added once, in the import block, and ``torch.compile`` is used. If
    ``torch`` is taken too, the import gets a name that occurs nowhere in the file
    (``import torch as torch_``).
    """
    local = ctx.local_name_for(qualified, stack)
    if local is not None:
        return local
    top, _, rest = qualified.partition(".")
    name = top if ctx.free_for_import(top, stack) else ctx.unused_name(top)
    ops.append(AddImport(top, asname=None if name == top else name))
    return f"{name}.{rest}" if rest else name


def string_literal(ctx: FileContext, text: str) -> str:
    """A string literal in the file's prevailing quote style."""
    quote = ctx.quote
    return f"{quote}{text}{quote}"


def same_quotes(literal: cst.SimpleString, text: str) -> cst.SimpleString:
    """A string literal holding ``text``, quoted like ``literal`` (the one it replaces)."""
    return cst.SimpleString(f"{literal.prefix}{literal.quote}{text}{literal.quote}")


def statement(code: str, *, blank_line_before: bool = False) -> cst.SimpleStatementLine:
    parsed = cst.parse_statement(code)
    assert isinstance(parsed, cst.SimpleStatementLine)
    if blank_line_before:
        parsed = parsed.with_changes(leading_lines=[cst.EmptyLine()])
    return parsed


def import_anchor(ctx: FileContext, local: str | None) -> cst.SimpleStatementLine | None:
    """The statement after which module-level setup code goes.

    That is the end of the import block holding the import that binds ``local`` (the name the
    new code uses), or the end of the first import block when the import is still to be added
    (libcst's AddImportsVisitor adds it there). None when the module has no import block.
    """
    if not ctx.module_imports:
        return None
    start = ctx.module_imports[0]
    if local is not None:
        start = next((line for line in ctx.module_imports if line_binds(line, local)), None)
        if start is None:
            return None
    body = list(ctx.module.body)
    imports = {id(line) for line in ctx.module_imports}
    index = next(i for i, node in enumerate(body) if node is start)
    while index + 1 < len(body) and id(body[index + 1]) in imports:
        index += 1
    anchor = body[index]
    return anchor if isinstance(anchor, cst.SimpleStatementLine) else None


NO_IMPORT_BLOCK = "no module-level import block to insert the setting after"


def setting_after_imports(ctx: FileContext, qualified: str, render: Callable[[str], str]) -> list[FixOp] | None:
    """Ops that insert ``render(<the file's spelling of qualified>)`` as a statement right after
    the module's import block (None: the module has no import block)."""
    ops: list[FixOp] = []
    spelled = reference(ctx, qualified, ops)
    anchor = import_anchor(ctx, spelled.split(".", 1)[0] if not ops else None)
    if anchor is None:
        return None
    return [InsertStatements(anchor, (statement(render(spelled), blank_line_before=True),)), *ops]


def insert_before(target: cst.BaseStatement, new: cst.SimpleStatementLine) -> Transform:
    """Insert ``new`` before ``target``; comments and blank lines above ``target`` stay on top."""

    def rewrite(updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, (cst.SimpleStatementLine, cst.BaseCompoundStatement))
        moved = new.with_changes(leading_lines=updated.leading_lines)
        return cst.FlattenSentinel([moved, updated.with_changes(leading_lines=[])])

    return Transform(target, rewrite)
