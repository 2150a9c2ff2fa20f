"""A module the training script hands its parsed options to (`create_optimizer(args, model)`,
`Exp(args)` keeping `self.args`): its `args.opt` has the default of the script's `--opt`, so a
branch the default run skips is not advice about the run; the same for a model that gets them
under another name (`Model(configs)`) and for the files of a model zoo that the runs' options
never pick."""

from __future__ import annotations

import pytest

MAIN = """\
import argparse
import torch
from factory import create_optimizer
from runner import Runner

parser = argparse.ArgumentParser()
parser.add_argument("--opt", default="{opt}")
parser.add_argument("--use_multi_gpu", action="store_true")
args = parser.parse_args()
model = Net().cuda()
optimizer = create_optimizer(args, model)
Runner(args).fit(model, optimizer, loader)
"""

FACTORY = """\
import torch


def create_optimizer(args, model):
    name = args.opt.lower()
    parts = name.split("_")
    name = parts[-1]
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=1e-3)
    elif name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-3)
    return torch.optim.SGD(model.parameters(), lr=0.1)
"""

RUNNER = """\
import torch


class Runner:
    def __init__(self, args):
        self.args = args

    def fit(self, model, optimizer, loader):
        if self.args.use_multi_gpu:
            model = torch.nn.DataParallel(model)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x.cuda()), y.cuda()).backward()
            optimizer.step()
"""


def _scan(run_cli, folder) -> str:
    return run_cli("scan", ".", "--select", "SF401,SF801", "--no-summary", cwd=folder).stdout


def test_a_module_reads_the_options_the_script_hands_it(write, run_cli, tmp_path):
    write("main.py", MAIN.replace("{opt}", "fused_AdamW"))
    write("factory.py", FACTORY)
    write("runner.py", RUNNER)
    found = _scan(run_cli, tmp_path)
    assert "factory.py:11:" in found  # the default run's AdamW
    assert "factory.py:9:" not in found  # `--opt adam` only
    assert "SF801" not in found  # DataParallel only with `--use_multi_gpu`


def test_scripts_that_disagree_on_a_default_leave_it_unknown(write, run_cli, tmp_path):
    write("main.py", MAIN.replace("{opt}", "adamw"))
    write("finetune.py", MAIN.replace("{opt}", "adam"))
    write("factory.py", FACTORY)
    write("runner.py", RUNNER)
    found = _scan(run_cli, tmp_path)
    assert "factory.py:9:" in found and "factory.py:11:" not in found  # the alternatives: one finding for both
    assert "(and so does the other optimizer the same function may make instead)" in found


def test_a_module_no_script_runs_keeps_every_branch(write, run_cli, tmp_path):
    write("factory.py", FACTORY.replace("import torch\n", "import torch\nDEVICE = torch.device('cuda')\n"))
    write("runner.py", RUNNER)
    found = _scan(run_cli, tmp_path)
    assert "factory.py:10:" in found and "runner.py:10:" in found
    assert "(and so does the other optimizer the same function may make instead)" in found  # factory.py:12


SWITCH = """\
import argparse
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--opt", default="adamw")
parser.add_argument("--legacy", action="store_true")
args = parser.parse_args()


def make(model):
    name = args.opt
    {rebind}
    if name == "adam":
        return torch.optim.Adam(model.parameters())
    return torch.optim.SGD(model.parameters(), lr=0.1)


make(Net().cuda())
"""


def test_a_name_rebound_in_straight_line_code_has_its_last_value(write, run_cli, tmp_path):
    write("train.py", SWITCH.replace("{rebind}", 'name = name.upper().lower().split("-")[0]'))
    assert _scan(run_cli, tmp_path) == ""  # "adamw": the Adam branch is not taken
    write("train.py", SWITCH.replace("{rebind}", 'name = "adam"'))
    assert "train.py:14:" in _scan(run_cli, tmp_path)


def test_a_name_rebound_under_a_condition_is_unknown(write, run_cli, tmp_path):
    write("train.py", SWITCH.replace("{rebind}", 'if torch.cuda.device_count() > 1: name = "adam"'))
    assert "train.py:14:" in _scan(run_cli, tmp_path)


def test_a_required_option_has_the_value_each_command_gives(write, run_cli, tmp_path):
    main = MAIN.replace("{opt}", "adamw")
    write("main.py", main.replace('action="store_true"', "type=int, required=True"))
    write("factory.py", FACTORY)
    write("runner.py", RUNNER)
    assert "runner.py:10:" in _scan(run_cli, tmp_path)  # not None: the command gives a GPU count


LOADING = """\
import argparse
from runner import Runner

parser = argparse.ArgumentParser()
parser.add_argument("--num_workers", type=int, default={workers})
args = parser.parse_args()
Runner(args).fit(Net().cuda())
"""

LOADING_RUNNER = """\
import torch
from torch.utils.data import DataLoader


class Runner:
    def __init__(self, args):
        self.args = args

    def loader(self):
        args = self.args
        return DataLoader(make_dataset(), batch_size=32, num_workers=args.num_workers)

    def fit(self, model):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in self.loader():
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x.cuda()), y.cuda()).backward()
            optimizer.step()
"""


def test_an_option_read_through_args_equals_self_args_has_the_scripts_default(write, run_cli, tmp_path):
    """`args = self.args` in a method of a class the script gives its options: `args.num_workers`
    is the script's `--num_workers` default (0: SF101; 8: nothing to say)."""
    write("runner.py", LOADING_RUNNER)
    write("main.py", LOADING.replace("{workers}", "0"))
    found = run_cli("scan", ".", "--select", "SF101", "--no-summary", cwd=tmp_path).stdout
    assert "runner.py:11:" in found and "resolves to 0" in found
    write("main.py", LOADING.replace("{workers}", "8"))
    assert "SF101" not in run_cli("scan", ".", "--select", "SF101", "--no-summary", cwd=tmp_path).stdout


TRAINING = """\
args = parser.parse_args()
model = {built}.cuda()
optimizer = torch.optim.Adam(model.parameters(), fused=True)
for x, y in loader:
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x.cuda()), y.cuda()).backward()
    optimizer.step()
"""


def training_script(head: str, built: str) -> str:
    """A script whose ``head`` imports and defines the options, then trains ``built`` with them."""
    return head + TRAINING.replace("{built}", built)


CONFIGS_MAIN = training_script("""\
import argparse
import torch
from model import Model

parser = argparse.ArgumentParser()
parser.add_argument("--seq_len", type=int, default=336)
parser.add_argument("--pred_len", type=int, default=96)
parser.add_argument("--individual", action="store_true", default=False)
""", "Model(args)")

CONFIGS_MODEL = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, configs):
        super().__init__()
        self.pred_len = configs.pred_len
        self.individual = configs.individual
        self.linear = nn.Linear(configs.seq_len, configs.pred_len)

    def forward(self, x):
        if self.individual:
            out = torch.zeros([x.size(0), self.pred_len]).to(x.device)
            return out + self.linear(x)
        return self.linear(x)
"""


def _sf701(run_cli, folder) -> str:
    return run_cli("scan", ".", "--select", "SF701", "--no-summary", cwd=folder).stdout


def test_a_model_reads_the_scripts_options_under_its_own_name(write, run_cli, tmp_path):
    """LTSF-Linear's `Model(configs)` built with the parsed `args`: `configs.individual` is the
    script's `--individual`, off by default, so the branch it guards runs in no run (no SF701),
    until a launch script passes the flag."""
    write("main.py", CONFIGS_MAIN)
    write("model.py", CONFIGS_MODEL)
    assert _sf701(run_cli, tmp_path) == ""
    write("scripts/individual.sh", "python main.py --seq_len 96 --individual\n")
    assert "model.py:14:" in _sf701(run_cli, tmp_path)


def test_an_object_read_for_other_attributes_is_not_the_options(write, run_cli, tmp_path):
    """A parameter asked for an attribute the scripts define no option of is some other object."""
    write("main.py", CONFIGS_MAIN)
    write("model.py", CONFIGS_MODEL.replace("configs.seq_len", "configs.d_model"))
    assert "model.py:14:" in _sf701(run_cli, tmp_path)


AGENT = """\
import torch


class Agent:
    def __init__(self, net, acktr=False):
        self.net = net
        self.acktr = acktr

    def update(self, values):
        if self.acktr:
            noise = torch.randn(values.size()).cuda()
            values = values + noise
        return values.mean()
"""

AGENT_MAIN = """\
import torch
from agent import Agent

agent = Agent(net, {passed})
for step in range(1000):
    loss = agent.update(net(obs.cuda()))
    loss.backward()
    optimizer.step()
"""


def test_a_constructor_default_another_file_overrides_is_no_default(write, run_cli, tmp_path):
    """`Agent(net, acktr=True)` in the script: `self.acktr` is not its default False there, so the
    ACKTR branch runs (SF701 found); built without it, the branch runs in no run."""
    write("agent.py", AGENT)
    write("main.py", AGENT_MAIN.replace("{passed}", "acktr=True"))
    assert "agent.py:11:" in _sf701(run_cli, tmp_path)
    write("main.py", AGENT_MAIN.replace(", {passed}", ""))
    assert _sf701(run_cli, tmp_path) == ""


# A model zoo picked by an option (`model_dict[args.model].Model(args)`): the files that only the
# entries no run picks reach are not the run's code, so their findings are left out with a note.
PICKED_MAIN = training_script("""\
import argparse
import torch
from exp import build

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="{default}")
""", "build(args)")

PICKER = """\
from models import linear, former, mixer


def build(args):
    model_dict = {"linear": linear, "former": former, "mixer": mixer}
    return model_dict[args.model].Model(args)
"""

ZOO_NET = """\
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

ZOO_MASK = """\
import torch
import torch.nn as nn


class CausalMask(nn.Module):
    def forward(self, x):
        return torch.ones(x.size(0), x.size(0)).to(x.device)
"""


def _zoo(write, default: str = "linear") -> None:
    write("main.py", PICKED_MAIN.replace("{default}", default))
    write("exp.py", PICKER)
    write("models/linear.py", ZOO_NET.replace("{imports}", "").replace(
        "{body}", "return self.fc(x) + torch.zeros(x.shape).to(x.device)"))
    former = ZOO_NET.replace("{imports}", "from layers.masking import CausalMask").replace(
        "self.fc = nn.Linear(8, 8)", "self.fc = nn.Linear(8, 8)\n        self.mask = CausalMask()")
    write("models/former.py", former.replace("{body}", "return self.fc(x) * self.mask(x)"))
    write("models/mixer.py", former.replace("{body}", "return self.fc(x) + self.mask(x)"))
    write("layers/masking.py", ZOO_MASK)


def test_files_only_unpicked_entries_reach_are_left_out(write, run_cli, tmp_path):
    """The run script passes `--model linear` (two folders down): `former` and `mixer`, and the
    mask only they import, run in no run; `linear`'s own finding stays."""
    _zoo(write)
    write("scripts/long/linear.sh", "model_name=linear\npython -u main.py --model $model_name\n")
    found = _sf701(run_cli, tmp_path)
    assert "models/linear.py:11:" in found
    assert "layers/masking.py:7:" not in found
    assert ("layers/masking.py: note: 1 finding left out: the scanned scripts reach this file only through the "
            "`former` and `mixer` entries of a dict indexed by `--model`, which the runs set to `linear`") in found


def test_a_run_that_picks_an_entry_keeps_its_files(write, run_cli, tmp_path):
    _zoo(write)
    write("scripts/long/linear.sh", "python -u main.py --model linear\n")
    write("scripts/long/mixer.sh", "python -u main.py --model mixer\n")
    assert "layers/masking.py:7:" in _sf701(run_cli, tmp_path)


def test_without_launch_commands_the_default_picks(write, run_cli, tmp_path):
    _zoo(write)
    assert "layers/masking.py:7:" not in _sf701(run_cli, tmp_path)
    _zoo(write, default="former")
    assert "layers/masking.py:7:" in _sf701(run_cli, tmp_path)


@pytest.mark.parametrize("name, code", [
    # a second script that builds the mixer itself reaches the mask whatever `--model` says
    ("demo.py", "from models.mixer import Model\nnet = Model(None).cuda()\n"),
    # `former.Model` also built by name in the dict's file: the dict does not decide alone
    ("exp.py", PICKER + "\n\ndef baseline(args):\n    return former.Model(args)\n"),
    # `--model Former` is no key of the dict (the code must map it some other way): unknown
    ("scripts/long/former.sh", "python -u main.py --model Former\n"),
    # the dict's file also takes another name from the module: its layers are the run's
    ("exp.py", "from models.mixer import Model as MixerModel\n" + PICKER),
    # an entry the file also takes by a fixed key: built on every run
    ("exp.py", PICKER + "\n\ndef teacher(args):\n    model_dict = {'linear': linear, 'former': former, 'mixer': mixer}\n"
               "    return model_dict['former'].Model(args)\n"),
    # a command after a separator on its line picks `former`
    ("scripts/long/former.sh", "cd .. && python -u main.py --model former\n"),
])
def test_files_the_run_may_reach_otherwise_keep_their_findings(write, run_cli, tmp_path, name, code):
    _zoo(write)
    write(name, code)
    assert "layers/masking.py:7:" in _sf701(run_cli, tmp_path)


def test_a_command_that_leaves_the_option_out_runs_its_default(write, run_cli, tmp_path):
    """`--model former` by default: a README's `python main.py` trains the former, whatever the
    run scripts pick."""
    _zoo(write, default="former")
    write("scripts/long/linear.sh", "python -u main.py --model linear\n")
    write("README.md", "Train:\n\n```bash\npython main.py\n```\n")
    assert "layers/masking.py:7:" in _sf701(run_cli, tmp_path)


def test_a_constructor_argument_another_file_passes_keeps_its_value(write, run_cli, tmp_path):
    """`Trainer(model, data, num_workers=0)` in main.py: `num_workers` is still 0 for SF101 (only
    the truth of a test becomes unknown when another file passes the argument)."""
    write("trainer.py", """\
import torch
from torch.utils.data import DataLoader


class Trainer:
    def __init__(self, model, data, num_workers=0):
        self.model = model
        self.loader = DataLoader(data, batch_size=32, num_workers=num_workers)
""")
    write("main.py", "import torch\nfrom trainer import Trainer\nTrainer(Net().cuda(), data, num_workers=0)\n")
    found = run_cli("scan", ".", "--select", "SF101", "--no-summary", cwd=tmp_path).stdout
    assert "trainer.py:8:23: SF101" in found and "resolves to 0" in found


@pytest.mark.parametrize("parsed, off", [
    ("tyro.cli(Args)", True),  # CleanRL
    ("pyrallis.parse(config_class=Args)", True),
    ("Args()", True),
    ("Args(compile=True)", False),  # the field is given: not the default
    ("load_args()", False),  # made elsewhere: unknown
])
def test_a_dataclass_a_parser_fills_gives_its_fields_defaults(write, run_cli, tmp_path, parsed, off):
    write("train.py", f"""\
        from dataclasses import dataclass
        import pyrallis
        import torch
        import tyro

        @dataclass
        class Args:
            compile: bool = False

        args = {parsed}
        model = Net().cuda()
        if args.compile:
            model = torch.compile(model)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
        """)
    found = run_cli("scan", "train.py", "--select", "SF501", "--no-summary", cwd=tmp_path).stdout
    assert ("compiled only when `args.compile`, which is off by default" in found) is off
    assert ("SF501" in found) is off


PICKED_BY_AN_IF = """\
import argparse
import torch
from models import Conv, Big

parser = argparse.ArgumentParser()
parser.add_argument("--model", type=str, required=True, default="Conv")
args = parser.parse_args()
if args.model == "Conv":
    model = Conv.Model(args).float().cuda()
else:
    model = Big.Model(args).float().cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for x in torch.randn(100, 8, 8).cuda():
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
"""


@pytest.mark.parametrize("picked, expected", [
    ("Big", ["train.py:11:13: SF501"]),  # the branch every run takes: no convolution, compile where it is built
    ("Conv", ["train.py:9:13: SF501", "train.py:9:13: SF601"]),
])
def test_a_model_an_if_picks_by_the_launch_commands_option_is_the_one_advice_is_about(picked, expected, write, run_cli,
                                                                                      tmp_path):
    """Time-LLM's `if args.model == 'Autoformer': ... else: model = TimeLLM.Model(args)`, with every
    launch script passing `--model TimeLLM`: the convolutions of the branch no run takes are no
    reason for cuDNN advice, and the compile advice points at the model the runs train."""
    write("train.py", PICKED_BY_AN_IF)
    write("models/__init__.py", "")
    for name, layer in (("Conv", "torch.nn.Conv1d(8, 8, 3)"), ("Big", "torch.nn.Linear(8, 8)")):
        write(f"models/{name}.py", f"import torch\n\n\nclass Model(torch.nn.Module):\n    def __init__(self, args):\n"
              f"        super().__init__()\n        self.layer = {layer}\n\n    def forward(self, x):\n"
              "        return self.layer(x)\n")
    write("scripts/run.sh", f"model_name={picked}\npython train.py --model $model_name\n")
    found = run_cli("scan", ".", "--select", "SF501,SF601", "--no-summary", cwd=tmp_path).stdout.splitlines()
    assert [line.split(" ", 2)[0] + " " + line.split(" ", 2)[1] for line in found] == expected
