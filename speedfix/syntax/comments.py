"""The comments a statement holds, so that a fix that removes or replaces it can keep them, and
the ones that explain a statement or an argument (a rule leaves a choice alone that a comment
gives a reason for: `num_workers=0,  # h5py handles cannot be forked`).

A comment can sit above a statement (its ``leading_lines``), at the end of one of its lines
(``TrailingWhitespace``), on its own line inside a multi-line expression or an indented block,
or in a block's footer. ``own_lines`` returns all of them in source order as own-line comments
(``EmptyLine``), ready to be put above the next statement or at the end of the block.
"""

from __future__ import annotations

import ast
from typing import Iterator

import libcst as cst


def own_lines(statement: cst.CSTNode, *, keep_trailing: bool = False) -> list[cst.EmptyLine]:
    """``statement``'s leading lines (blank lines included, as written), then every other
    comment in it as an own-line comment. With ``keep_trailing``, the comment at the end of a
    simple statement's line is left out (the caller keeps it on the line)."""
    leading = list(getattr(statement, "leading_lines", ()))
    skip: set[int] = {id(line) for line in leading}
    if keep_trailing and isinstance(statement, cst.SimpleStatementLine):
        skip.add(id(statement.trailing_whitespace))
    inner = [cst.EmptyLine(comment=comment) for comment in _comments(statement, skip)]
    return [*leading, *inner]


def _comments(node: cst.CSTNode, skip: set[int]) -> Iterator[cst.Comment]:
    """Comment nodes below ``node`` in source order (libcst lists children in that order)."""
    todo: list[cst.CSTNode] = [node]
    while todo:
        current = todo.pop()
        if id(current) in skip:
            continue
        if isinstance(current, cst.Comment):
            yield current
            continue
        todo.extend(reversed(current.children))


def statement_comments(statement: cst.BaseStatement) -> list[str]:
    """The comments that belong to ``statement`` as a reader sees it: the block of comment lines
    right above it (no blank line in between) and the one at the end of its (first) line."""
    above: list[str] = []
    for line in getattr(statement, "leading_lines", ()):
        above = [*above, line.comment.value] if line.comment is not None else []
    if isinstance(statement, cst.SimpleStatementLine):
        end = statement.trailing_whitespace.comment
    else:
        body = getattr(statement, "body", None)
        end = body.header.comment if isinstance(body, cst.IndentedBlock) else None
    return above + ([end.value] if end is not None else [])


def argument_comments(call: cst.Call, arg: cst.Arg) -> list[str]:
    """The comments written on ``arg`` of a multi-line call: on the own lines right above it
    (they sit in the previous argument's comma) and at the end of its line."""
    index = next((i for i, a in enumerate(call.args) if a is arg), 0)
    if index > 0:
        comma = call.args[index - 1].comma
        before = comma.whitespace_after if isinstance(comma, cst.Comma) else None
    else:
        before = call.whitespace_before_args
    after = arg.comma.whitespace_after if isinstance(arg.comma, cst.Comma) else arg.whitespace_after_arg
    found = []
    if isinstance(before, cst.ParenthesizedWhitespace):
        found += [line.comment.value for line in before.empty_lines if line.comment is not None]
    if isinstance(after, cst.ParenthesizedWhitespace) and after.first_line.comment is not None:
        found.append(after.first_line.comment.value)
    return found


# Statements that make a comment read as code set aside, not as an explanation.
_CODE_STATEMENTS = (ast.Assign, ast.AugAssign, ast.Import, ast.ImportFrom, ast.FunctionDef,
                    ast.ClassDef, ast.Return, ast.For, ast.While, ast.With, ast.If)
_MAX_CODE_LINES = 12  # a commented-out statement spans this many lines at most


def prose(comments: list[str]) -> list[str]:
    """``comments`` (in source order) without the commented-out code among them: runs of
    consecutive lines that read as Python statements (`# loader = DataLoader(ds,` and its
    continuation lines, `# model.cuda()`). What is left explains the code; old code does not."""
    texts = [comment.lstrip("#").strip() for comment in comments]
    code = [False] * len(texts)
    for start in range(len(texts)):
        for end in range(min(len(texts), start + _MAX_CODE_LINES), start, -1):
            if not any(code[start:end]) and _reads_as_code("\n".join(texts[start:end])):
                code[start:end] = [True] * (end - start)
                break
    return [comment for comment, old in zip(comments, code) if not old]


def _reads_as_code(text: str) -> bool:
    """Statements that do something (an assignment, a call, an import), not a lone word or
    number, which prose can also parse as."""
    if not text or len(text) > 2000:
        return False
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    return bool(tree.body) and all(
        isinstance(node, _CODE_STATEMENTS) or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call))
        or (isinstance(node, ast.AnnAssign) and node.value is not None)  # `Note: h5py` is prose
        for node in tree.body
    )


def arg_has_noqa(arg: cst.Arg) -> bool:
    """Does a `# noqa` comment end the line of ``arg`` in a call laid out one argument per line
    (`nn.Conv2d(3, 32, 3),  # noqa: SF703`)? The comment follows the argument's comma."""
    comma = arg.comma
    if not isinstance(comma, cst.Comma) or not isinstance(comma.whitespace_after, cst.ParenthesizedWhitespace):
        return False
    comment = comma.whitespace_after.first_line.comment
    return comment is not None and "noqa" in comment.value.lower()


def has_noqa(statement: cst.BaseStatement | None) -> bool:
    """Does a `# noqa` comment end the statement's line? Findings a rule folds into one (a
    function's optimizers, a run of statements) leave such a statement apart, so the comment
    suppresses its finding alone."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    comment = statement.trailing_whitespace.comment
    return comment is not None and "noqa" in comment.value.lower()
