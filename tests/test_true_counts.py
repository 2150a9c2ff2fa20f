"""Advice per model, and `apply` counts only what it wrote: a GAN's generator and discriminator
(as pytorch/examples' DCGAN trains them, here in bf16) each get their own compile and
channels-last advice."""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from speedfix.engine.findings import Applicability, LossCheck, replace
from speedfix.engine.rule import Rule
from speedfix.fixes.fixer import fix_source
from speedfix.model.versions import v
from speedfix.syntax.source import SourceFile

GAN = """\
import torch
import torch.nn as nn


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.ConvTranspose2d(100, 64, 4), nn.ReLU(), nn.ConvTranspose2d(64, 3, 4))

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Conv2d(3, 64, 4), nn.ReLU(), nn.Conv2d(64, 1, 4))

    def forward(self, x):
        return self.main(x).mean()


device = torch.device("cuda")
netG = Generator().to(device)
netD = Discriminator().to(device)
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4)
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4)
for epoch in range(5):
    for data in dataloader:
        real = data[0].to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            errD = netD(real)
        errD.backward()
        optimizerD.step()
        noise = torch.randn(64, 100, 1, 1, device=device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            errG = netD(netG(noise))
        errG.backward()
        optimizerG.step()
"""


def _codes(run_cli, path: Path) -> list[str]:
    out = run_cli("scan", path.name, "--select", "SF501,SF206", "--no-summary", "--torch-version", "2.4",
                  cwd=path.parent).stdout
    return sorted(line.split(" ")[1] + " " + line.split("`")[1] for line in out.splitlines())


def test_compiling_one_model_leaves_the_other_models_advice(run_cli, write):
    path = write("gan.py", GAN.replace("netD = Discriminator().to(device)\n",
                                       "netD = Discriminator().to(device)\nnetD.compile()\n"))
    assert _codes(run_cli, path) == ["SF206 netD", "SF206 netG", "SF501 netG"]


def test_channels_last_for_one_model_leaves_the_other_models_advice(run_cli, write):
    path = write("gan.py", GAN.replace("netD = Discriminator().to(device)", "netD = Discriminator().to(device, memory_format=torch.channels_last)")
                 .replace("real = data[0].to(device)", "real = data[0].to(device, memory_format=torch.channels_last)"))
    assert _codes(run_cli, path) == ["SF206 netG", "SF501 netD", "SF501 netG"]


def test_a_compile_of_something_unknown_still_settles_every_model(run_cli, write):
    path = write("gan.py", GAN + "step = torch.compile(train_step)\n")
    assert _codes(run_cli, path) == ["SF206 netD", "SF206 netG"]


def test_apply_counts_what_it_wrote_and_lists_what_it_did_not(run_cli, write):
    path = write("gan.py", GAN)
    result = run_cli("apply", "gan.py", "--unsafe-fixes", "--select", "SF501,SF206", "--torch-version", "2.4",
                     cwd=path.parent)
    fixed = path.read_text(encoding="utf-8")
    assert fixed.count(".compile()") == 2 and fixed.count("memory_format=torch.channels_last") == 2
    # two compiles and one model (with its batch) converted: three findings fixed, not four
    assert "Fixed 3 findings in 1 file (SF206 x1, SF501 x2)." in result.stdout
    # the generator's input is noise made on the device, not a copied batch: its advice stays
    assert "1 finding left unfixed:\n  gan.py:24:8: SF206 no single copy of the input batch" in result.stdout
    assert _codes(run_cli, path) == ["SF206 netG"]


class _Silenced(Rule):
    """A rule with the bug apply must not count: one `done()` anywhere silences every `todo()`;
    only the first `todo()` has a fix."""

    code = "SF998"
    name = "silenced-by-any-fix"
    summary = "test rule"
    fix_applicability = Applicability.SAFE
    fix_title = "done"
    loss_check = LossCheck.EXACT

    def finish(self) -> None:
        calls = [site for site in self.ctx.calls if site.func in ("todo", "done")]
        if any(site.func == "done" for site in calls):
            return
        for index, site in enumerate(calls):
            ops = [replace(site.node, cst.parse_expression("done()"))] if index == 0 else None
            self.report(site.node, "todo", fix_ops=ops, no_fix_reason="only the first")


def test_a_finding_that_vanishes_without_its_fix_is_not_counted():
    text = "import torch\ntodo()\ntodo()\n"
    source = SourceFile(Path("t.py"), text.encode(), text, "utf-8")
    outcome = fix_source(source, "t.py", [_Silenced], v("2.4"), unsafe=False)
    assert outcome.code == "import torch\ndone()\ntodo()\n"
    assert outcome.applied == {"SF998": 1}  # one fix written; the other finding merely went quiet
    # ... and it stays listed, where it is in the fixed code, with why it has no fix
    assert [(item.finding.line, item.finding.code, item.reason) for item in outcome.unfixed] == [
        (3, "SF998", "no longer reported after the SF998 fix: not counted as fixed")]
