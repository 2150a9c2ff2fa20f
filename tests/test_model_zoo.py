"""A model zoo picked by an option (`model_dict[args.model].Model(args)`): the files that only the
entries no run picks reach are not the run's code, so their findings are left out with a note."""

from __future__ import annotations

MAIN = """\
import argparse
import torch
from exp import build

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="{default}")
args = parser.parse_args()
model = build(args).cuda()
optimizer = torch.optim.Adam(model.parameters(), fused=True)
for x, y in loader:
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x.cuda()), y.cuda()).backward()
    optimizer.step()
"""

EXP = """\
from models import linear, former, mixer


def build(args):
    model_dict = {"linear": linear, "former": former, "mixer": mixer}
    return model_dict[args.model].Model(args)
"""

NET = """\
import torch
import torch.nn as nn
{imports}

class Model(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        {body}
"""

MASK = """\
import torch
import torch.nn as nn


class CausalMask(nn.Module):
    def forward(self, x):
        return torch.ones(x.size(0), x.size(0)).to(x.device)
"""


def _project(write, default: str = "linear") -> None:
    write("main.py", MAIN.replace("{default}", default))
    write("exp.py", EXP)
    write("models/linear.py", NET.replace("{imports}", "").replace(
        "{body}", "return self.fc(x) + torch.zeros(x.shape).to(x.device)"))
    former = NET.replace("{imports}", "from layers.masking import CausalMask").replace(
        "self.fc = nn.Linear(8, 8)", "self.fc = nn.Linear(8, 8)\n        self.mask = CausalMask()")
    write("models/former.py", former.replace("{body}", "return self.fc(x) * self.mask(x)"))
    write("models/mixer.py", former.replace("{body}", "return self.fc(x) + self.mask(x)"))
    write("layers/masking.py", MASK)


def _scan(run_cli, folder) -> str:
    return run_cli("scan", ".", "--select", "SF701", "--no-summary", cwd=folder).stdout


def test_files_only_unpicked_entries_reach_are_left_out(write, run_cli, tmp_path):
    """The run script passes `--model linear` (two folders down): `former` and `mixer`, and the
    mask only they import, run in no run; `linear`'s own finding stays."""
    _project(write)
    write("scripts/long/linear.sh", "model_name=linear\npython -u main.py --model $model_name\n")
    found = _scan(run_cli, tmp_path)
    assert "models/linear.py:11:" in found
    assert "layers/masking.py:7:" not in found
    assert ("layers/masking.py: note: 1 finding left out: the scanned scripts reach this file only through the "
            "`former` and `mixer` entries of a dict indexed by `--model`, which the runs set to `linear`") in found


def test_a_run_that_picks_an_entry_keeps_its_files(write, run_cli, tmp_path):
    _project(write)
    write("scripts/long/linear.sh", "python -u main.py --model linear\n")
    write("scripts/long/mixer.sh", "python -u main.py --model mixer\n")
    assert "layers/masking.py:7:" in _scan(run_cli, tmp_path)


def test_without_launch_commands_the_default_picks(write, run_cli, tmp_path):
    _project(write)
    assert "layers/masking.py:7:" not in _scan(run_cli, tmp_path)
    _project(write, default="former")
    assert "layers/masking.py:7:" in _scan(run_cli, tmp_path)


def test_a_file_another_script_imports_is_reached(write, run_cli, tmp_path):
    """A second script that builds the mixer itself reaches the mask whatever `--model` says."""
    _project(write)
    write("demo.py", "from models.mixer import Model\nnet = Model(None).cuda()\n")
    assert "layers/masking.py:7:" in _scan(run_cli, tmp_path)


def test_an_entry_named_elsewhere_is_no_pick(write, run_cli, tmp_path):
    """`former.Model` also built by name in the dict's file: the dict does not decide alone."""
    _project(write)
    write("exp.py", EXP + "\n\ndef baseline(args):\n    return former.Model(args)\n")
    assert "layers/masking.py:7:" in _scan(run_cli, tmp_path)


def test_a_run_value_no_entry_holds_keeps_the_files(write, run_cli, tmp_path):
    """`--model Former` is no key of the dict (the code must map it some other way): unknown."""
    _project(write)
    write("scripts/long/former.sh", "python -u main.py --model Former\n")
    assert "layers/masking.py:7:" in _scan(run_cli, tmp_path)
