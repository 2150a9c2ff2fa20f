"""Fuzzing `apply`: it never raises, its output parses, a second run changes nothing, no comment
is lost, and lines no fix is about stay byte for byte (issue 13).

Two generators: training scripts assembled from fragments that most rules fix (with random
aliases, a loop variable or parameter that shadows the torch alias, comments above, inside and at
the end of statements that fixes remove, form feeds, decoy lines, and `\\n`, `\\r\\n` or `\\r` line
endings), and hypothesmith's arbitrary modules. The default run is 160 scripts and 80 modules, with
a fixed seed (about 25 seconds); ``SPEEDFIX_FUZZ_EXAMPLES=5000`` runs that many training scripts
(and half as many arbitrary modules) with fresh random choices.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from collections import Counter

import hypothesmith
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
        assert comments(code) <= comments(first), "a comment was lost"
    assert fix(first) == first, "a second apply changed something"
    lines = LINE.findall(first)  # str.splitlines would also split at form feeds
    position = 0
    for decoy in decoys:  # byte for byte, in their order
        assert decoy in lines[position:], f"untouched line changed or lost: {decoy!r}"
        position = lines.index(decoy, position) + 1


@profile(max(EXAMPLES // 2, 10))
@given(hypothesmith.from_grammar())
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

    def fragment(indent: str) -> list[str]:
        text = draw(st.sampled_from(FRAGMENTS)).format(t=t, extra=draw(st.sampled_from(["", ", shuffle=True", ", num_workers=0"])))
        lines = [indent + comment()] if draw(st.booleans()) else []
        trailing = f"  {comment()}" if draw(st.booleans()) else ""
        if draw(st.integers(0, 3)) == 0:  # under a guard: removing its only statement removes it
            guard = draw(st.sampled_from(["if step % 10 == 0:", "if check(step):"]))
            guard_comment = f"  {comment()}" if draw(st.booleans()) else ""
            return [*lines, indent + guard + guard_comment, indent + "    " + text + trailing]
        return [*lines, indent + text + trailing]

    shadow = draw(st.sampled_from(["none", "loop", "parameter"]))
    in_function = shadow == "parameter" or draw(st.booleans())
    top = "    " if in_function else ""  # the indentation of the training code
    inner = top + "    "
    target = f"{t}, (x, y)" if shadow == "loop" else "step, (x, y)"
    body = [
        f"{top}device = {t}.device('cuda')",
        f"{top}model = Net().to(device)",
        f"{top}opt = {t}.optim.AdamW(model.parameters(), lr=1e-3)",
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
