"""Per-finding fix previews (JSON/SARIF/Markdown) cost what the fix changes, not findings x file
size, and say exactly what a whole-module preview says (speedfix.fixes.previews)."""

from __future__ import annotations

import difflib
import textwrap
from pathlib import Path

import pytest

from speedfix.commands.scan import attach_fix_details
from speedfix.engine.analysis import analyze
from speedfix.fixes.fixer import preview
from speedfix.syntax.source import split_lines
from speedfix.syntax.source import SourceFile, decode_source
from speedfix.workspace.config import Settings

SCRIPTS = {
    "every rule": """\
        import gc
        import torch
        from torch.utils.data import DataLoader


        # The model.
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = torch.nn.Conv2d(3, 8, 3)
                self.bn = torch.nn.BatchNorm2d(8)


        def train(data):
            device = torch.device("cuda")
            model = Net().to(device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            scaler = torch.cuda.amp.GradScaler()
            loader = DataLoader(data, batch_size=32)
            for step, (x, y) in enumerate(loader):
                x = x.to(device)
                optimizer.zero_grad(set_to_none=False)
                with torch.cuda.amp.autocast():
                    loss = model(x).sum()
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                print(loss.item())
                # free memory
                torch.cuda.empty_cache()
            gc.collect()
    """,
    "imports added (os, and torch under a loop variable's alias)": """\
        import torch as t
        from torch.utils.data import DataLoader

        def main(data):
            loader = DataLoader(data, batch_size=64)
            for t, (x, y) in enumerate(loader):
                loss = model(x.cuda(non_blocking=True)).sum()
                loss.backward()
                opt.step()

        def other(data):
            loader = DataLoader(data, batch_size=8)
            return loader

        if __name__ == "__main__":
            main(data)
    """,
}


def whole_module_details(analysis, original):
    """What the report said before previews.py: every fix applied to the whole module."""
    details = {}
    for finding in analysis.findings:
        fixed = preview(analysis, finding) if finding.fix is not None else None
        if fixed is None or fixed == original:
            continue
        old, new = split_lines(original), split_lines(fixed)
        diff = "".join(difflib.unified_diff(old, new, "a/train.py", "b/train.py"))
        opcodes = difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes()
        edits = [(i1 + 1, i2 + 1, "".join(new[j1:j2])) for tag, i1, i2, j1, j2 in opcodes if tag != "equal"]
        details[(finding.code, finding.line, finding.column)] = (edits, diff)
    return details


@pytest.mark.parametrize("name", SCRIPTS)
def test_previews_say_what_a_whole_module_preview_says(name):
    code = textwrap.dedent(SCRIPTS[name])
    data = code.encode()
    settings = Settings()
    analysis = analyze(SourceFile(Path("train.py"), data, *decode_source(data)), "train.py", settings.rules(), settings.target)
    expected = whole_module_details(analysis, code)
    attach_fix_details(analysis, code)
    got = {
        (f.code, f.line, f.column): ([(e.line, e.end_line, e.content) for e in f.edits], f.diff)
        for f in analysis.findings
        if f.edits
    }
    assert len(expected) >= 5
    assert got == expected


def test_details_of_a_module_with_many_findings_stay_cheap(monkeypatch):
    """Counted, not timed: no finding's preview transforms the whole module."""
    import speedfix.fixes.fixer as fixer

    block = textwrap.dedent(SCRIPTS["every rule"]).split("def train(data):")[1]
    code = "#!/usr/bin/env python\n# a header comment\nimport torch\nimport os\nfrom torch.utils.data import DataLoader\n" + "".join(
        f"\ndef train_{i}(data):{block}" for i in range(6)  # each with a finding of every fixable rule
    )
    data = code.encode()
    settings = Settings()
    analysis = analyze(SourceFile(Path("train.py"), data, *decode_source(data)), "train.py", settings.rules(), settings.target)
    whole = []
    real = fixer.apply_fixes
    monkeypatch.setattr(fixer, "apply_fixes", lambda module, fixes, only=None: whole.append(only is None) or real(module, fixes, only=only))
    monkeypatch.setattr("speedfix.fixes.previews.apply_fixes", fixer.apply_fixes)
    attach_fix_details(analysis, code)
    fixable = [f for f in analysis.findings if f.edits]
    assert len(fixable) > 40  # 44: a whole-module preview each would be counted 44 times
    assert sum(whole) <= 3  # one per distinct added import or module-level insertion
