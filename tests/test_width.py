"""Lines a fix writes stay within 120 characters, laid out as black would; the author's own long
lines that no fix touches stay as they are (issue 26: pytorch/examples' super_resolution and
siamese_network got 130-150 character lines from `pin_memory=True` and `non_blocking=True`)."""

from __future__ import annotations

import ast
import textwrap

from speedfix.fixes.fixer import fix_code
from speedfix.fixes.width import MAX_WIDTH

SCRIPT = textwrap.dedent("""\
    import torch
    from torch.utils.data import DataLoader

    # an author's long comment line that no fix touches stays exactly as it is, however long it may be, even past 120 ........
    training_data_loader = DataLoader(dataset=train_set, num_workers=opt.threads, batch_size=opt.batchSize, shuffle=True)

    def train(model, optimizer):
        for batch_idx, (images_1, images_2, targets) in enumerate(training_data_loader):
            images_1, images_2, targets = images_1.to("cuda"), images_2.to("cuda"), targets.to("cuda")
            loss = model(images_1, images_2, targets).sum()
            loss.backward()
            optimizer.step()
""")


def test_fixed_lines_are_wrapped_and_untouched_lines_kept():
    outcome = fix_code(SCRIPT, path="train.py", select=["SF102", "SF104"])
    code = outcome.code
    ast.parse(code)
    original = set(SCRIPT.splitlines())
    added = [line for line in code.splitlines() if line not in original]
    assert added and all(len(line) <= MAX_WIDTH for line in added)
    assert max(len(line) for line in SCRIPT.splitlines()) > MAX_WIDTH  # an untouched long line is kept
    assert "    pin_memory=True,\n)" in code  # the loader, one argument per line
    assert textwrap.indent(textwrap.dedent("""\
        images_1, images_2, targets = (
            images_1.to("cuda", non_blocking=True),
            images_2.to("cuda", non_blocking=True),
            targets.to("cuda", non_blocking=True),
        )
        """), "        ") in code  # the values of a tuple assignment, one per line
    assert "# an author's long comment line" in code and code.count("........") == 1
    assert fix_code(code, path="train.py", select=["SF102", "SF104"]).code == code  # stable
