"""Small, formatting-preserving edits on libcst nodes, shared by the fixes.

A fix should read like the user wrote it: a keyword added to a one-line call stays on that line,
one added to a call laid out one argument per line gets its own line with the same indentation,
and a trailing comma stays where it was.
"""

from __future__ import annotations

from typing import Callable, Sequence

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


# A one-line call that grows past this many characters is laid out one argument per line.
WRAP_AT = 80


def explode(call: cst.Call, indent: str) -> cst.Call:
    """One argument per line, a trailing comma, `)` back at the statement's indentation (for a
    call written on one line: it holds no comment)."""
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
    """``call`` with ``new_args`` added at the end (before a trailing ``**kwargs``), in the call's
    own layout (a one-line call that becomes too long is laid out one argument per line, as black
    would). Every fix that adds an argument goes through here or ``insert_first_arg``."""
    grown = insert_args(call, _append_index(call), new_args, indent)
    code = code_of(call)
    if "\n" in code or "\r" in code or len(code) > WRAP_AT:  # the author's layout, a long line included
        return grown
    return explode(grown, indent) if len(code_of(grown)) > WRAP_AT else grown


def insert_first_arg(call: cst.Call, new: cst.Arg) -> cst.Call:
    """``call`` with ``new`` as its first argument (``GradScaler()`` -> ``GradScaler("cuda")``)."""
    return insert_args(call, 0, (new,))


def _append_index(call: cst.Call) -> int:
    """Where an added argument goes: at the end, or before the ``**kwargs`` that end the call."""
    index = len(call.args)
    while index and call.args[index - 1].star == "**":
        index -= 1
    return index


def insert_args(call: cst.Call, index: int, new_args: Sequence[cst.Arg], indent: str = "    ") -> cst.Call:
    """``call`` with ``new_args`` inserted before its argument number ``index``.

    Every comment stays on the line of the code it was on. In a call laid out one argument per
    line, each new argument gets a line of its own, indented like its neighbours, right after the
    line of the argument before it: the comment at the end of that line stays there, the comment
    lines below it stay above what follows them (the next argument or ``)``). Otherwise (several
    arguments on a line, or ``)`` on the line of the argument before) the new argument joins the
    line of the argument before it. ``indent``: one level of indentation.
    """
    for offset, new in enumerate(new_args):
        call = _insert(call, index + offset, new.with_changes(comma=cst.MaybeSentinel.DEFAULT), indent)
    return call


def _befores(call: cst.Call) -> list[cst.BaseParenthesizableWhitespace]:
    """The whitespace in front of each argument: after ``(``, then after each comma."""
    return [call.whitespace_before_args, *(_comma(arg).whitespace_after for arg in call.args[:-1])]


def _comma(arg: cst.Arg) -> cst.Comma:
    assert isinstance(arg.comma, cst.Comma)  # every argument but the last has one
    return arg.comma


def _one_per_line(befores: list[cst.BaseParenthesizableWhitespace]) -> bool:
    """Does the call give each argument a line of its own (after those written on the ``(``
    line)? ``f(x, z,\n  y=1)`` does not: it packs arguments, a new one joins the last line."""
    breaks = [i for i, ws in enumerate(befores) if isinstance(ws, cst.ParenthesizedWhitespace)]
    if not breaks:
        return False
    packed_first_line = any(isinstance(ws, cst.SimpleWhitespace) for ws in befores[1:breaks[0]])
    packed_later = any(isinstance(ws, cst.SimpleWhitespace) for ws in befores[breaks[0] + 1:])
    return not packed_later and (len(breaks) > 1 or not packed_first_line)


def _line_break(like: cst.ParenthesizedWhitespace, *, first_line: cst.TrailingWhitespace | None = None,
                empty_lines: Sequence[cst.EmptyLine] = (), extra: str = "") -> cst.ParenthesizedWhitespace:
    """A line break to a line indented like the one ``like`` starts (plus ``extra``)."""
    return cst.ParenthesizedWhitespace(
        first_line=first_line if first_line is not None else cst.TrailingWhitespace(newline=like.first_line.newline),
        empty_lines=empty_lines, indent=like.indent, last_line=cst.SimpleWhitespace(like.last_line.value + extra),
    )


def _split(after: cst.ParenthesizedWhitespace, head: cst.ParenthesizedWhitespace
           ) -> tuple[cst.ParenthesizedWhitespace, cst.ParenthesizedWhitespace]:
    """The line break ``after`` an argument, cut where a new line goes in: the end of the
    argument's line (its comment) and a break to a line indented like ``head``; then a clean
    break to what came next, with the comment lines that were above it."""
    return _line_break(head, first_line=after.first_line), _line_break(after, empty_lines=after.empty_lines)


def _insert(call: cst.Call, index: int, new: cst.Arg, indent: str) -> cst.Call:
    args = list(call.args)
    lead = call.whitespace_before_args
    if not args and isinstance(lead, cst.ParenthesizedWhitespace):  # `f(  # comment` / `)`: a line of its own
        return call.with_changes(whitespace_before_args=lead.with_changes(last_line=_line_break(lead, extra=indent).last_line),
                                 args=[new.with_changes(whitespace_after_arg=_line_break(lead))])
    if not args:
        return call.with_changes(args=[new])
    befores = _befores(call)
    own_line = _one_per_line(befores)
    space = cst.SimpleWhitespace(" ")
    if index == 0:
        if own_line and isinstance(lead, cst.ParenthesizedWhitespace):
            opening, rest = _split(lead, lead)
            return call.with_changes(whitespace_before_args=opening,
                                     args=[new.with_changes(comma=cst.Comma(whitespace_after=rest)), *args])
        return call.with_changes(args=[new.with_changes(comma=cst.Comma(whitespace_after=space)), *args])
    previous = args[index - 1]
    comma = previous.comma if isinstance(previous.comma, cst.Comma) else None
    after = comma.whitespace_after if comma is not None else previous.whitespace_after_arg
    line_end: cst.BaseParenthesizableWhitespace = space
    rest = after
    if own_line and isinstance(after, cst.ParenthesizedWhitespace):  # a line break follows `previous`
        before = befores[index - 1]
        if isinstance(before, cst.ParenthesizedWhitespace):  # the line `previous` starts
            head = before
        else:  # `previous` is on the `(` line: the next argument's line, or one level deeper than `)`
            head = after if index < len(args) else _line_break(after, extra=indent)
        line_end, rest = _split(after, head)
    if comma is not None:  # the comma after `previous` (a trailing one included) now follows `new`
        previous = previous.with_changes(comma=comma.with_changes(whitespace_after=line_end))
        new = new.with_changes(comma=comma.with_changes(whitespace_before=NO_SPACE, whitespace_after=rest))
    else:  # `previous` was last, without a trailing comma: neither has one now
        new = new.with_changes(whitespace_after_arg=rest)
        previous = previous.with_changes(comma=cst.Comma(whitespace_after=line_end), whitespace_after_arg=NO_SPACE)
    args[index - 1] = previous
    args.insert(index, new)
    return call.with_changes(args=args)


def remove_arg(call: cst.Call, target: cst.Arg) -> cst.Call:
    """``call`` without ``target``; commas and the line break before ``)`` stay tidy, the comment
    at the end of the line before stays there, and ``target``'s comments stay, on lines of their
    own when ``target`` had its own line."""
    args = list(call.args)
    index = next(i for i, arg in enumerate(args) if arg is target)
    del args[index]
    last = index == len(args)  # nothing but `)` follows
    tail = target.comma.whitespace_after if isinstance(target.comma, cst.Comma) else target.whitespace_after_arg
    if index == 0:
        return call.with_changes(args=args, whitespace_before_args=_joined(call.whitespace_before_args, tail, last))
    previous = args[index - 1]
    comma = _comma(previous)
    if last and not isinstance(target.comma, cst.Comma):  # no trailing comma: `previous` gets none either
        args[index - 1] = previous.with_changes(
            comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=_joined(comma.whitespace_after, tail, last)
        )
    else:
        args[index - 1] = previous.with_changes(comma=comma.with_changes(whitespace_after=_joined(comma.whitespace_after, tail, last)))
    return call.with_changes(args=args)


def _joined(before: cst.BaseParenthesizableWhitespace, after: cst.BaseParenthesizableWhitespace, last: bool
            ) -> cst.BaseParenthesizableWhitespace:
    """The whitespace that replaces ``before`` + a removed argument + ``after`` (``last``: ``)``
    follows): the end of the line before, the removed argument's comment on a line of its own,
    then the start of what follows."""
    if isinstance(before, cst.ParenthesizedWhitespace) and isinstance(after, cst.ParenthesizedWhitespace):
        comment = after.first_line.comment
        own = [cst.EmptyLine(indent=before.indent, whitespace=before.last_line, comment=comment,
                             newline=after.first_line.newline)] if comment is not None else []
        return after.with_changes(first_line=before.first_line, empty_lines=[*before.empty_lines, *own, *after.empty_lines])
    if isinstance(before, cst.ParenthesizedWhitespace):  # the argument shared the line of what follows it
        if not last:
            return before
        keeps = before.first_line.comment is not None or any(line.comment for line in before.empty_lines)
        return before.with_changes(last_line=NO_SPACE) if keeps else after
    if isinstance(after, cst.ParenthesizedWhitespace):  # it shared the line of the argument before
        return after
    return after if last else before


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
