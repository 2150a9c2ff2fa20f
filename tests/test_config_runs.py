"""What a config-driven project's runs use: the classes its run configs train (`configs/*.yaml`
naming `model: {target: ...}` or LightningCLI's `class_path:`), the `trainer:` sections of its
LightningCLI configs, and the YAML a script loads itself (`yaml.safe_load` of an argparse
default) and passes to a Lightning `Trainer`. Small projects, scanned from their folder.
"""

from __future__ import annotations

MODELS = """\
import torch
import lightning as L


class Autoencoder(L.LightningModule):
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class Distilled(Autoencoder):
    pass


class WithCritic(Autoencoder):
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-4)
"""


def test_no_optimizer_advice_for_a_module_no_run_config_trains(write, run_cli, tmp_path):
    write("pkg/models.py", MODELS)
    write("configs/small.yaml", "model:\n  target: pkg.models.Distilled\n  params:\n    width: 64\n")
    result = run_cli("scan", ".", "--select", "SF401", "--no-summary", cwd=tmp_path)
    assert result.stdout.splitlines() == [  # Distilled runs Autoencoder's method; WithCritic is never trained
        "pkg/models.py:7:16: SF401 [*] `Adam` runs its update as several kernels per step; `fused=True` does it "
        "in one (impact: low)",
    ]
    write("configs/critic.yaml", "model:\n  target: pkg.models.WithCritic\n")
    assert run_cli("scan", ".", "--select", "SF401", "--no-summary", cwd=tmp_path).stdout.count("SF401") == 2


def test_a_lightning_cli_optimizer_replaces_the_modules_own(write, run_cli, tmp_path):
    write("src/pkg/models.py", MODELS)
    write("experiments/run.yaml", "model:\n  class_path: pkg.models.Autoencoder\noptimizer:\n"
          "  class_path: torch.optim.AdamW\n  init_args:\n    lr: 0.001\ntrainer:\n  precision: bf16-mixed\n")
    assert "SF401" not in run_cli("scan", ".", "--select", "SF401", "--no-summary", cwd=tmp_path).stdout
    write("experiments/run.yaml", "model:\n  class_path: pkg.models.Autoencoder\n")
    assert "models.py:7:16: SF401" in run_cli("scan", ".", "--select", "SF401", "--no-summary", cwd=tmp_path).stdout


# ---------------------------------------------------------------------- a YAML the script loads itself
RUNNER = """\
import argparse
import yaml
from pytorch_lightning import Trainer

parser = argparse.ArgumentParser()
parser.add_argument("--config", "-c", dest="filename", default="configs/gan.yaml")
args = parser.parse_args()
with open(args.filename) as handle:
    config = yaml.safe_load(handle)
trainer = Trainer(logger=None, **config["trainer"])
trainer.fit(Model(**config["model"]))
"""


def test_a_trainer_given_a_section_of_the_yaml_the_script_loads(write, run_cli, tmp_path):
    write("run.py", RUNNER)
    write("configs/gan.yaml", "model:\n  width: 64\n\ntrainer:\n  gpus: [0]\n  max_epochs: 30\n")
    result = run_cli("scan", "run.py", "--select", "SF901", "--no-summary", cwd=tmp_path)
    assert ("configs/gan.yaml:4:1: SF901 The `Trainer` given `config[\"trainer\"]` (configs/gan.yaml) trains in fp32 "
            "(`precision` defaults to 32): bf16 mixed precision runs on the tensor cores") in result.stdout
    write("configs/gan.yaml", "trainer:\n  gpus: [0]\n  precision: bf16\n")
    assert "fp32" not in run_cli("scan", "run.py", "--select", "SF901", "--no-summary", cwd=tmp_path).stdout
    write("configs/gan.yaml", "trainer:\n  accelerator: cpu\n")  # a CPU run: nothing to say
    assert run_cli("scan", "run.py", "--select", "SF901", "--no-summary", cwd=tmp_path).stdout == ""


# ---------------------------------------------------------------------- LightningCLI configs of the project
def test_lightning_cli_reads_the_projects_config_when_no_launch_command_names_one(write, run_cli, tmp_path):
    write("src/tool/main.py", "from lightning.pytorch.cli import LightningCLI\n\n\ndef main():\n    LightningCLI()\n")
    write("experiments/run.yaml", "model:\n  class_path: tool.Model\ntrainer:\n  max_epochs: 5\n  precision: bf16-mixed\n")
    assert "fp32" not in run_cli("scan", ".", "--select", "SF901", "--no-summary", cwd=tmp_path).stdout
    write("experiments/run.yaml", "model:\n  class_path: tool.Model\ntrainer:\n  max_epochs: 5\n")
    result = run_cli("scan", ".", "--select", "SF901", "--no-summary", cwd=tmp_path)
    assert "experiments/run.yaml:3:1: SF901 The `Trainer` LightningCLI builds trains in fp32" in result.stdout
    write("experiments/other.yaml", "model:\n  class_path: tool.Model\ntrainer:\n  precision: 16-mixed\n")
    assert "fp32" not in run_cli("scan", ".", "--select", "SF901", "--no-summary", cwd=tmp_path).stdout  # they disagree


# ---------------------------------------------------------------------- Lightning 1.x with `--base` YAMLs
MAIN_1X = """\
import argparse
from omegaconf import OmegaConf
from pytorch_lightning import Trainer

parser = argparse.ArgumentParser()
parser.add_argument("--base", nargs="*", default=[])
parser = Trainer.add_argparse_args(parser)
opt, unknown = parser.parse_known_args()
config = OmegaConf.merge(*[OmegaConf.load(path) for path in opt.base])
trainer_opt = argparse.Namespace(**config.get("lightning", {}).get("trainer", {}))
trainer_kwargs = dict()
trainer_kwargs["logger"] = make_logger()
trainer_kwargs["callbacks"] = make_callbacks()
trainer = Trainer.from_argparse_args(trainer_opt, **trainer_kwargs)
trainer.fit(model, data)
"""


def test_from_argparse_args_with_the_yaml_files_of_the_launch_commands(write, run_cli, tmp_path):
    write("main.py", MAIN_1X)
    write("README.md", "Train with\n```\npython main.py --base configs/vqgan.yaml --gpus 0,\n```\n")
    write("configs/vqgan.yaml", "model:\n  target: models.VQModel\n")
    result = run_cli("scan", "main.py", "--select", "SF901", "--no-summary", cwd=tmp_path)
    assert "main.py:14:11: SF901 The `Trainer` `from_argparse_args` builds trains in fp32 (`precision` defaults to 32)" \
        in result.stdout  # the `**trainer_kwargs` dict sets only the logger and the callbacks
    assert "benchmark" not in result.stdout  # nothing says what models.VQModel is
    write("models.py", "from torch import nn\nfrom layers import Encoder\n\n\nclass VQModel(nn.Module):\n"
          "    def __init__(self):\n        super().__init__()\n        self.encoder = Encoder()\n")
    write("layers.py", "from torch import nn\n\n\nclass Encoder(nn.Module):\n    def __init__(self):\n"
          "        super().__init__()\n        self.conv = nn.Conv2d(3, 64, 3)\n")
    result = run_cli("scan", "main.py", "--select", "SF901", "--no-summary", cwd=tmp_path).stdout
    assert "trains a conv net with cuDNN's default algorithms" in result  # VQModel's Encoder has convolutions
    write("configs/vqgan.yaml", "model:\n  target: models.VQModel\nlightning:\n  trainer:\n    precision: 16\n")
    assert "fp32" not in run_cli("scan", "main.py", "--select", "SF901", "--no-summary", cwd=tmp_path).stdout


# ---------------------------------------------------------------------- Hugging Face with DeepSpeed
HF_PARSED = """\
from transformers import HfArgumentParser, Trainer, TrainingArguments

(training_args,) = HfArgumentParser((TrainingArguments,)).parse_args_into_dataclasses()
Trainer(model=model, args=training_args, train_dataset=data).train()
"""


def test_no_optim_advice_where_deepspeed_builds_the_optimizer(write, run_cli, tmp_path):
    write("run_clm.py", HF_PARSED)
    write("README.md", "```\ndeepspeed run_clm.py --deepspeed ds_a.json --fp16\n```\n"
          "```\ndeepspeed run_clm.py --deepspeed ds_b.json --fp16\n```\n")
    write("ds_a.json", '{"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}\n')
    write("ds_b.json", '{"zero_optimization": {"stage": 2}}\n')
    scan = ["scan", "run_clm.py", "--select", "SF902", "--torch-version", "2.4", "--no-summary"]
    assert "(`optim`)" in run_cli(*scan, cwd=tmp_path).stdout  # ds_b.json leaves it to the Trainer
    write("ds_b.json", '{"optimizer": {"type": "Adam"}, "zero_optimization": {"stage": 2}}\n')
    result = run_cli(*scan, cwd=tmp_path).stdout
    assert "(`optim`)" not in result and "(`torch_compile`)" in result
    write("requirements.txt", "transformers==4.7.0\ndeepspeed\n")  # no `torch_compile` option yet
    assert "torch_compile" not in run_cli(*scan, cwd=tmp_path).stdout


# ---------------------------------------------------------------------- the GPUs the job scripts ask for
MLP = """\
import torch
model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = torch.nn.functional.cross_entropy(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
    loss.backward()
    optimizer.step()
"""
JOB = "#!/bin/bash\n#SBATCH --ntasks=1\n#SBATCH --gres=gpu:{gpu}:4\n\nsrun python train.py --epochs=10\n"


def test_no_tf32_advice_where_every_job_script_asks_for_a_pre_ampere_gpu(write, run_cli, tmp_path):
    write("train.py", MLP)
    scan = ["scan", "train.py", "--select", "SF201", "--no-summary"]
    assert "SF201" in run_cli(*scan, cwd=tmp_path).stdout  # no job script: the GPU is unknown
    write("run-v100.sh", JOB.format(gpu="v100"))
    assert run_cli(*scan, cwd=tmp_path).stdout == ""
    write("run-a100.sh", JOB.format(gpu="a100"))  # one run on an A100: TF32 helps there
    assert "SF201" in run_cli(*scan, cwd=tmp_path).stdout


def test_no_tf32_advice_for_a_job_script_that_is_the_script_itself(write, run_cli, tmp_path):
    """sbatch runs a Python file with `#SBATCH` lines as well: its docstring shows the command."""
    script = '"""Run it on the cluster with sbatch, or here:\n\n    python train.py --epochs=10\n"""\n#SBATCH --gres=gpu:{gpu}:4\n'
    write("train.py", script.format(gpu="v100") + MLP)
    scan = ["scan", "train.py", "--select", "SF201", "--no-summary"]
    assert run_cli(*scan, cwd=tmp_path).stdout == ""
    write("train.py", script.format(gpu="a100") + MLP)
    assert "SF201" in run_cli(*scan, cwd=tmp_path).stdout


def test_looking_for_job_scripts_notes_nothing_about_the_script_itself(write, run_cli, tmp_path):
    """A Latin-1 script (with its coding line) is analysed as usual; the search for the GPUs its
    job scripts ask for adds no note that it is not UTF-8."""
    write("train.py", '# -*- coding: latin-1 -*-\n"""Entraînement (sbatch run.sh)."""\n' + MLP, encoding="latin-1")
    result = run_cli("scan", "train.py", "--select", "SF201", cwd=tmp_path)
    assert "SF201" in result.stdout and "note:" not in result.stdout + result.stderr, result.stdout


def test_deepspeed_fp32_advice_names_fp16_on_v100_job_scripts(write, run_cli, tmp_path):
    write("train.py", "import deepspeed\nengine, opt, loader, _ = deepspeed.initialize(args=args, model=net, "
          "model_parameters=net.parameters(), training_data=data)\n")
    write("ds_config.json", '{"train_batch_size": 64, "optimizer": {"type": "Adam"}}\n')
    write("run.sh", "#!/bin/bash\n#SBATCH --gres=gpu:v100:4\nsrun deepspeed train.py --deepspeed --deepspeed_config "
          "ds_config.json\n")
    result = run_cli("scan", ".", "--select", "SF905", "--no-summary", cwd=tmp_path).stdout
    assert '`"fp16": {"enabled": true}` (the job scripts ask for v100 GPUs, which have no fast bf16)' in result
    write("run.sh", "#!/bin/bash\nsrun deepspeed train.py --deepspeed --deepspeed_config ds_config.json\n")
    assert '`"bf16": {"enabled": true}` runs' in run_cli("scan", ".", "--select", "SF905", "--no-summary", cwd=tmp_path).stdout


def test_cudnn_benchmark_for_a_conv_net_the_cli_config_names(write, run_cli, tmp_path):
    write("src/tool/main.py", "from lightning.pytorch.cli import LightningCLI\n\n\ndef main():\n    LightningCLI()\n")
    write("src/tool/__init__.py", "from .decoders import UpsamplingDecoder\nfrom .model import Autoencoder\n")
    write("src/tool/model.py", "import lightning as L\n\n\nclass Autoencoder(L.LightningModule):\n    pass\n")
    write("src/tool/decoders.py", "from torch import nn\n\n\nclass UpsamplingDecoder(nn.Module):\n"
          "    def __init__(self):\n        super().__init__()\n        self.conv = nn.Conv2d(64, 3, 3, padding=1)\n")
    write("experiments/run.yaml", "model:\n  class_path: tool.Autoencoder\n  init_args:\n    parts:\n"
          "      - class_path: torch.nn.Linear\n      - class_path: tool.UpsamplingDecoder\n"
          "trainer:\n  precision: bf16-mixed\n")
    result = run_cli("scan", ".", "--select", "SF901", "--no-summary", cwd=tmp_path).stdout
    assert "experiments/run.yaml:7:1: SF901 The `Trainer` LightningCLI builds trains a conv net with cuDNN's default " \
        "algorithms: `benchmark` is not set" in result
    write("experiments/run.yaml", "model:\n  class_path: tool.Autoencoder\ntrainer:\n  precision: bf16-mixed\n")
    assert "benchmark" not in run_cli("scan", ".", "--select", "SF901", "--no-summary", cwd=tmp_path).stdout
