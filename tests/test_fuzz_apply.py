"""Fuzzing `apply`: it never raises, its output parses, a second run changes nothing, no comment
is lost or written twice, every comment stays at the end of the line of code it was on (issue 27),
and lines no fix is about stay byte for byte (issue 13).

Two generators: training scripts assembled from fragments that most rules fix (with random
aliases, a loop variable or parameter that shadows the torch alias, comments above, inside and at
the end of statements that fixes remove, calls that fixes add arguments to written over several
lines in the layouts people use, most lines ending in a comment, form feeds, decoy lines, and
`\n`, `\r\n` or `\r` line endings), and hypothesmith's arbitrary modules. The default run is 100
scripts and 50 modules, with a fixed seed (about 20 seconds); ``SPEEDFIX_FUZZ_EXAMPLES=4000`` runs
that many training scripts (and half as many arbitrary modules) with fresh random choices."""

from __future__ import annotations

import ast
import difflib
import io
import os
import re
import tokenize
from collections import Counter

import libcst as cst
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from speedfix.engine.analysis import SyntaxProblem
from speedfix.fixes.fixer import FixError, fix_code

EXAMPLES = int(os.environ.get("SPEEDFIX_FUZZ_EXAMPLES", "100"))
pytestmark = pytest.mark.filterwarnings("ignore::SyntaxWarning")  # generated code may say odd things
LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")


def profile(examples: int) -> settings:
    return settings(
        max_examples=examples, deadline=None, derandomize=examples <= 160,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )


# ------------------------------------------------------------------ properties
def comments(code: str) -> Counter[str]:
    tokens = tokenize.generate_tokens(io.StringIO(code).readline)
    return Counter(token.string for token in tokens if token.type == tokenize.COMMENT)


def code_tokens(code: str) -> tuple[list[tuple[str, int]], dict[int, str], dict[int, str]]:
    """The tokens (commas left out: fixes add them; comments in, they tell apart lines of the same
    code) with the line each ends on, the comment at the end of a line after the last token before
    it, and each line's comment."""
    tokens: list[tuple[str, int]] = []
    after: dict[int, str] = {}
    by_line: dict[int, str] = {}
    readline = io.StringIO(code.replace("\r\n", "\n").replace("\r", "\n")).readline
    for token in tokenize.generate_tokens(readline):
        if token.type == tokenize.COMMENT:
            by_line[token.start[0]] = token.string
            if tokens and tokens[-1][1] == token.start[0]:
                after[len(tokens) - 1] = token.string
            tokens.append((token.string, token.start[0]))
        elif token.type != tokenize.NL and token.string != ",":
            tokens.append((token.string or tokenize.tok_name[token.type], token.end[0]))
    return tokens, after, by_line


def assert_comments_stay_on_their_lines(code: str, fixed: str) -> None:
    """Every comment at the end of a line of code is, after the fixes, at the end of a line that
    holds that code, unless the fixes rewrote it. The code is aligned token by token; a line counts as kept when all of its tokens are, each with a neighbour
    (a lone ``)`` could match any other). A kept line's code may now span several lines (a call
    laid out one argument per line; where an added ``x=True`` follows ``y=True``, which ``= True``
    is the old one is a guess): the comment ends one of them. No comment is lost or written twice."""
    assert comments(code) == comments(fixed), "a comment was lost or written twice"
    old, old_after, _ = code_tokens(code)
    new, _, new_by_line = code_tokens(fixed)
    matcher = difflib.SequenceMatcher(None, [t for t, _ in old], [t for t, _ in new], autojunk=False)
    mapped: dict[int, int] = {}
    for i, j, size in matcher.get_matching_blocks():
        mapped.update({i + k: j + k for k in range(size if size > 1 else 0)})
    lines = fixed.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    for last, comment in old_after.items():
        first = last
        while first > 0 and old[first - 1][1] == old[last][1]:
            first -= 1
        if all(k in mapped for k in range(first, last + 1)):
            now = sorted({new[mapped[k]][1] for k in range(first, last + 1)})
            assert comment in {new_by_line.get(line) for line in now}, (
                f"the comment {comment!r} is not at the end of its code any more: {[lines[n - 1] for n in now]}"
            )


def fix(code: str) -> str | None:
    """The fixed code; None when the input is refused as it should be (it does not parse, or
    libcst cannot give it back byte for byte)."""
    try:
        return fix_code(code, path="gen.py", unsafe=True).code
    except SyntaxProblem:
        return None
    except FixError as exc:
        assert "byte for byte" in str(exc), exc  # any other FixError is a fix that broke the code
        return None


def check(code: str, decoys: tuple[str, ...] = ()) -> None:
    first = fix(code)
    if first is None or first == code:
        return  # refused, or nothing to fix: given back as read (even what libcst cannot parse)
    cst.parse_module(first)
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pass
    else:
        ast.parse(first)
        assert_comments_stay_on_their_lines(code, first)
    assert fix(first) == first, "a second apply changed something"
    lines = LINE.findall(first)  # str.splitlines would also split at form feeds
    position = 0
    for decoy in decoys:  # byte for byte, in their order
        assert decoy in lines[position:], f"untouched line changed or lost: {decoy!r}"
        position = lines.index(decoy, position) + 1


def python_modules() -> st.SearchStrategy[str]:
    """hypothesmith's modules; its grammar (seconds to build) is built when the test first draws
    one, not when the module is collected, by every xdist worker, for every run."""
    import hypothesmith

    return hypothesmith.from_grammar()


@profile(max(EXAMPLES // 2, 10))
@given(st.deferred(python_modules))
@example("A\n\\\r\n")  # valid Python that libcst's tokenizer rejects; no torch, so never parsed
def test_arbitrary_modules(code):
    check(code)


# ------------------------------------------------------------------ training scripts
ALIASES = st.sampled_from(["torch", "t", "T", "torch_"])
WORDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz éü½#'\"\\", min_size=0, max_size=12)
FRAGMENTS = [
    "loader = DataLoader(ds, batch_size=32{extra})",
    "x = x.to(device)",
    "y = y.cuda()",
    "opt.zero_grad(set_to_none=False)",
    "total += loss.item()",
    "{t}.cuda.empty_cache()",
    "gc.collect()",
    "{t}.cuda.synchronize()",
    "scaler = {t}.cuda.amp.GradScaler()",
    "print(loss)",
]
# Calls that fixes add arguments to (or take one from), written over several lines by
# `call_lines`: the statement up to `(`, the arguments always there, the optional ones.
CALLS = [
    ("loader = DataLoader(", ["ds"], ["batch_size=32", "shuffle=True", "num_workers=4", "drop_last=True"]),
    ("opt = {t}.optim.AdamW(", ["model.parameters()"], ["lr=1e-3", "weight_decay=0.01", "betas=(0.9, 0.999)"]),
    ("scaler = {t}.cuda.amp.GradScaler(", [], ["init_scale=1024", "enabled=True"]),
    ("x = x.to(", ["device"], ["dtype={t}.float32"]),
    ("opt.zero_grad(", [], ["set_to_none=False"]),
]


@st.composite
def training_scripts(draw) -> tuple[str, tuple[str, ...]]:
    t = draw(ALIASES)
    newline = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    decoys: list[str] = []
    counter = iter(range(10_000))

    def comment() -> str:
        return f"# {draw(WORDS)} {next(counter)}".rstrip()

    def decoy(indent: str) -> list[str]:
        """A line no rule is about: it must come back byte for byte."""
        number = next(counter)
        feed = "\x0c" if not indent and draw(st.booleans()) else ""
        line = f"{feed}{indent}keep_{number} = {number}  # decoy {number}"
        decoys.append(line + newline)
        return [line]

    def noise(indent: str) -> list[str]:
        lines: list[str] = []
        for _ in range(draw(st.integers(0, 2))):
            kind = draw(st.sampled_from(["comment", "decoy", "blank", "feed"]))
            if kind == "comment":
                lines.append(indent + comment())
            elif kind == "decoy":
                lines.extend(decoy(indent))
            elif kind == "blank":
                lines.append("")
            elif not indent:
                lines.append("\x0c")
        return lines

    def call_lines(indent: str, head: str, args: list[str]) -> list[str]:
        """A call in one of the layouts people write, most lines ending in a comment."""
        layout = draw(st.sampled_from(["one line", "one per line", "first on the ( line", "packed"]))
        if layout == "one line" or not args:
            return [f"{indent}{head}{', '.join(args)})"]

        def end() -> str:
            return f"  {comment()}" if draw(st.integers(0, 3)) else ""

        inner = draw(st.sampled_from([indent + "    ", indent + "        ", " " * len(indent + head)]))
        trailing_comma, close_on_last = draw(st.booleans()), draw(st.booleans())
        per_line = 2 if layout == "packed" else 1
        groups = [args[i:i + per_line] for i in range(0, len(args), per_line)]
        lines = [f"{indent}{head}{end()}"]
        if layout != "one per line":  # the first arguments on the `(` line
            lines = [f"{indent}{head}{', '.join(groups.pop(0))}"]
        for number, group in enumerate(groups):
            if draw(st.integers(0, 4)) == 0:
                lines.append(inner + comment())
            lines.append(inner + ", ".join(group))
        for number in range(len(lines)):
            last = number == len(lines) - 1
            if lines[number].strip().startswith("#") or (number == 0 and layout == "one per line"):
                continue
            lines[number] += ("," if not last or trailing_comma else "") + (")" if last and close_on_last else "")
            if not last:
                lines[number] += end()
        if not close_on_last:
            lines[-1] += end()
            lines.append(indent + ")")
        return lines

    def call(indent: str, choice: tuple[str, list[str], list[str]]) -> list[str]:
        head, always, optional = choice
        args = [*always, *(arg for arg in optional if draw(st.booleans()))]
        if head.startswith("loader") and draw(st.integers(0, 5)) == 0:
            args.append("**loader_options")
        return call_lines(indent, head.format(t=t), [arg.format(t=t) for arg in args])

    def fragment(indent: str) -> list[str]:
        if draw(st.integers(0, 2)) == 0:
            text = call("", draw(st.sampled_from(CALLS)))
        else:
            text = [draw(st.sampled_from(FRAGMENTS)).format(
                t=t, extra=draw(st.sampled_from(["", ", shuffle=True", ", num_workers=0"])))]
        lines = [indent + comment()] if draw(st.booleans()) else []
        text[-1] += f"  {comment()}" if draw(st.booleans()) else ""
        if draw(st.integers(0, 3)) == 0:  # under a guard: removing its only statement removes it
            guard = draw(st.sampled_from(["if step % 10 == 0:", "if check(step):"]))
            guard_comment = f"  {comment()}" if draw(st.booleans()) else ""
            return [*lines, indent + guard + guard_comment, *(indent + "    " + line for line in text)]
        return [*lines, *(indent + line for line in text)]

    shadow = draw(st.sampled_from(["none", "loop", "parameter"]))
    in_function = shadow == "parameter" or draw(st.booleans())
    top = "    " if in_function else ""  # the indentation of the training code
    inner = top + "    "
    target = f"{t}, (x, y)" if shadow == "loop" else "step, (x, y)"
    body = [
        f"{top}device = {t}.device('cuda')",
        f"{top}model = Net().to(device)",
        *call(top, CALLS[1]),
        f"{top}total = 0.0",
        *noise(top),
        *(line for _ in range(draw(st.integers(0, 2))) for line in fragment(top)),
        f"{top}for {target} in enumerate(loader):",
        *noise(inner),
        *(line for _ in range(draw(st.integers(0, 3))) for line in fragment(inner)),
        f"{inner}loss = model(x, y)",
        f"{inner}loss.backward()",
        f"{inner}opt.step()",
        *noise(inner),
        *(line for _ in range(draw(st.integers(0, 3))) for line in fragment(inner)),
    ]
    lines = [
        "import gc" if draw(st.booleans()) else "import gc, os",
        "import torch" if t == "torch" else f"import torch as {t}",
        "from torch.utils.data import DataLoader",
        "",
        *noise(""),
    ]
    if in_function:
        params = f"ds, {t}=None" if shadow == "parameter" else "ds"
        lines += [f"def main({params}):", *body, "", 'if __name__ == "__main__":', "    main(data)"]
    else:
        lines += body
    code = newline.join(lines) + newline
    return code, tuple(sorted(decoys, key=code.index))  # in file order


@profile(EXAMPLES)
@given(training_scripts())
def test_generated_training_scripts(script):
    code, decoys = script
    check(code, decoys)
