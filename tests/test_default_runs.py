"""What the project's default runs do, read from where real projects say it: an option that is 1
or off by default (`--gradient_accumulation 1`, `--fp16`), options kept as a dict (`config =
vars(parse_args())`), `TrainingArguments` fields a script reads itself, shell variables of a launch
script, a Trainer that never trains, and the arguments a test (not a run) gives a class."""

from __future__ import annotations

import json

import pytest

from speedfix.rules.sf202_no_mixed_precision import NoMixedPrecision
from speedfix.rules.sf401_optimizer_not_fused import OptimizerNotFused


def _findings(run_cli, folder, *select: str) -> list[dict]:
    args = ["scan", ".", "--output-format", "json", *(["--select", ",".join(select)] if select else [])]
    result = run_cli(*args, cwd=folder)
    assert result.exit_code in (0, 1), result.stderr
    return json.loads(result.stdout)


def _at(findings: list[dict], code: str) -> list[tuple[str, int]]:
    return [(f["path"], f["line"]) for f in findings if f["code"] == code]


# the rule's own example: NVIDIA apex only under `--fp16`, off by default
APEX_BEHIND_A_FLAG = next(example.code for example in NoMixedPrecision.INVALID
                          if "--fp16" in example.code and "amp.initialize" in example.code)


def test_apex_behind_a_flag_that_is_off_by_default_is_no_precision_of_the_run(write, run_cli, tmp_path):
    write("train.py", APEX_BEHIND_A_FLAG)
    found = _findings(run_cli, tmp_path, "SF202")
    assert _at(found, "SF202") == [("train.py", 18)]  # the default branch's `loss.backward()`
    assert "`loss.backward()`" in found[0]["message"]
    write("run.sh", "python train.py --fp16\n")  # a launch command turns apex on
    assert _findings(run_cli, tmp_path, "SF202") == []


ACCUMULATION = """\
import argparse
import torch
parser = argparse.ArgumentParser()
parser.add_argument("--gradient_accumulation", type=int, default={default})
args = parser.parse_args()
accumulation = args.gradient_accumulation
model = Net().cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
    loss.backward()
    if (step + 1) % accumulation == 0:
        optimizer.step()
        optimizer.zero_grad()
        print(loss.item())
"""


def test_a_guard_whose_period_is_an_option_of_1_runs_every_step(write, run_cli, tmp_path):
    write("train.py", ACCUMULATION.format(default=1))
    assert _at(_findings(run_cli, tmp_path, "SF301"), "SF301") == [("train.py", 15)]
    write("run.sh", "python train.py --gradient_accumulation 8\n")  # every run accumulates 8 steps
    assert _findings(run_cli, tmp_path, "SF301") == []
    (tmp_path / "run.sh").unlink()
    write("train.py", ACCUMULATION.format(default=16))
    assert _findings(run_cli, tmp_path, "SF301") == []


OPTIONS_AS_A_DICT = """\
import argparse
import torch
from torch.utils.data import DataLoader


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--optimizer", default="SGD", choices=["Adam", "SGD"])
    parser.add_argument("--num_workers", default=4, type=int)
    return parser.parse_args()


def main():
    config = vars(parse_args())
    model = Net().cuda()
    if config["optimizer"] == "Adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = DataLoader(train_set, batch_size=16, shuffle=True, num_workers=config["num_workers"], pin_memory=True)
    for epoch in range(100):
        for x, y in loader:
            loss = model(x.cuda(non_blocking=True)).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
"""


def test_options_kept_as_a_dict_have_their_parser_defaults(write, run_cli, tmp_path):
    write("train.py", OPTIONS_AS_A_DICT)
    found = _findings(run_cli, tmp_path, "SF401", "SF103")
    assert _at(found, "SF401") == []  # Adam is not the default optimizer
    assert _at(found, "SF103") == [("train.py", 20)]  # 4 workers started again every epoch


HELD_ITEMS = """\
import numpy as np
import torch
from torch.utils import data


class Utterances(data.Dataset):
    def __init__(self, clips, crop):
        self.clips = [np.load(path) for path in clips]
        self.crop = crop

    def __getitem__(self, index):
        clip = self.clips[index]
        if clip.shape[0] < self.crop:
            return np.pad(clip, ((0, self.crop - clip.shape[0]), (0, 0)), "constant")
        left = np.random.randint(clip.shape[0] - self.crop)
        return clip[left:left + self.crop, :]

    def __len__(self):
        return len(self.clips)


loader = data.DataLoader(Utterances(paths, 128), batch_size=2, shuffle=True, num_workers=0)
model = Net().cuda()
optimizer = torch.optim.Adam(model.parameters(), fused=True)
for x in loader:
    loss = model(x.cuda()).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_a_dataset_that_only_crops_arrays_it_holds_gains_little_from_workers(write, run_cli, tmp_path):
    write("train.py", HELD_ITEMS)
    found = [f for f in _findings(run_cli, tmp_path, "SF101")]
    assert [(f["line"], f["impact"]) for f in found] == [(22, "low")]
    assert "`Utterances` only crops and reshapes arrays it holds" in found[0]["impact_reason"]
    write("train.py", HELD_ITEMS.replace("clip = self.clips[index]", "clip = np.load(self.paths[index])"))
    assert [f["impact"] for f in _findings(run_cli, tmp_path, "SF101")] == ["high"]  # a file read per item


# the rule's own example: PPO's 64-wide actor and critic, each in a param group of one optimizer
PPO = next(example.code for example in NoMixedPrecision.VALID if "class ActorCritic" in example.code)


def test_narrow_mlps_in_param_groups_of_an_attribute_are_small_models(write, run_cli, tmp_path):
    write("ppo.py", PPO)
    found = _findings(run_cli, tmp_path, "SF201", "SF202", "SF501")
    assert sorted({f["code"] for f in found}) == ["SF501"]  # no TF32 or autocast advice for 64-wide MLPs
    assert found[0]["impact"] == "medium"
    assert "MLPs no wider than 256" in found[0]["impact_reason"]


def test_a_launch_script_variable_made_of_other_variables_names_the_script(write, run_cli, tmp_path):
    write("train.py", APEX_BEHIND_A_FLAG)
    write("run.sh", "path=./\ntrain_path=$path/train.py\ntorchrun --nproc_per_node 8 ${train_path} --fp16\n")
    assert _findings(run_cli, tmp_path, "SF202") == []  # the one run turns apex on
    write("run.sh", "train_path=$1/train.py\ntorchrun --nproc_per_node 8 ${train_path} --fp16\n")
    assert _at(_findings(run_cli, tmp_path, "SF202"), "SF202") == [("train.py", 18)]  # `$1`: no command runs it


HF_SCRIPT = """\
from dataclasses import dataclass, field
import transformers
from transformers import HfArgumentParser, Trainer, TrainingArguments


@dataclass
class ModelArguments:
    model_name_or_path: str = field(default="facebook/opt-125m")


def main():
    parser = HfArgumentParser((ModelArguments, TrainingArguments))
    model_args, training_args = parser.parse_args_into_dataclasses()
    model = transformers.AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
    trainer = Trainer(model=model, args=training_args, train_dataset=train_set)
    {use}


if __name__ == "__main__":
    main()
"""


def test_a_trainer_that_only_evaluates_gets_no_training_advice(write, run_cli, tmp_path):
    write("infer.py", HF_SCRIPT.format(use="print(trainer.evaluate())"))
    write("infer.sh", "python infer.py --output_dir out --fp16 True --do_eval\n")
    assert _findings(run_cli, tmp_path, "SF902") == []
    write("infer.py", HF_SCRIPT.format(use="trainer.train()"))
    assert _at(_findings(run_cli, tmp_path, "SF902"), "SF902")  # the same script training: advised


def test_no_micro_batch_advice_for_a_model_the_launch_names_by_a_variable_set_elsewhere(write, run_cli, tmp_path):
    write("train.py", HF_SCRIPT.format(use="trainer.train()"))
    command = ("torchrun --nproc_per_node 8 train.py --model_name_or_path {model} --output_dir out --bf16 True "
               "--per_device_train_batch_size 1 --gradient_accumulation_steps 8\n")
    write("train.sh", "export MODEL_PATH=$1\n" + command.format(model="$MODEL_PATH"))
    assert not any("micro-batch" in f["message"] for f in _findings(run_cli, tmp_path, "SF902"))
    write("train.sh", command.format(model="facebook/opt-350m"))
    assert any("micro-batch of 1" in f["message"] for f in _findings(run_cli, tmp_path, "SF902"))


LOADER_FROM_TRAINING_ARGUMENTS = """\
import torch
from torch.utils.data import DataLoader
from transformers import HfArgumentParser, TrainingArguments


def main():
    parser = HfArgumentParser((DataArguments, TrainingArguments))
    data_args, training_args = parser.parse_args_into_dataclasses()
    {features}
    loader = DataLoader(train_set, batch_size=8, collate_fn=collator, pin_memory=True,
                        num_workers=training_args.dataloader_num_workers)
    model = VitsModel.from_pretrained("facebook/mms-tts-eng").cuda()
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    for batch in loader:
        loss = model(input_ids=batch["input_ids"].cuda(), labels=batch["labels"].cuda()).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
"""


def test_a_loader_given_the_training_arguments_worker_count_runs_with_their_default(write, run_cli, tmp_path):
    features = 'collator = Collator(feature_extractor=AutoFeatureExtractor.from_pretrained("facebook/mms-tts-eng"))'
    write("train.py", LOADER_FROM_TRAINING_ARGUMENTS.format(features=features))
    found = _findings(run_cli, tmp_path, "SF101")
    assert _at(found, "SF101") == [("train.py", 10)]
    assert "resolves to 0" in found[0]["message"]
    write("run.sh", "python train.py --output_dir out --dataloader_num_workers 8\n")
    assert _findings(run_cli, tmp_path, "SF101") == []


LIGHTNING_MODULE = """\
import torch
from torch import nn
import lightning.pytorch as pl


class Nowcaster(pl.LightningModule):
    def __init__(self, visualize: bool = False):
        super().__init__()
        self.visualize = visualize
        self.net = nn.Sequential(nn.Conv2d(4, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 4, 3, padding=1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        y_hat = self.net(x)
        loss = torch.nn.functional.mse_loss(y_hat, y)
        if self.visualize:
            self.show(y_hat)
        return loss

    def show(self, y_hat):
        picture = y_hat[0].cpu().numpy()
        self.logger.experiment.add_image("y_hat", picture)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-4, fused=True)
"""

RUN = """\
import lightning.pytorch as pl
from nowcaster import Nowcaster

trainer = pl.Trainer(accelerator="gpu", precision="bf16-mixed")
trainer.fit(Nowcaster(), datamodule=DataModule())
"""

TEST = """\
from nowcaster import Nowcaster


def test_it_plots():
    Nowcaster(visualize=True).show(batch)
"""


def test_a_module_that_a_trainer_of_another_file_trains_leaves_cudnn_to_it_and_tests_are_no_runs(write, run_cli, tmp_path):
    write("nowcaster.py", LIGHTNING_MODULE)
    write("tests/test_nowcaster.py", TEST)
    found = _findings(run_cli, tmp_path, "SF601", "SF301")
    assert _at(found, "SF301") == [("nowcaster.py", 21)]  # nothing shows the runs: the test's `visualize=True` counts
    write("run.py", RUN)
    found = _findings(run_cli, tmp_path, "SF601", "SF301", "SF901")
    assert _at(found, "SF601") == []  # the Trainer's `benchmark` is SF901's advice
    assert _at(found, "SF301") == []  # the run builds `Nowcaster()`: plotting is off
    assert any("benchmark=True" in f["message"] for f in found if f["code"] == "SF901")


MICRO_BENCHMARK = """\
import time
import torch


def time_attention(layer, length):
    optimizer = torch.optim.Adam(layer.parameters(), 1e-4)
    hidden = torch.ones(4, length, 512).to("cuda")
    start = time.time()
    for _ in range(1000):
        loss = layer(hidden).pow(2).mean()
        loss.backward()
        optimizer.step()
    print("time per pass:", (time.time() - start) / 1000)


def train(layer, loader):
    optimizer = torch.optim.Adam(layer.parameters(), 1e-4)
    for x in loader:
        loss = layer(x.cuda()).pow(2).mean()
        loss.backward()
        optimizer.step()
"""


def test_a_function_that_times_a_layer_on_inputs_it_makes_is_no_training_run(write, run_cli, tmp_path):
    write("layers.py", MICRO_BENCHMARK)
    result = run_cli("scan", ".", "--output-format", "json", "--select", "SF202,SF701", cwd=tmp_path)
    assert sorted((f["line"], f["code"]) for f in json.loads(result.stdout)) == [(20, "SF202")]  # `train()` only
    shown = run_cli("scan", ".", "--select", "SF202,SF701", cwd=tmp_path)
    assert "in `time_attention()` left out: it times a layer on inputs it makes itself" in shown.stdout + shown.stderr


TRAINER_KWARGS = """\
import pytorch_lightning as pl
from pytorch_lightning.strategies import DDPStrategy


def main():
    trainer_kwargs = dict()
    trainer_kwargs["callbacks"] = []
    trainer_kwargs["strategy"] = DDPStrategy(find_unused_parameters=True)
    {line}
    trainer = pl.Trainer(**trainer_kwargs, accelerator="gpu", devices=8)
    trainer.fit(Model(), data)


if __name__ == "__main__":
    main()
"""


def test_a_trainer_setting_written_into_its_kwargs_dict_is_read(write, run_cli, tmp_path):
    write("train.py", TRAINER_KWARGS.format(line='trainer_kwargs["precision"] = "32-true"'))
    found = _findings(run_cli, tmp_path, "SF901", "SF803")
    assert any('trains in fp32 (`precision="32-true"`)' in f["message"] for f in found)
    assert _at(found, "SF803") == [("train.py", 8)]  # a script that fits a Trainer trains
    write("train.py", TRAINER_KWARGS.format(line='trainer_kwargs["precision"] = "bf16-mixed"'))
    assert not any("fp32" in f["message"] for f in _findings(run_cli, tmp_path, "SF901"))
    conditional = 'if use_fp32:\n        trainer_kwargs["precision"] = "32-true"'  # a run may leave it out: unknown
    write("train.py", TRAINER_KWARGS.format(line=conditional))
    assert not any("fp32" in f["message"] for f in _findings(run_cli, tmp_path, "SF901"))


ACCELERATE_DDP_KWARGS = '''\
"""Train. `accelerate launch --config_file fsdp_config.yaml train.py`"""
import torch
from accelerate import Accelerator, DistributedDataParallelKwargs

accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
model, optimizer, loader = accelerator.prepare(Net(), torch.optim.AdamW(params, fused=True), loader)
for batch in loader:
    loss = model(batch).sum()
    accelerator.backward(loss)
    optimizer.step()
'''


def test_ddp_kwargs_are_not_read_where_every_launch_config_runs_fsdp(write, run_cli, tmp_path):
    write("train.py", ACCELERATE_DDP_KWARGS)
    assert _at(_findings(run_cli, tmp_path, "SF803"), "SF803") == [("train.py", 5)]  # the docstring's config: not here
    write("configs/fsdp.yaml", "distributed_type: FSDP\nnum_processes: 8\n")
    write("run.sh", "accelerate launch --config_file configs/fsdp.yaml train.py\n")
    assert _findings(run_cli, tmp_path, "SF803") == []
    write("configs/ddp.yaml", "distributed_type: MULTI_GPU\nnum_processes: 8\n")
    write("run_ddp.sh", "accelerate launch --config_file configs/ddp.yaml train.py\n")
    assert _at(_findings(run_cli, tmp_path, "SF803"), "SF803") == [("train.py", 5)]  # one run is DDP


def test_a_readme_command_goes_on_after_a_note_behind_its_backslash(write, run_cli, tmp_path):
    write("train.py", HF_SCRIPT.format(use="trainer.train()"))
    write("README.md", "Train:\n\n```bash\npython train.py \\\n    --model_name_or_path gpt2 \\ # or gpt2-medium\n"
                       "    --output_dir out \\\n    --fp16 True\n```\n")
    found = _findings(run_cli, tmp_path, "SF902")
    assert any(f["path"] == "README.md" and "`fp16=True` scales the loss" in f["message"] for f in found), found
    assert not any("neither `bf16` nor `fp16`" in f["message"] for f in found)


SAC_AGENT = """\
import torch
from torch import nn

import utils


class Agent:
    def __init__(self, obs_dim, action_dim, device, hidden=1024):
        self.device = torch.device(device)
        self.critic = nn.Sequential(nn.Linear(obs_dim + action_dim, hidden), nn.ReLU(), nn.Linear(hidden, 1)).to(self.device)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=1e-4, fused=True)

    def update_critic(self, obs, action, target):
        loss = (self.critic(torch.cat([obs, action], -1)) - target).pow(2).mean()
        self.critic_optimizer.zero_grad()
        loss.backward()
        self.critic_optimizer.step()

    def update(self, buffer, step):
        obs, action, target = buffer.sample(1024)
        self.update_critic(obs, action, target)
"""

SAC_TRAIN = """\
import hydra
import torch

import utils


class Workspace:
    def __init__(self, cfg):
        self.env = make_env(cfg.env)
        self.agent = hydra.utils.instantiate(cfg.agent)

    def run(self):
        obs = self.env.reset()
        for step in range(1000000):
            action = self.env.action_space.sample()
            if step > 5000:
                self.agent.update(self.buffer, step)
            obs, reward, done, _ = self.env.step(action)


@hydra.main(config_path="config/train.yaml")
def main(cfg):
    Workspace(cfg).run()
"""


_SAC_AGENT_CONFIG = "  name: sac\n  class: agent.Agent\n  params:\n    obs_dim: ???\n    action_dim: ???\n    device: ${device}\n"


@pytest.mark.parametrize("layout", ["config folder", "one config.yaml"])
def test_a_hydra_0x_agent_gets_its_device_from_the_primary_config_and_updates_between_env_steps(layout, write, run_cli,
                                                                                                tmp_path):
    """The device hydra's primary config names (`device: cuda`) is where the agent the config
    builds (`class: agent.Agent`, `device: ${device}`) trains, in a `config/` folder with a group
    or in the one `config.yaml` beside the script that `@hydra.main(config_path="config.yaml")`
    names. Its updates alternate with environment steps: compiling them is worth a medium."""
    write("agent.py", SAC_AGENT)
    write("utils.py", "def to_np(t):\n    return t.cpu().numpy()\n")  # both import it: hydra builds the agent by name
    if layout == "config folder":
        write("train.py", SAC_TRAIN)
        primary = "config/train.yaml"
        write(primary, "defaults:\n  - agent: sac\nenv: cheetah_run\ndevice: cuda\n")
        write("config/agent/sac.yaml", "agent:\n" + _SAC_AGENT_CONFIG)
    else:
        write("train.py", SAC_TRAIN.replace("config/train.yaml", "config.yaml"))
        primary = "config.yaml"
        write(primary, "env: cheetah_run\ndevice: cuda\nagent:\n" + _SAC_AGENT_CONFIG)
    found = _findings(run_cli, tmp_path, "SF501", "SF201", "SF202")
    assert sorted({(f["path"], f["code"], f["impact"]) for f in found}) == [("agent.py", "SF501", "medium")]
    write(primary, (tmp_path / primary).read_text().replace("device: cuda", "device: cpu"))
    assert _findings(run_cli, tmp_path, "SF501", "SF201", "SF202") == []  # the configured device is the CPU


TOKEN_BATCHES = """\
import torch
from torch.utils.data import DataLoader
from tqdm import tqdm
from transformers import AutoModel, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("bert-base-uncased")
model = AutoModel.from_pretrained("bert-base-uncased").cuda()
loader = DataLoader(texts, batch_size=64, collate_fn=lambda b: tokenizer(b, padding=True, return_tensors="pt"),
                    num_workers=4, pin_memory=True)
optimizer = torch.optim.AdamW(model.parameters(), fused=True)
for step, batch in tqdm(enumerate(loader), total=len(loader)):
    batch = batch.to("cuda")
    loss = model(**batch).last_hidden_state.mean()
    loss.backward()
    optimizer.step()
"""


def test_a_whole_batch_under_tqdm_and_enumerate_may_be_a_batch_encoding_of_token_ids(write, run_cli, tmp_path):
    write("train.py", TOKEN_BATCHES)
    found = _findings(run_cli, tmp_path, "SF104")
    assert [(f["line"], f["impact"]) for f in found] == [(12, "low")]  # a few kilobytes of token ids
    assert found[0]["fix"]["applicability"] == "unsafe"  # `BatchEncoding.to()` took no `non_blocking` before 4.48


def test_a_function_a_star_import_binds_gets_what_its_callers_pass(write, run_cli, tmp_path):
    write("pkg/__init__.py", "from .data import get_loader\n\n__all__ = ['get_loader']\n")
    write("pkg/data.py", "from torch.utils.data import DataLoader\n\n\n"
                         "def get_loader(dataset, batch_size, num_workers=0):\n"
                         "    return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, pin_memory=True)\n")
    train = ("import argparse\nimport torch\nfrom pkg import *\n\nparser = argparse.ArgumentParser()\n"
             "parser.add_argument('--workers', type=int, default=4)\nargs = parser.parse_args()\n"
             "model = Net().cuda()\noptimizer = torch.optim.AdamW(model.parameters(), fused=True)\n"
             "for x in get_loader(train_set, 64{passed}):\n    loss = model(x.cuda(non_blocking=True)).sum()\n"
             "    loss.backward()\n    optimizer.step()\n")
    write("train.py", train.format(passed=""))
    assert _at(_findings(run_cli, tmp_path, "SF101"), "SF101") == [("pkg/data.py", 5)]  # the default, 0 workers
    write("train.py", train.format(passed=", num_workers=args.workers"))
    assert _findings(run_cli, tmp_path, "SF101") == []  # the caller's option, 4 by default


# the rule's own example: 8-bit Adam through an alias, under `--use_8bit_adam`, off by default
EIGHT_BIT_ADAM = next(example.code for example in OptimizerNotFused.INVALID if "--use_8bit_adam" in example.code)


@pytest.mark.parametrize("readme, reported", [
    ("```bash\npython train.py --lr 1e-4\n```\n", True),
    ('```bash\nPROGRAM="train.py --use_8bit_adam --lr 1e-4"\naccelerate launch $PROGRAM\n```\n', False),
    # diffusers-derived READMEs: the quote never closes and the `accelerate launch $PROGRAM` is left out
    ('```bash\nPROGRAM="train.py \\\n    --use_8bit_adam \\\n    --lr=1e-4 \\\n```\n', False),
    ("```bash\nCUDA_VISIBLE_DEVICES=0 python train.py --use_8bit_adam\n```\n", False),
])
def test_a_command_a_variable_holds_is_a_launch_command(readme, reported, write, run_cli, tmp_path):
    """`PROGRAM="train.py --use_8bit_adam ..."`: the variable holds the command a README runs;
    the `else:` branch with `torch.optim.AdamW` is then in no run."""
    write("train.py", EIGHT_BIT_ADAM)
    write("README.md", readme)
    assert bool(_findings(run_cli, tmp_path, "SF401")) is reported


MODULE_MAIN = """\
import argparse
import torch
from torch.utils.data import DataLoader

parser = argparse.ArgumentParser()
parser.add_argument("--num_workers", type=int, default=0)


def main():
    args = parser.parse_args()
    model = Net().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    for x in DataLoader(dataset, batch_size=64, num_workers=args.num_workers, pin_memory=True):
        loss = model(x.cuda(non_blocking=True)).sum()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize("command", ["deepspeed --module pkg.ppo --num_workers 4",
                                     "torchrun --nproc_per_node 8 --module pkg.ppo --num_workers 4",
                                     "python -m pkg.ppo.main --num_workers 4"])
def test_a_module_run_by_its_package_main_takes_the_options_of_the_launch_script(command, write, run_cli, tmp_path):
    """safe-rlhf's `deepspeed --module safe_rlhf.algorithms.ppo ...` runs the package's
    `__main__.py`, which imports `main` from `main.py` and calls it."""
    write("pkg/__init__.py", "")
    write("pkg/ppo/__init__.py", "")
    write("pkg/ppo/__main__.py", "import sys\n\nfrom pkg.ppo.main import main\n\nif __name__ == '__main__':\n"
                                 "    sys.exit(main())\n")
    write("pkg/ppo/main.py", MODULE_MAIN)
    assert _at(_findings(run_cli, tmp_path, "SF101"), "SF101") == [("pkg/ppo/main.py", 13)]
    write("scripts/train.sh", f"#!/bin/bash\n{command}\n")
    assert _findings(run_cli, tmp_path, "SF101") == []


IMAGENET = """\
import argparse
import torch
import torch.multiprocessing as mp

parser = argparse.ArgumentParser()
parser.add_argument("--world-size", default=-1, type=int)
parser.add_argument("--multiprocessing-distributed", action="store_true")
parser.add_argument("--gpu", default=None, type=int)


def main():
    args = parser.parse_args()
    args.distributed = args.world_size > 1 or args.multiprocessing_distributed
    if args.multiprocessing_distributed:
        mp.spawn(main_worker, nprocs=8, args=(args,))
    else:
        main_worker(args.gpu, args)


def main_worker(gpu, args):
    model = Net()
    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model.cuda(gpu), device_ids=[gpu])
    else:
        model = torch.nn.DataParallel(model).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = model(x.cuda(non_blocking=True)).sum()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize("readme, reported", [
    ("python main.py data/", True),
    ("python main.py --multiprocessing-distributed --world-size 1 data/", False),  # `args.distributed` is True
    # MoCo's README shows its changes to the ImageNet example: a `diff` reads the script, it runs nothing
    ("diff main.py <(curl https://example.org/imagenet/main.py)\n"
     "python main.py --multiprocessing-distributed --world-size 1 data/", False),
])
def test_data_parallel_only_on_a_path_the_launch_commands_take(readme, reported, write, run_cli, tmp_path):
    """pytorch/examples' ImageNet (and MoCo): `args.distributed` is derived from the options, and
    DataParallel is the branch for a run without `--multiprocessing-distributed`."""
    write("main.py", IMAGENET)
    write("README.md", f"```\n{readme}\n```\n")
    assert bool(_findings(run_cli, tmp_path, "SF801")) is reported


PPO_LOOP = """\
import torch
from torch.utils.data import DataLoader

model = Policy().cuda()
optimizer = torch.optim.AdamW(model.parameters(), fused=True)
prompt_loader = DataLoader(prompts, batch_size=16, num_workers=4)
for prompt_batch in prompt_loader:
    rollouts = generate(model, prompt_batch.cuda())
    for micro_batch in split(rollouts):
        loss = ppo_loss(model, micro_batch)
        loss.backward()
        optimizer.step()
"""


def test_a_loader_around_the_step_loop_feeds_training(write, run_cli, tmp_path):
    """PPO: each prompt batch is rolled out, then its micro-batches are trained on in an inner
    loop. The prompt loader feeds the training, and its batches are copied to the GPU."""
    write("ppo.py", PPO_LOOP)
    assert _at(_findings(run_cli, tmp_path, "SF102"), "SF102") == [("ppo.py", 6)]


INFORMER = """\
import torch
from torch.utils.data import DataLoader


class Exp:
    def __init__(self, args):
        self.args = args
        self.model = Net().cuda()

    def _get_data(self, flag):
        data_set = Dataset_Custom(self.args.root_path, flag=flag)
        data_loader = DataLoader(data_set, batch_size=32, shuffle=flag == "train", num_workers=8)
        return data_set, data_loader

    def train(self):
        train_data, train_loader = self._get_data(flag="train")
        optimizer = torch.optim.Adam(self.model.parameters(), fused=True)
        for epoch in range(10):
            for batch_x, batch_y in train_loader:
                loss = (self.model(batch_x.float().cuda()) - batch_y.float().cuda()).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

    def test(self):
        data_loader = DataLoader(Dataset_Custom(self.args.root_path, flag="test"), batch_size=1)
        with torch.no_grad():
            for batch_x, batch_y in data_loader:
                self.model(batch_x.float().cuda())
"""


def test_a_loader_a_method_returns_in_a_tuple_feeds_the_loop_that_unpacks_it(write, run_cli, tmp_path):
    """Informer, Autoformer, Crossformer: `train_data, train_loader = self._get_data(flag="train")`
    with `return data_set, data_loader`; another method binds a `data_loader` of its own for the test."""
    write("exp.py", INFORMER)
    assert _at(_findings(run_cli, tmp_path, "SF102"), "SF102") == [("exp.py", 12)]


VALIDATION_AUTOCAST = """\
import torch
from diffusers import DiffusionPipeline, UNet2DConditionModel


def log_validation(unet, args):
    pipeline = DiffusionPipeline.from_pretrained(args.model, unet=unet, torch_dtype=torch.float16).to("cuda")
    with torch.autocast("cuda"):
        images = pipeline(args.prompt).images
    return images


def main(args):
    unet = UNet2DConditionModel.from_pretrained(args.model, subfolder="unet").cuda()
    optimizer = torch.optim.AdamW(unet.parameters(), fused=True)
    for step, batch in enumerate(loader):
        loss = (unet(batch["x"].cuda(), batch["t"].cuda(), batch["c"].cuda()).sample - batch["y"].cuda()).pow(2).mean()
        loss.backward()
        optimizer.step()
        if step % 500 == 0:
            log_validation(unet, args)
"""


def test_an_autocast_and_a_pipeline_in_16_bit_for_validation_are_not_the_training_precision(write, run_cli, tmp_path):
    """diffusers' training scripts: `log_validation` loads a pipeline in fp16 and runs it under
    `torch.autocast("cuda")`; the steps train the UNet in fp32."""
    write("train.py", VALIDATION_AUTOCAST)
    assert [f["line"] for f in _findings(run_cli, tmp_path, "SF202")] == [17]


PARTIAL_ADD_ARG = """\
import argparse
import functools

from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, WhisperForConditionalGeneration

from utils import add_arguments

parser = argparse.ArgumentParser()
add_arg = functools.partial(add_arguments, argparser=parser)
add_arg("fp16", type=bool, default=True, help="train in fp16")
add_arg("num_workers", type=int, default=8, help="loader workers")
args = parser.parse_args()

model = WhisperForConditionalGeneration.from_pretrained("openai/whisper-tiny")
training_args = Seq2SeqTrainingArguments(output_dir="out", fp16=args.fp16, dataloader_num_workers=args.num_workers,
                                         optim="adamw_torch_fused", torch_compile=True)
Seq2SeqTrainer(model=model, args=training_args, train_dataset=train_set).train()
"""


@pytest.mark.parametrize("command, fp16_advice", [("", True), ("python finetune.py --fp16=False\n", False)])
def test_options_a_partial_of_an_add_arguments_helper_defines(command, fp16_advice, write, run_cli, tmp_path):
    """PaddlePaddle's `add_arguments` helper behind `functools.partial(add_arguments,
    argparser=parser)` (Whisper-Finetune): `add_arg("fp16", type=bool, default=True)` is `--fp16`."""
    write("finetune.py", PARTIAL_ADD_ARG)
    write("utils.py", "def add_arguments(argname, type, default, help, argparser, **kwargs):\n"
                      "    argparser.add_argument('--' + argname, default=default, type=type, help=help, **kwargs)\n")
    if command:
        write("run.sh", command)
    found = _findings(run_cli, tmp_path, "SF902")
    assert any("`fp16=True` scales the loss" in f["message"] for f in found) is fp16_advice, found


# the module run by its package's `__main__.py` above, with the worker count reset by `set_defaults`
SET_DEFAULTS = MODULE_MAIN.replace('parser.add_argument("--num_workers", type=int, default=0)\n',
                                   'parser.add_argument("--num_workers", type=int, default=8)\n'
                                   'parser.set_defaults(num_workers={workers})\n')


@pytest.mark.parametrize("workers, reported", [(0, True), (8, False)])
def test_a_default_parser_set_defaults_sets_wins_over_the_arguments_own(workers, reported, write, run_cli, tmp_path):
    """diffpool: `parser.set_defaults(num_workers=1, ...)` after the `add_argument` calls."""
    write("train.py", SET_DEFAULTS.format(workers=workers))
    assert bool(_findings(run_cli, tmp_path, "SF101")) is reported
