"""What a config-driven project's runs use: the classes its run configs train (`configs/*.yaml`
naming `model: {target: ...}` or LightningCLI's `class_path:`), the `trainer:` sections of its
LightningCLI configs, and the YAML a script loads itself (`yaml.safe_load` of an argparse
default) and passes to a Lightning `Trainer`. Small projects, scanned from their folder.
"""

from __future__ import annotations

import json

import pytest

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


def test_no_optimizer_advice_for_the_parts_the_configs_build_into_the_trained_model(write, run_cli, tmp_path):
    """Latent diffusion: the config trains `LatentDiffusion` and builds `AutoencoderKL` from its
    `first_stage_config:` as a frozen part; the autoencoder's own `configure_optimizers` (and that
    of the file's other LightningModule) runs only when a config trains it."""
    write("ldm/autoencoder.py", MODELS)
    write("ldm/ddpm.py", "import torch\nimport lightning as L\n\n\nclass LatentDiffusion(L.LightningModule):\n"
          "    def configure_optimizers(self):\n        return torch.optim.AdamW(self.parameters(), lr=1e-4)\n")
    write("configs/train.yaml", "model:\n  target: ldm.ddpm.LatentDiffusion\n  params:\n    first_stage_config:\n"
          "      target: ldm.autoencoder.Distilled\n")
    found = [line.split(" ", 2)[:2] for line in run_cli("scan", ".", "--select", "SF401", "--no-summary",
                                                         cwd=tmp_path).stdout.splitlines()]
    assert found == [["ldm/ddpm.py:7:16:", "SF401"]]
    write("configs/vae.yaml", "model:\n  target: ldm.autoencoder.WithCritic\n")  # a config that trains one of them
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


def test_a_readme_command_laid_out_over_lines_without_backslashes(write, run_cli, tmp_path):
    """textual_inversion's README: `python main.py --base ...yaml` with its other options on the
    indented lines below it, no backslashes, CRLF line ends: `--gpus 0,` belongs to the command."""
    write("main.py", MAIN_1X)
    write("configs/vqgan.yaml", "model:\n  target: models.VQModel\n")
    write("README.md", "```\r\npython main.py --base configs/vqgan.yaml \r\n               -t \r\n"
          "               --gpus 0, \r\n```\r\n")
    result = run_cli("scan", "main.py", "--select", "SF901", "--no-summary", cwd=tmp_path)
    assert "SF901 The `Trainer` `from_argparse_args` builds trains in fp32" in result.stdout
    # the same lines without the indent are separate commands: 1.x then trains on the CPU
    write("README.md", "```\npython main.py --base configs/vqgan.yaml\n-t\n--gpus 0,\n```\n")
    assert "fp32" not in run_cli("scan", "main.py", "--select", "SF901", "--no-summary", cwd=tmp_path).stdout
    # Dreambooth's README: placeholders with a blank inside (`<job name>`) are values, not redirections
    write("README.md", "```\npython main.py --base configs/vqgan.yaml\n    -n <job name>\n    --gpus 0,\n"
          "    --class_word <xxx>\n```\n")
    assert "builds trains in fp32" in run_cli("scan", "main.py", "--select", "SF901", "--no-summary", cwd=tmp_path).stdout


MAIN_2X = """\
import argparse
from omegaconf import OmegaConf
from pytorch_lightning import Trainer

parser = argparse.ArgumentParser()
parser.add_argument("--base", nargs="*", default=[])
opt, unknown = parser.parse_known_args()
configs = [OmegaConf.load(path) for path in opt.base]
config = OmegaConf.merge(*configs, OmegaConf.from_dotlist(unknown))
lightning_config = config.pop("lightning", OmegaConf.create())
trainer_config = lightning_config.get("trainer", OmegaConf.create())
trainer_config["accelerator"] = "gpu"
trainer_opt = argparse.Namespace(**trainer_config)
trainer_kwargs = dict()
trainer_kwargs["callbacks"] = make_callbacks()
trainer_opt = vars(trainer_opt)
trainer_kwargs = {key: val for key, val in trainer_kwargs.items() if key not in trainer_opt}
trainer = Trainer(**trainer_opt, **trainer_kwargs)
trainer.fit(model, data)
"""


def test_a_trainer_given_the_lightning_section_of_the_launched_yaml_files(write, run_cli, tmp_path):
    write("main.py", MAIN_2X)
    write("README.md", "Train with\n```\npython main.py --base configs/toy.yaml\n```\n")
    write("configs/toy.yaml", "model:\n  target: models.UNet\nlightning:\n  trainer:\n    max_epochs: 20\n")
    scan = ["scan", "main.py", "--select", "SF901", "--no-summary"]
    result = run_cli(*scan, cwd=tmp_path).stdout
    assert ("configs/toy.yaml:4:3: SF901 The `Trainer` given `trainer_opt` (the `lightning: trainer:` section of the "
            "run's YAML) trains in fp32 (`precision` defaults to \"32-true\")") in result
    assert "main.py:19:1: SF901 the LightningModule trains without `torch.compile`" in result
    write("configs/toy.yaml", "lightning:\n  trainer:\n    precision: bf16-mixed\n")
    assert "fp32" not in run_cli(*scan, cwd=tmp_path).stdout
    write("configs/toy.yaml", "model:\n  target: models.UNet\n")  # no such section: nothing is known
    assert "fp32" not in run_cli(*scan, cwd=tmp_path).stdout
    write("main.py", MAIN_2X.replace('"gpu"', '"cpu"'))  # the script sends every run to the CPU
    write("configs/toy.yaml", "lightning:\n  trainer:\n    max_epochs: 20\n")
    assert run_cli(*scan, cwd=tmp_path).stdout == ""
    write("main.py", MAIN_2X.replace('trainer_kwargs["callbacks"]', 'trainer_kwargs["precision"]'))
    assert "fp32" not in run_cli(*scan, cwd=tmp_path).stdout  # the kwargs may set it


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
    # an optimizer ZeRO offloads to the CPU is stepped there by DeepSpeed's CPU Adam; a command that
    # names its config by a shell variable says nothing either way (FastChat's train_lora.sh)
    write("ds_b.json", '{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}\n')
    write("train.sh", "deepspeed run_clm.py --deepspeed $DS_CONFIG --fp16\n")
    assert "(`optim`)" not in run_cli(*scan, cwd=tmp_path).stdout
    write("train.sh", "deepspeed run_clm.py --fp16\n")  # this run has no DeepSpeed: the Trainer's AdamW
    assert "(`optim`)" in run_cli(*scan, cwd=tmp_path).stdout


def test_a_module_that_imports_only_argument_classes_from_a_script_does_not_run_it(write, run_cli, tmp_path):
    # FastChat: train_lora.py takes train.py's dataclasses and data helpers, parses its own arguments
    # and runs its own `train()`; its launch commands are not train.py's (train_mem.py's would be)
    write("fastchat/train/train.py", HF_PARSED.replace("(training_args,) =", "def train():\n    (training_args,) =")
          .replace("\nTrainer(", "\n    Trainer(") + "\n\ndef make_data():\n    pass\n\n"
          'if __name__ == "__main__":\n    train()\n')
    write("fastchat/train/train_lora.py", "from fastchat.train.train import make_data\n" + HF_PARSED
          + '\nif __name__ == "__main__":\n    pass\n')
    write("fastchat/train/train_mem.py", 'from fastchat.train.train import train\n\nif __name__ == "__main__":\n'
          "    train()\n")
    write("scripts/lora.sh", "deepspeed fastchat/train/train_lora.py --fp16 True\n")
    scan = ["scan", "fastchat/train/train.py", "--select", "SF902", "--torch-version", "2.4", "--no-summary"]
    assert "lora.sh" not in run_cli(*scan, cwd=tmp_path).stdout
    write("scripts/mem.sh", "torchrun fastchat/train/train_mem.py --fp16 True\n")
    assert "scripts/mem.sh:1" in run_cli(*scan, cwd=tmp_path).stdout


def test_launch_commands_that_disagree_on_bf16_get_a_note_on_the_first_fp32_run(write, run_cli, tmp_path):
    # QLoRA: the guanaco scripts pass `--bf16`, finetune.sh and the README's basic command nothing
    write("qlora.py", HF_PARSED)
    write("scripts/guanaco.sh", "python qlora.py \\\n    --model_name_or_path huggyllama/llama-7b \\\n    --bf16\n")
    write("scripts/finetune.sh", "python qlora.py \\\n    --model_name_or_path EleutherAI/pythia-12b\n")
    scan = ["scan", ".", "--select", "SF902", "--torch-version", "2.8", "--no-summary", "--no-cache"]
    result = run_cli(*scan, cwd=tmp_path).stdout
    assert "scripts/finetune.sh:1:1: SF902 this launch command gives the `TrainingArguments` that `HfArgumentParser` " \
           "fills from the command line neither `--bf16` nor `--fp16`, unlike others of the project: it trains in " \
           "fp32 (impact:" in result, result
    write("scripts/finetune.sh", "python qlora.py --model_name_or_path EleutherAI/pythia-12b --no_cuda\n")  # a CPU run
    assert "fp32" not in run_cli(*scan, cwd=tmp_path).stdout
    write("scripts/finetune.sh", "python qlora.py --model_name_or_path EleutherAI/pythia-12b --bf16 True\n")
    assert "fp32" not in run_cli(*scan, cwd=tmp_path).stdout  # they agree: bf16 everywhere
    # a README's folder tree names the script on a line of its own: no command (MedicalGPT)
    write("README.md", "```\nqlora/\n├── qlora.py            # Stage 2: fine-tuning\n│   └── scripts/\n"
          "| qlora.py | the trainer |\n```\n")
    assert "fp32" not in run_cli(*scan, cwd=tmp_path).stdout


def test_default_optim_is_unfused_under_a_transformers_pinned_before_the_fused_default(write, run_cli, tmp_path):
    write("run_clm.py", HF_PARSED)
    scan = ["scan", "run_clm.py", "--select", "SF902", "--torch-version", "2.8", "--no-summary"]
    assert "(`optim`)" not in run_cli(*scan, cwd=tmp_path).stdout  # transformers picks the fused AdamW itself
    write("requirements.txt", "transformers==4.37.2\n")  # its default is `adamw_torch`, whatever the torch
    assert "the unfused AdamW of transformers before 4.54 (`optim`)" in run_cli(*scan, cwd=tmp_path).stdout
    write("requirements.txt", "transformers==4.16.2\n")  # no `adamw_torch_fused` yet: nothing to add
    result = run_cli(*scan, cwd=tmp_path).stdout
    assert "which has no `adamw_torch_fused` (`optim`)" in result and "--optim" not in result


@pytest.mark.parametrize("elided", ["accelerate launch run_clm.py # arguments (same as above)",
                                    "accelerate launch run_clm.py  # 参数同上", "python run_clm.py ..."])
def test_a_readme_command_whose_options_are_said_to_be_elsewhere_is_no_run_of_its_own(write, run_cli, tmp_path, elided):
    """ChatGLM-Efficient-Tuning: the multi-GPU command repeats the one above without its options."""
    write("run_clm.py", HF_PARSED)
    write("README.md", f"```\npython run_clm.py --output_dir out --bf16 True\n```\n```\naccelerate config\n{elided}\n```\n")
    scan = ["scan", "run_clm.py", "--select", "SF902", "--torch-version", "2.8", "--no-summary", "--no-cache"]
    assert "fp32" not in run_cli(*scan, cwd=tmp_path).stdout
    write("README.md", "```\npython run_clm.py --output_dir out --bf16 True\n```\n```\naccelerate launch run_clm.py\n```\n")
    assert "fp32" in run_cli(*scan, cwd=tmp_path).stdout  # a command of its own, with the defaults


def test_arguments_a_helper_module_parses_are_those_of_the_commands_that_run_its_scripts(write, run_cli, tmp_path):
    """ChatGLM-Efficient-Tuning: `src/utils/common.py`'s `prepare_args()` parses the command line
    of `train_sft.py`, which imports it through the package's `__init__.py`; train.sh passes `--fp16`."""
    write("src/utils/common.py", "from transformers import HfArgumentParser, Seq2SeqTrainingArguments\n\n\n"
          "def prepare_args():\n    (training_args,) = HfArgumentParser((Seq2SeqTrainingArguments,))"
          ".parse_args_into_dataclasses()\n    return training_args\n")
    write("src/utils/__init__.py", "from .common import prepare_args\n")
    write("src/train_sft.py", "from transformers import Seq2SeqTrainer\nfrom utils import prepare_args\n\n\n"
          "def main():\n    Seq2SeqTrainer(model=model, args=prepare_args(), train_dataset=data).train()\n\n\n"
          'if __name__ == "__main__":\n    main()\n')
    scan = ["scan", ".", "--select", "SF902", "--torch-version", "2.8", "--no-summary", "--no-cache"]
    assert "fp32" in run_cli(*scan, cwd=tmp_path).stdout  # no command: the defaults run
    write("train.sh", "CUDA_VISIBLE_DEVICES=0 python src/train_sft.py \\\n    --do_train \\\n    --fp16\n")
    result = run_cli(*scan, cwd=tmp_path).stdout
    assert "fp32" not in result and "train.sh:3:5: SF902 `fp16=True` scales the loss" in result


def test_no_worker_advice_under_a_transformers_pinned_before_the_option_came(write, run_cli, tmp_path):
    write("run_clm.py", HF_PARSED)
    scan = ["scan", "run_clm.py", "--select", "SF902", "--torch-version", "2.8", "--no-summary"]
    assert "dataloader_num_workers" in run_cli(*scan, cwd=tmp_path).stdout
    write("requirements.txt", "transformers==3.0.2\n")  # `dataloader_num_workers` came with 3.2
    assert "dataloader_num_workers" not in run_cli(*scan, cwd=tmp_path).stdout


def test_fp16_advice_for_the_launch_commands_that_set_it_when_the_others_do_not(write, run_cli, tmp_path):
    write("run_clm.py", HF_PARSED)
    write("train_lora.sh", "python run_clm.py --output_dir out --per_device_train_batch_size 8\n")
    write("train_full.sh", "deepspeed --num_gpus=4 run_clm.py \\\n    --deepspeed ds.json \\\n    --fp16\n")
    scan = ["scan", "run_clm.py", "--select", "SF902", "--torch-version", "2.8", "--no-summary"]
    result = run_cli(*scan, cwd=tmp_path).stdout
    assert "train_full.sh:3:5: SF902 `fp16=True` scales the loss" in result  # the full fine-tune's own run
    assert "fp32" not in result  # the LoRA run leaves precision to its default, the other sets fp16: unknown
    write("train_full.sh", "deepspeed --num_gpus=4 run_clm.py --deepspeed ds.json --fp16 --bf16 True\n")
    assert "fp16=True" not in run_cli(*scan, cwd=tmp_path).stdout
    write("train_full.sh", "# a 4-bit GPTQ model: use --fp16, not --bf16\ndeepspeed run_clm.py --deepspeed ds.json --fp16\n")
    assert "fp16=True" not in run_cli(*scan, cwd=tmp_path).stdout  # the author says why the run keeps fp16


DS_LOADED = """\
import argparse
import json
import deepspeed
import torch
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader
from utils import to_device

parser = argparse.ArgumentParser()
parser.add_argument("--ds_file", type=str, default="ds_default.json")
args = parser.parse_args()
torch.cuda.set_device(args.local_rank)
with open(args.ds_file) as handle:
    ds_config = json.load(handle)
model = get_peft_model(load_model(), LoraConfig(r=8))
loader = DataLoader(train_set, batch_size=4, shuffle=True)
engine, _, _, _ = deepspeed.initialize(model=model, args=args, config=ds_config)
for epoch in range(3):
    for batch in loader:
        batch = to_device(batch, engine.device)
        loss = engine(**batch).loss
        engine.backward(loss)
        engine.step()
"""
DS_FP16 = '{{"train_batch_size": 32, "fp16": {{"enabled": true}}, "zero_optimization": {{"stage": {stage}, ' \
    '"offload_optimizer": {{"device": "{device}"}}}}}}\n'


def test_deepspeed_json_the_script_loads_from_the_file_each_launch_command_names(write, run_cli, tmp_path):
    write("train.py", DS_LOADED)
    write("utils.py", "def to_device(batch, device):\n    return {k: v.to(device) for k, v in batch.items()}\n")
    write("README.md", "LoRA:\n```\ndeepspeed train.py --ds_file ds_zero2.json\n```\nFull fine-tune:\n"
          "```\ndeepspeed train.py --ds_file ds_zero3_offload.json --train_type all\n```\n")
    write("ds_zero2.json", DS_FP16.format(stage=2, device="auto"))  # "auto": DeepSpeed drops it, no offload
    write("ds_zero3_offload.json", DS_FP16.format(stage=3, device="cpu"))
    result = run_cli("scan", ".", "--select", "SF102,SF201,SF905,SF906", "--no-summary", cwd=tmp_path).stdout
    assert "ds_zero2.json:1:26: SF905" in result and "ds_zero3_offload.json:1:26: SF905" in result  # fp16 -> bf16
    assert "SF906" not in result  # the offloading file is the full fine-tune's, not the LoRA run's
    assert "SF201" not in result  # every run's engine trains in fp16
    assert "train.py:16:10: SF102" in result  # the helper the loop calls copies each batch to the GPU
    write("README.md", "```\ndeepspeed train.py --ds_file ds_zero3_offload.json\n```\n")
    assert "ds_zero3_offload.json:1:109: SF906" in run_cli("scan", ".", "--select", "SF906", "--no-summary",
                                                         cwd=tmp_path).stdout  # the LoRA run's own config


HF_JSON_ARGS = """\
import argparse
from dataclasses import dataclass, field
from transformers import HfArgumentParser, Trainer, TrainingArguments


@dataclass
class RunArguments:
    model_name_or_path: str = field(default="Qwen/Qwen-7B")


def setup():
    parser = argparse.ArgumentParser()
    parser.add_argument("--train_args_file", type=str, default="train_args/sft.json")
    args = parser.parse_args()
    path = args.train_args_file
    args, training_args = HfArgumentParser((RunArguments, TrainingArguments)).parse_json_file(json_file=path)
    return args, training_args


args, training_args = setup()
Trainer(model=load(args.model_name_or_path), args=training_args, train_dataset=dataset).train()
"""
SFT_JSON = '{\n  "output_dir": "out",\n  "gradient_checkpointing": true,\n  "fp16": %s,\n  "bf16": %s\n}\n'


def test_training_arguments_read_from_the_json_file_the_script_defaults_to_or_the_launch_names(write, run_cli, tmp_path):
    """`HfArgumentParser.parse_json_file(args.train_args_file)`: every setting is a line of the
    file each run reads (the option's default, or what the launch commands pass)."""
    write("train.py", HF_JSON_ARGS)
    write("train_args/sft.json", SFT_JSON % ("true", "false"))
    scan = ["scan", "train.py", "--select", "SF902", "--torch-version", "2.8", "--no-summary"]
    result = run_cli(*scan, cwd=tmp_path).stdout
    assert "train_args/sft.json:3:3: SF902 `gradient_checkpointing=True` saves memory" in result
    assert "train_args/sft.json:4:3: SF902 `fp16=True` scales the loss" in result
    assert "fp32" not in result
    write("README.md", "```\npython train.py --train_args_file train_args/big.json\n"
          "python train.py --train_args_file train_args/typo.json\n```\n")  # a name the project has no file for
    write("train_args/big.json", SFT_JSON % ("false", "true"))
    result = run_cli(*scan, cwd=tmp_path).stdout
    assert "fp16=True" not in result  # the one run the scan can read trains in bf16
    assert "train_args/sft.json:3:3: SF902 `gradient_checkpointing=True`" in result  # the script's file says the same
    assert "train.py:16:59: SF902 the `TrainingArguments` that `HfArgumentParser` fills from a file keep slow defaults" in result


HF_LORA_OPTION = """\
from dataclasses import dataclass, field
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments


@dataclass
class TrainingArguments(TrainingArguments):
    use_lora: bool = field(default=False)


def main():
    (training_args,) = HfArgumentParser((TrainingArguments,)).parse_args_into_dataclasses()
    model = AutoModelForCausalLM.from_pretrained("huggyllama/llama-7b")
    if training_args.use_lora:
        model = get_peft_model(model, LoraConfig(r=16))
    Trainer(model=model, args=training_args, train_dataset=dataset).train()
"""
OFFLOAD = '{\n  "zero_optimization": {\n    "stage": 3,\n    "offload_optimizer": {"device": "cpu"}\n  }\n}\n'


def test_offload_in_the_json_of_the_launch_command_that_turns_lora_on(write, run_cli, tmp_path):
    """The full fine-tune passes one DeepSpeed file, the LoRA run another: each run's own file
    and options decide (the script's default path trains no adapters)."""
    write("sft.py", HF_LORA_OPTION)
    write("scripts/full.sh", "deepspeed sft.py --bf16 --deepspeed configs/ds_full.json\n")
    write("scripts/lora.sh", "torchrun --nproc_per_node 8 sft.py --use_lora --bf16 --deepspeed configs/ds_lora.json\n")
    write("configs/ds_full.json", OFFLOAD)
    write("configs/ds_lora.json", OFFLOAD)
    scan = ["scan", "sft.py", "--select", "SF906", "--no-summary"]
    assert run_cli(*scan, cwd=tmp_path).stdout.startswith("configs/ds_lora.json:4:27: SF906 ZeRO offloads the "
                                                          "optimizer state to the CPU, but this is a LoRA run")
    write("scripts/lora.sh", "torchrun --nproc_per_node 8 sft.py --bf16 --deepspeed configs/ds_lora.json\n")
    assert run_cli(*scan, cwd=tmp_path).stdout == ""  # no run trains adapters


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


def test_a_small_network_of_another_file_handed_to_deepspeed_weighs_its_fp32_advice(write, run_cli, tmp_path):
    """deepspeedtrial: `model = FashionModel().cuda()`, a 238K-parameter MLP of `model.py`, handed
    to `deepspeed.initialize` (the config names the optimizer): the engine's fp32 costs little."""
    write("model.py", "import torch\n\n\nclass FashionModel(torch.nn.Module):\n    def __init__(self):\n"
          "        super().__init__()\n        self.seq = torch.nn.Sequential(torch.nn.Linear(784, 300), torch.nn.ReLU(),"
          " torch.nn.Linear(300, 10))\n\n    def forward(self, x):\n        return self.seq(x)\n")
    write("train.py", "import deepspeed\nfrom model import FashionModel\n\nmodel = FashionModel().cuda()\n"
          "model, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())\n"
          "for x, y in loader:\n    model.backward(loss_fn(model(x.cuda()), y.cuda()))\n    model.step()\n")
    write("ds_config.json", '{"train_batch_size": 32, "optimizer": {"type": "Adam"}}\n')
    write("run.sh", "deepspeed train.py --deepspeed --deepspeed_config ds_config.json\n")
    result = run_cli("scan", ".", "--select", "SF905", "--no-summary", "--no-cache", cwd=tmp_path).stdout
    assert 'ds_config.json:1:1: SF905 the DeepSpeed config enables neither "bf16" nor "fp16"' in result
    assert "trains in fp32" in result and "(impact: medium)" in result and "(impact: high)" not in result


@pytest.mark.parametrize("enabled, reported", [('"true"', True), ('"True"', True), ('"false"', False), ("true", True)])
def test_deepspeed_reads_enabled_written_as_a_string(write, run_cli, tmp_path, enabled, reported):
    """EAGLE's `"fp16": {"enabled": "true"}`: DeepSpeed's config models read the string as a
    boolean, and so does the scan."""
    write("train.py", "import deepspeed\nengine, opt, loader, _ = deepspeed.initialize(args=args, model=net, "
          "model_parameters=net.parameters(), training_data=data)\n")
    write("ds_config.json", '{"train_batch_size": 64, "fp16": {"enabled": %s, "loss_scale": 0}}\n' % enabled)
    write("run.sh", "deepspeed train.py --deepspeed --deepspeed_config ds_config.json\n")
    result = run_cli("scan", ".", "--select", "SF905", "--no-summary", cwd=tmp_path).stdout
    assert ('"fp16" trains with dynamic loss scaling' in result) is reported, result


@pytest.mark.parametrize("pin, fixed", [("pytorch_lightning==1.1.6", False), ("pytorch_lightning==1.9.0", True)])
def test_a_lightning_1x_trainer_given_the_gpus_of_a_yaml_loaded_by_hand(write, run_cli, tmp_path, pin, fixed):
    """nuwave: `gpus=hparams.train.gpus` of `hparams = OmegaConf.load('hparameter.yaml')` (2 GPUs):
    the Trainer trains in fp32 on the GPU. A Lightning older than 1.5 has no bf16, so the finding
    comes without a fix there."""
    write("requirements.txt", f"{pin}\n")
    write("hparameter.yaml", "train:\n  gpus: 2\n")
    write("trainer.py", """\
        from omegaconf import OmegaConf as OC
        from pytorch_lightning import Trainer

        if __name__ == "__main__":
            hparams = OC.load('hparameter.yaml')
            trainer = Trainer(gpus=hparams.train.gpus, accelerator='ddp' if hparams.train.gpus > 1 else None)
            trainer.fit(Model(hparams))
        """)
    result = run_cli("scan", ".", "--select", "SF901", "--no-summary", "--output-format", "json", cwd=tmp_path).stdout
    precision = [f for f in json.loads(result) if "trains in fp32" in f["message"]]
    assert len(precision) == 1 and (precision[0]["fix"] is not None) is fixed
    if not fixed:
        assert "`precision=16`" in precision[0]["no_fix_reason"]


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


# ---------------------------------------------------------------------- the module `trainer.fit` trains, in another file
FIT_RUNNER = """\
import lightning as L
from lit import Classifier

model = Classifier(arch="resnet18")
trainer = L.Trainer(precision="bf16-mixed", max_epochs=100)
trainer.fit(model, datamodule=data)
"""
LIT_MODULE = """\
import lightning as L
from zoo.resnet import resnet18


class Classifier(L.LightningModule):
    def __init__(self, arch):
        super().__init__()
        self.net = {"resnet18": resnet18}[arch]()
"""


def test_cudnn_benchmark_for_a_conv_net_trainer_fit_trains_from_another_module(write, run_cli, tmp_path):
    write("train.py", FIT_RUNNER)
    write("lit.py", LIT_MODULE)
    write("zoo/__init__.py", "")
    write("zoo/resnet.py", "from torch import nn\n\n\ndef resnet18():\n    return nn.Sequential(nn.Conv2d(3, 64, 3), "
          "nn.ReLU())\n")
    scan = ["scan", "train.py", "--select", "SF901", "--no-summary", "--torch-version", "1.13"]
    assert "train.py:5:11: SF901 [*] `Trainer` trains a conv net with cuDNN's default algorithms" \
        in run_cli(*scan, cwd=tmp_path).stdout  # the factory the module's file imports builds convolutions
    write("zoo/resnet.py", "from torch import nn\n\n\ndef resnet18():\n    return nn.Sequential(nn.Linear(8, 8))\n")
    assert "benchmark" not in run_cli(*scan, cwd=tmp_path).stdout


# ---------------------------------------------------------------------- constructor arguments from the run configs
DATAMODULE = """\
import lightning as L
from torch.utils.data import DataLoader


class ChipsData(L.LightningDataModule):
    def __init__(self, chip_dir, batch_size, num_workers):
        super().__init__()
        self.chip_dir = chip_dir
        self.batch_size = batch_size
        self.num_workers = num_workers

    def train_dataloader(self):
        return DataLoader(self.chips, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers)
"""


def test_a_datamodule_reads_the_worker_count_the_lightning_cli_config_gives_it(write, run_cli, tmp_path):
    write("pkg/data.py", DATAMODULE)
    write("pkg/cli.py", "from lightning.pytorch.cli import LightningCLI\nfrom pkg.data import ChipsData\n\n"
          "LightningCLI(Segmenter, ChipsData)\n")
    write("configs/chips.yaml", "data:\n  chip_dir: data/chips\n  batch_size: 16\n  num_workers: 8\n"
          "trainer:\n  precision: bf16-mixed\n")
    scan = ["scan", "pkg", "--select", "SF101,SF103", "--no-summary"]
    assert "pkg/data.py:13:16: SF103 [*] `DataLoader` starts its 8 worker processes again every epoch" \
        in run_cli(*scan, cwd=tmp_path).stdout
    write("configs/chips.yaml", "data:\n  chip_dir: data/chips\n  batch_size: 16\n  num_workers: 0\n"
          "trainer:\n  precision: bf16-mixed\n")
    assert "pkg/data.py:13:16: SF101 `DataLoader` loads every batch in the main process (`num_workers` resolves to 0)" \
        in run_cli(*scan, cwd=tmp_path).stdout
    write("configs/other.yaml", "data:\n  chip_dir: data/chips\n  batch_size: 16\n  num_workers: 4\n"
          "trainer:\n  precision: bf16-mixed\n")
    assert run_cli(*scan, cwd=tmp_path).stdout == ""  # the runs disagree: unknown


DATAMODULE_1X = """\
import argparse
import pytorch_lightning as pl
from torch.utils.data import DataLoader


class FolderData(pl.LightningDataModule):
    def __init__(self, folder, batch_size=64, num_workers=0):
        super().__init__()
        self.folder = folder
        self.batch_size = batch_size
        self.num_workers = num_workers

    @staticmethod
    def add_argparse_args(parent):
        parser = argparse.ArgumentParser(parents=[parent], add_help=False)
        parser.add_argument("--num_workers", type=int, default=0)
        return parser

    def train_dataloader(self):
        return DataLoader(self.images, batch_size=self.batch_size, num_workers=self.num_workers)
"""


def test_a_constructor_default_counts_unless_another_file_passes_the_argument(write, run_cli, tmp_path):
    write("data.py", DATAMODULE_1X)
    write("train.py", "from data import FolderData\n\ndm = FolderData.from_argparse_args(args)\ntrainer.fit(model, dm)\n")
    scan = ["scan", ".", "--select", "SF101", "--no-summary"]
    assert "data.py:20:16: SF101 `DataLoader` loads every batch in the main process (`num_workers` resolves to 0)" \
        in run_cli(*scan, cwd=tmp_path).stdout  # from its own `--num_workers` option, default 0
    write("train.py", "from data import FolderData\n\ndm = FolderData('images', num_workers=8)\ntrainer.fit(model, dm)\n")
    assert run_cli(*scan, cwd=tmp_path).stdout == ""
    write("train.py", "from data import FolderData\n\ndm = FolderData(**config['data'])\ntrainer.fit(model, dm)\n")
    assert run_cli(*scan, cwd=tmp_path).stdout == ""  # the YAML's `data` section may set it


HF_FILE_OR_COMMAND_LINE = """\
import os
import sys

import deepspeed
from transformers import HfArgumentParser, TrainingArguments
from transformers.integrations import HfDeepSpeedConfig

parser = HfArgumentParser((TrainingArguments,))
if sys.argv[-1].endswith(".yaml"):
    (training_args,) = parser.parse_yaml_file(yaml_file=os.path.abspath(sys.argv[-1]))
else:
    (training_args,) = parser.parse_args_into_dataclasses()
ds_config = training_args.deepspeed
dschf = HfDeepSpeedConfig(ds_config)
engine, _, _, _ = deepspeed.initialize(model=model, config=training_args.deepspeed)
"""


def test_the_yaml_file_a_command_hands_the_script_gives_its_arguments(write, run_cli, tmp_path):
    # LOMO: `deepspeed src/train_lomo.py config/args_lomo.yaml`, read by `parse_yaml_file(sys.argv[-1])`;
    # its `deepspeed: config/ds_config.json` is relative to where the command runs
    write("lomo/src/train_lomo.py", HF_FILE_OR_COMMAND_LINE)
    write("lomo/config/ds_config.json", '{\n  "fp16": {\n    "enabled": true\n  }\n}\n')
    write("lomo/config/args_lomo.yaml", "output_dir: outputs\ndeepspeed: 'config/ds_config.json'\n#bf16: true\n")
    scan = ["scan", ".", "--select", "SF905", "--no-summary", "--no-cache"]
    assert "SF905" not in run_cli(*scan, cwd=tmp_path).stdout  # no command: no file, no config
    write("lomo/run.sh", "deepspeed --include localhost:0 src/train_lomo.py config/args_lomo.yaml\n")
    assert 'lomo/config/ds_config.json:2:3: SF905 "fp16" trains with dynamic loss scaling' \
        in run_cli(*scan, cwd=tmp_path).stdout
    write("lomo/config/args_lomo.yaml", "output_dir: outputs\ngradient_checkpointing: true\n")
    assert "lomo/run.sh:1:1: SF902 `gradient_checkpointing=True`" \
        in run_cli("scan", ".", "--select", "SF902", "--no-summary", "--no-cache", cwd=tmp_path).stdout
    write("lomo/config/args_lomo.yaml", "output_dir: outputs\ndeepspeed: 'config/ds_config.json'\n#bf16: true\n")
    write("lomo/run.sh", "deepspeed --include localhost:0 src/train_lomo.py config/args_lomo.yaml --deepspeed x.json\n")
    assert "SF905" not in run_cli(*scan, cwd=tmp_path).stdout  # the command line names another config


LTSF = """\
import argparse
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--use_amp", action="store_true")
args = parser.parse_args()


def vali(model, loader):
    model.eval()
    with torch.no_grad():
        for x in loader:
            if args.use_amp:
                with torch.cuda.amp.autocast():
                    out = model(x.cuda())
            else:
                out = model(x.cuda())


def train(model, loader, opt):
    scaler = torch.cuda.amp.GradScaler() if args.use_amp else None
    for x in loader:
        if args.use_amp:
            with torch.cuda.amp.autocast():
                loss = model(x.cuda()).mean()
            scaler.scale(loss).backward()
        else:
            loss = model(x.cuda()).mean()
            loss.backward()
        opt.step()
"""


def test_a_gated_autocast_is_reported_at_the_training_step_and_needs_no_upgrade_where_it_runs(write, run_cli, tmp_path):
    # LTSF-Linear: `--use_amp` off by default, `torch.cuda.amp.autocast` (torch 1.6+) under torch 1.9
    write("train.py", LTSF)
    scan = ["scan", "train.py", "--select", "SF202", "--no-summary", "--no-cache"]
    result = run_cli(*scan, "--torch-version", "1.9", cwd=tmp_path).stdout
    assert "train.py:24:18: SF202 autocast runs only when `args.use_amp`, which is off by default" in result
    assert "upgrade" not in result
    assert "upgrade torch to use it" in run_cli(*scan, "--torch-version", "1.4", cwd=tmp_path).stdout


def test_an_fp32_loop_under_torch_1_6_to_1_9_is_pointed_at_fp16_autocast_not_an_upgrade(write, run_cli, tmp_path):
    # Dual-Path-RNN pins torch 1.6: `torch.cuda.amp.autocast` and `GradScaler` are there already
    write("train.py", "import torch\nmodel = Net().cuda()\nfor x, y in loader:\n"
          "    loss = criterion(model(x.cuda()), y.cuda())\n    loss.backward()\n    optimizer.step()\n")
    scan = ["scan", "train.py", "--select", "SF202", "--no-summary", "--no-cache", "--output-format", "json"]
    found = json.loads(run_cli(*scan, "--torch-version", "1.8", cwd=tmp_path).stdout)
    assert len(found) == 1 and found[0]["fix"] is None
    assert "this code targets torch 1.8: fp16 autocast is there (`torch.cuda.amp.autocast()`" in found[0]["message"]
    assert "upgrade torch to use it" in json.loads(run_cli(*scan, "--torch-version", "1.5", cwd=tmp_path).stdout)[0]["message"]


def test_find_unused_parameters_costs_nothing_where_every_command_starts_one_process(write, run_cli, tmp_path):
    """Recurrent-Parameter-Generation: `accelerate launch --num_processes=1`: no DDP wrapper."""
    write("train.py", "from accelerate import Accelerator, DistributedDataParallelKwargs\n"
          "ddp_kwargs = DistributedDataParallelKwargs(find_unused_parameters=True)\n"
          "accelerator = Accelerator(kwargs_handlers=[ddp_kwargs])\n"
          "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
          "for batch in loader:\n    accelerator.backward(model(**batch).loss)\n    optimizer.step()\n")
    scan = ["scan", "train.py", "--select", "SF803", "--no-summary", "--no-cache"]
    assert "SF803" in run_cli(*scan, cwd=tmp_path).stdout  # no command: the default config may start several
    write("train.sh", "accelerate launch \\\n  --num_processes=1 \\\n  --mixed_precision=bf16 \\\n  train.py\n")
    assert "SF803" not in run_cli(*scan, cwd=tmp_path).stdout
    write("multi.sh", "accelerate launch --num_processes 4 train.py\n")  # one run starts four
    assert "SF803" in run_cli(*scan, cwd=tmp_path).stdout
