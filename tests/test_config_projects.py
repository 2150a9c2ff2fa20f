"""Projects configured outside their scripts: hydra and LightningCLI YAML, DeepSpeed JSON named on a
launch script's command line, Hugging Face arguments filled from the command line, Accelerate
config files, and the torch a project pins.

The bundled projects (`fixtures/projects/NAME/`) are scanned as a user would scan them (from
their folder, no `--torch-version`: a pin in requirements.txt counts) and compared exactly with
`fixtures/projects/NAME.findings.txt` (`SPEEDFIX_UPDATE_FIXTURES=1` rewrites them). The other
tests build small projects: what is read, what is never read, and when a cached result is stale.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from speedfix.model.config_tree import ConfigError, parse_json, parse_yaml
from speedfix.model.project_files import MAX_BYTES, ProjectFiles, inputs_unchanged, listings_kept

ROOT = Path(__file__).resolve().parent.parent
PROJECTS = ROOT / "fixtures" / "projects"
UPDATE = bool(os.environ.get("SPEEDFIX_UPDATE_FIXTURES"))


@pytest.mark.parametrize("name", sorted(p.name for p in PROJECTS.iterdir() if p.is_dir()))
def test_bundled_projects_match_their_findings(name, run_cli, tmp_path):
    project = tmp_path / name
    shutil.copytree(PROJECTS / name, project)
    result = run_cli("scan", ".", "--no-summary", cwd=project)
    assert result.exit_code in (0, 1), result.stderr
    expected = PROJECTS / f"{name}.findings.txt"
    if UPDATE:
        expected.write_text(result.stdout, encoding="utf-8")
    assert result.stdout == expected.read_text(encoding="utf-8")


# ---------------------------------------------------------------------- hydra
TRAIN = """\
import hydra
import lightning as L
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    trainer = hydra.utils.instantiate(cfg.trainer)
    trainer.fit(hydra.utils.instantiate(cfg.model))
"""
TRAIN_YAML = "defaults:\n  - trainer: gpu\n  - _self_\n"
TRAINER_YAML = "_target_: lightning.pytorch.Trainer\nmax_epochs: 3\n# precision: 16\n"


def hydra_project(write) -> Path:
    write("train.py", TRAIN)
    write("conf/train.yaml", TRAIN_YAML)
    return write("conf/trainer/gpu.yaml", TRAINER_YAML)


def test_hydra_trainer_precision_is_reported_on_the_yaml_line_and_follows_the_cache(write, run_cli, tmp_path, counted):
    trainer_yaml = hydra_project(write)
    first = run_cli("scan", ".", "--select", "SF901", "--no-summary", cwd=tmp_path)
    assert "conf/trainer/gpu.yaml:3:1: SF901 The `Trainer` hydra builds from `trainer/gpu.yaml` trains in fp32" \
        in first.stdout  # the commented-out `# precision: 16` line
    counted.clear()
    assert run_cli("scan", ".", "--select", "SF901", "--no-summary", cwd=tmp_path).stdout == first.stdout
    assert counted == []  # nothing changed: from the cache
    trainer_yaml.write_text(TRAINER_YAML.replace("# precision: 16", "precision: bf16-mixed"))
    again = run_cli("scan", ".", "--select", "SF901", "--no-summary", cwd=tmp_path)
    assert counted == ["train.py"] and "gpu.yaml" not in again.stdout


def test_the_readme_commands_choose_the_experiment_and_set_values_of_the_composed_config(write, run_cli, tmp_path):
    # audio-diffusion-pytorch-trainer: `exp: null` in the defaults, `python train.py exp=base_test
    # trainer.gpus=1` in the README, a `# @package _global_` experiment with `gpus: 0`, Lightning 1.7
    write("train.py", TRAIN.replace("import lightning as L", "import pytorch_lightning as pl"))
    write("conf/train.yaml", "defaults:\n  - _self_\n  - exp: null\nseed: 1\n")
    write("conf/exp/base_test.yaml", "# @package _global_\ntrainer:\n  _target_: pytorch_lightning.Trainer\n"
          "  gpus: 0\n  precision: 32\n  accelerator: null\n")
    write("requirements.txt", "pytorch-lightning==1.7.7\n")
    scan = ["scan", ".", "--select", "SF901", "--no-summary", "--no-cache"]
    assert "SF901" not in run_cli(*scan, cwd=tmp_path).stdout  # no command: no experiment, no Trainer
    write("README.md", "```\npython train.py exp=base_test\n```\n")
    assert "SF901" not in run_cli(*scan, cwd=tmp_path).stdout  # the experiment's Trainer: on the CPU
    write("README.md", "```\npython train.py exp=base_test\npython train.py exp=base_test trainer.gpus=1\n```\n")
    result = run_cli(*scan, cwd=tmp_path).stdout
    assert "conf/exp/base_test.yaml:5:3: SF901 The `Trainer` hydra builds trains in fp32 (`precision=32`)" in result
    write("README.md", "```\npython train.py exp=base_test trainer.gpus=1\npython train.py exp=other\n```\n")
    assert "SF901" not in run_cli(*scan, cwd=tmp_path).stdout  # the commands disagree on the experiment


def test_a_trainer_unpacking_the_composed_section_reads_the_yaml(write, run_cli, tmp_path):
    # `Trainer(**cfg.trainer)`: the keys of the section hydra composes are the Trainer's arguments
    write("train.py", "import hydra\nimport lightning as L\n\n\n@hydra.main(config_path='conf', config_name='train')\n"
                      "def main(cfg):\n    run(cfg)\n\n\ndef run(cfg):\n    trainer = L.Trainer(logger=False, **cfg.trainer)\n"
                      "    trainer.fit(build(cfg.model))\n")
    write("conf/train.yaml", "defaults:\n  - trainer: single\n  - _self_\n")
    trainer_yaml = write("conf/trainer/single.yaml", "accelerator: gpu\ndevices: 1\nmax_epochs: 50\n")
    result = run_cli("scan", ".", "--select", "SF901", "--no-summary", cwd=tmp_path)
    assert "conf/trainer/single.yaml:1:1: SF901 The `Trainer` given `cfg.trainer` (conf/trainer/single.yaml) trains in " \
           "fp32" in result.stdout
    trainer_yaml.write_text("accelerator: cpu\ndevices: 1\n")
    assert "single.yaml" not in run_cli("scan", ".", "--select", "SF901", "--no-summary", cwd=tmp_path).stdout


def test_the_config_path_the_commands_give_is_composed_for_each_run(write, run_cli, tmp_path):
    """uni2ts: `@hydra.main(config_name="default.yaml")` without `config_path`; the README runs
    `python -m cli.train -cp conf/pretrain ...` and `-cp conf/finetune ...`: both configs are read."""
    write("cli/__init__.py", "")
    write("cli/train.py", "import hydra\nimport lightning as L\n\n\n@hydra.main(version_base='1.3', config_name='default.yaml')\n"
                          "def main(cfg):\n    trainer = hydra.utils.instantiate(cfg.trainer)\n"
                          "    trainer.fit(hydra.utils.instantiate(cfg.model))\n")
    trainer = "trainer:\n  _target_: lightning.Trainer\n  accelerator: auto\n  precision: 32\n"
    write("cli/conf/pretrain/default.yaml", "run_name: ???\n" + trainer)
    write("cli/conf/finetune/default.yaml", "run_name: ???\nseed: 0\n" + trainer)
    scan = ("scan", ".", "--select", "SF901", "--no-summary", "--no-cache")
    assert "SF901" not in run_cli(*scan, cwd=tmp_path).stdout  # no command names a config: none is read
    write("README.md", "```shell\npython -m cli.train \\\n  -cp conf/pretrain \\\n  run_name=first_run model=moirai_small\n```\n"
                       "```shell\npython -m cli.train -cp conf/finetune run_name=example_run\n```\n")
    found = run_cli(*scan, cwd=tmp_path).stdout
    assert "cli/conf/pretrain/default.yaml:5:3: SF901" in found and "cli/conf/finetune/default.yaml:6:3: SF901" in found


def test_the_trainer_section_of_each_config_name_the_commands_give_is_read(write, run_cli, tmp_path):
    """Ezspeech: `pl.Trainer(**config.trainer)` under `@hydra.main(config_name="ctc")`, and the
    README runs `--config-name=ctc` and `--config-name=ctc_llm`: both trainers are read."""
    write("scripts/train.py", "import hydra\nimport lightning as L\n\n\n"
                              "@hydra.main(version_base=None, config_path='../config', config_name='ctc')\n"
                              "def main(config):\n    trainer = L.Trainer(**config.trainer)\n    trainer.fit(build(config))\n")
    write("config/ctc.yaml", "model: {}\ntrainer:\n  accelerator: gpu\n  precision: 16-mixed\n")
    write("config/ctc_llm.yaml", "model: {}\ntrainer:\n  accelerator: gpu\n  precision: 32\n")
    write("README.md", "```\npython scripts/train.py --config-name=ctc\npython scripts/train.py --config-name=ctc_llm\n```\n")
    found = run_cli("scan", ".", "--select", "SF901", "--no-summary", "--no-cache", cwd=tmp_path).stdout
    assert "config/ctc_llm.yaml:4:3: SF901 The `Trainer` given `config.trainer` (config/ctc_llm.yaml) trains in fp32" in found
    assert "(config/ctc.yaml) trains in fp32" not in found  # that run has mixed precision (fp16) already


def test_a_hydra_0x_main_names_its_config_file_in_config_path(write, run_cli, tmp_path):
    # hydra 0.x: `@hydra.main(config_path="conf/train.yaml")`, the file itself, no `config_name`
    write("train.py", "import hydra\nimport lightning as L\n\n\n@hydra.main(config_path='conf/train.yaml', strict=True)\n"
                      "def main(cfg):\n    trainer = L.Trainer(**cfg.trainer)\n    trainer.fit(build(cfg.model))\n")
    write("conf/train.yaml", "trainer:\n  accelerator: gpu\n  max_epochs: 50\n")
    result = run_cli("scan", ".", "--select", "SF901", "--no-summary", cwd=tmp_path)
    assert "conf/train.yaml:1:1: SF901 The `Trainer` given `cfg.trainer` (conf/train.yaml) trains in fp32" in result.stdout


MODULE = """\
import torch
import lightning as L


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.scale = torch.ones(1).to("cuda" if torch.cuda.is_available() else "cpu")

    def training_step(self, batch, batch_idx):
        return self.layer(batch).mean()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)
"""


def test_no_fused_adam_advice_where_every_configured_trainer_runs_on_the_cpu(write, run_cli, tmp_path):
    # the Trainer puts the module's parameters (and the optimizer's state) on its own device
    write("train.py", TRAIN)
    write("conf/train.yaml", TRAIN_YAML + "model:\n  _target_: models.Net\n")
    write("models.py", MODULE)
    write("conf/trainer/gpu.yaml", "_target_: lightning.pytorch.Trainer\naccelerator: cpu\n")
    write("conf/trainer/debug.yaml", "_target_: lightning.pytorch.Trainer\naccelerator: cpu\nfast_dev_run: true\n")
    assert "SF401" not in run_cli("scan", ".", "--select", "SF401", "--no-summary", cwd=tmp_path).stdout
    write("conf/trainer/debug.yaml", "_target_: lightning.pytorch.Trainer\nfast_dev_run: true\n")  # "auto": the GPU
    assert "models.py:15:16: SF401" in run_cli("scan", ".", "--select", "SF401", "--no-summary", cwd=tmp_path).stdout


def test_a_noqa_comment_in_the_yaml_suppresses_the_finding(write, run_cli, tmp_path):
    hydra_project(write).write_text(TRAINER_YAML.replace("# precision: 16", "# precision: 16  # noqa: SF901"))
    result = run_cli("scan", ".", "--select", "SF901", "--no-summary", cwd=tmp_path)
    assert "gpu.yaml" not in result.stdout and "train.py" in result.stdout  # the TF32 finding stays


def test_a_broken_yaml_is_named_in_a_note_and_the_script_keeps_its_findings(write, run_cli, tmp_path):
    hydra_project(write).write_text("_target_: lightning.pytorch.Trainer\nprecision: [32\n")
    write("train.py", TRAIN + "\n\nmodel = L.Fabric(accelerator='cuda')\n")
    result = run_cli("scan", ".", "--select", "SF901", cwd=tmp_path)
    assert "train.py: note: conf/trainer/gpu.yaml: not read: not valid YAML" in result.stdout
    assert "train.py:12:9: SF901 [*] `Fabric` trains in fp32" in result.stdout  # the script is still analysed


def test_a_config_folder_that_leads_out_of_the_project_is_not_read(write, run_cli, tmp_path):
    outside = tmp_path / "elsewhere"
    write("elsewhere/train.yaml", TRAIN_YAML)
    write("elsewhere/trainer/gpu.yaml", TRAINER_YAML)
    write("project/train.py", TRAIN)
    (tmp_path / "project" / "conf").symlink_to(outside, target_is_directory=True)
    result = run_cli("scan", ".", "--select", "SF901", "--no-summary", cwd=tmp_path / "project")
    assert "gpu.yaml" not in result.stdout and "elsewhere" not in result.stdout


def test_yaml_is_read_as_data_only(tmp_path):
    tree = parse_yaml("a: !!python/object/apply:os.system ['echo hi']\nb: 1\n", tmp_path / "x.yaml")
    assert tree.get("b").value == 1 and tree.get("a").value is ...  # the tag is never constructed
    with pytest.raises(ConfigError, match="more than"):
        parse_yaml("a: &a [1, 2]\n" + "".join(f"{k}: &{k} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
                                               for p, k in zip("abcdefgh", "bcdefghi")), tmp_path / "bomb.yaml")


def test_json_values_keep_their_lines(tmp_path):
    tree = parse_json('{\n  "zero_optimization": {\n    "sub_group_size": 1e9\n  }\n}\n', tmp_path / "ds.json")
    node = tree.get("zero_optimization", "sub_group_size")
    assert node.value == 1e9 and node.at.line == 3  # JSON's number, the composer's position


def test_project_files_stay_inside_the_roots_and_under_the_cap(tmp_path):
    (tmp_path / "p").mkdir()
    script = tmp_path / "p" / "train.py"
    script.write_text("")
    (tmp_path / "secret.json").write_text("{}")
    (tmp_path / "p" / "big.json").write_bytes(b" " * (MAX_BYTES + 1))
    files = ProjectFiles.for_script(script, (tmp_path / "p",))
    assert files.resolve("../secret.json") is None and files.resolve("/etc/passwd") is None
    assert files.find("big.json") is None and files.text(tmp_path / "p" / "big.json") is None
    assert any("big.json" in problem for problem in files.problems)


# ---------------------------------------------------------------------- launch commands
HF_SCRIPT = """\
import transformers

def main():
    parser = transformers.HfArgumentParser((transformers.TrainingArguments,))
    (args,) = parser.parse_args_into_dataclasses()

if __name__ == "__main__":
    main()
"""


def test_every_launch_command_must_agree_for_a_value_to_count(write, run_cli, tmp_path):
    write("train.py", HF_SCRIPT)
    write("scripts/debug.sh", "python ../train.py --output_dir dbg\n")
    result = run_cli("scan", ".", "--select", "SF902", "--no-summary", cwd=tmp_path)
    assert "keep slow defaults: fp32 (neither `bf16` nor `fp16`)" in result.stdout
    write("run.sh", "torchrun --nproc_per_node=8 train.py --output_dir out \\\n    --bf16 True --tf32 True\n")
    result = run_cli("scan", ".", "--select", "SF902", "--no-summary", cwd=tmp_path)
    assert "fp32" not in result.stdout  # the commands disagree: speedfix cannot know
    (tmp_path / "scripts" / "debug.sh").unlink()
    result = run_cli("scan", ".", "--select", "SF902", "--no-summary", cwd=tmp_path)
    assert "fp32" not in result.stdout and "TF32" not in result.stdout and "SF902" in result.stdout


def test_a_launch_script_in_another_folder_of_the_project_runs_the_script_from_the_top(write, run_cli, tmp_path):
    """FineGrainedRLHF: `tasks/qa_feedback/training/train_sft.sh` runs `./sft/run_sft.py --bf16`
    from the top of the project; no folder on the script's way up holds it."""
    write("pyproject.toml", "[project]\nname = 'x'\n")
    write("sft/run_sft.py", HF_SCRIPT)
    result = run_cli("scan", ".", "--select", "SF902", "--no-summary", cwd=tmp_path)
    assert "fp32 (neither `bf16` nor `fp16`)" in result.stdout
    write("tasks/qa/training/train_sft.sh", "torchrun --nproc_per_node 1 ./sft/run_sft.py \\\n    --bf16 \\\n    --tf32 True\n")
    result = run_cli("scan", ".", "--select", "SF902", "--no-summary", cwd=tmp_path)
    assert "fp32" not in result.stdout and "TF32" not in result.stdout


def test_shell_variables_the_launch_script_sets_once_are_read(write, run_cli, tmp_path):
    write("train.py", HF_SCRIPT)
    write("run.sh", "batch=1\nsteps=8\nprecision=bf16\n\ntorchrun train.py --output_dir out \\\n"
                    "    --per_device_train_batch_size ${batch} --${precision} True \\\n"
                    "    --gradient_accumulation_steps $steps\n")
    result = run_cli("scan", ".", "--select", "SF902", "--no-summary", cwd=tmp_path)
    assert "run.sh:7:5: SF902 a micro-batch of 1 with 8 accumulation steps" in result.stdout
    assert "fp32" not in result.stdout  # `--${precision}` is `--bf16`
    # a value the caller may set (`${BATCH:-1}`), or a variable set twice, stays unknown
    write("run.sh", "steps=8\nif [ -n \"$BIG\" ]; then\n  batch=16\nfi\nbatch=${BATCH:-1}\n"
                    "torchrun train.py --output_dir out --bf16 True --per_device_train_batch_size $batch "
                    "--gradient_accumulation_steps $steps\n")
    assert "micro-batch" not in run_cli("scan", ".", "--select", "SF902", "--no-summary", cwd=tmp_path).stdout


def test_a_launch_script_runs_the_file_of_that_name_nearest_to_it(write, run_cli, tmp_path):
    write("train.py", HF_SCRIPT)
    write("flax/scripts/run.sh", "python train.py --output_dir out --bf16 True\n")
    result = run_cli("scan", "train.py", "--select", "SF902", "--no-summary", cwd=tmp_path)
    assert "bf16" not in result.stdout  # no other `train.py`: run from the project's top, it is this one
    write("flax/train.py", "import jax\n")
    result = run_cli("scan", "train.py", "--select", "SF902", "--no-summary", cwd=tmp_path)
    assert "keep slow defaults: fp32" in result.stdout  # the command runs flax/train.py, not this script


@pytest.mark.parametrize("precision, reported", [('"fp16": {"enabled": True, "loss_scale_window": 100}', True),
                                                ('"bf16": {"enabled": True}', False)])
def test_a_deepspeed_dict_a_helper_of_another_file_returns_is_read(precision, reported, write, run_cli, tmp_path):
    """DeepSpeed-Chat and its forks (Yi's fine-tuning): `ds_config = get_train_ds_config(...)` of
    `utils/ds_utils.py`, which returns a dict literal."""
    write("utils/__init__.py", "")
    write("utils/ds_utils.py", "GLOBAL_BATCH_SIZE = 32\n\n\ndef get_train_ds_config(offload, stage=2):\n"
                               "    zero = {'stage': stage, 'offload_optimizer': {'device': 'cpu' if offload else 'none'}}\n"
                               "    return {\n        'train_batch_size': GLOBAL_BATCH_SIZE,\n        'zero_optimization': zero,\n"
                               f"        {precision},\n        'gradient_clipping': 1.0,\n    }}\n")
    write("main.py", "import deepspeed\nimport torch\nfrom utils.ds_utils import get_train_ds_config\n\n"
                     "ds_config = get_train_ds_config(offload=False)\nmodel = Net()\n"
                     "optimizer = torch.optim.AdamW(model.parameters(), fused=True)\n"
                     "engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)\n"
                     "for batch in loader:\n    loss = engine(batch.cuda())\n    engine.backward(loss)\n    engine.step()\n")
    found = run_cli("scan", ".", "--select", "SF905", "--no-summary", cwd=tmp_path).stdout
    assert ("main.py:5:13: SF905 the config `get_train_ds_config(...)` returns: \"fp16\" trains with dynamic loss scaling"
            in found) is reported, found


def test_a_deepspeed_json_named_by_a_launch_script_is_read(write, run_cli, tmp_path):
    write("train.py", HF_SCRIPT)
    write("run.sh", "deepspeed train.py --output_dir out --bf16 True --deepspeed ds/z2.json\n")
    write("ds/z2.json", '{\n  "bf16": {"enabled": "auto"},\n  "wall_clock_breakdown": true\n}\n')
    result = run_cli("scan", ".", "--select", "SF905", "--no-summary", cwd=tmp_path)
    assert result.stdout.startswith('ds/z2.json:3:3: SF905 "wall_clock_breakdown": true')


def test_a_deepspeed_json_handed_down_from_an_option_a_launch_script_sets(write, run_cli, tmp_path):
    """CleanTransformer's layout: `deepspeed.initialize(config_params=ds_config)` in `train()`,
    which `__main__` calls with `ds_config=run_config.ds_config`; `run_config = init_args()`,
    whose parser ends with `args, _unknown = parser.parse_known_args()`; the launch script
    passes `--ds_config scripts/ds.json`."""
    write("train.py", """\
        import argparse
        import deepspeed

        def train(model, loader, ds_config=None):
            engine, optimizer, _, _ = deepspeed.initialize(config_params=ds_config, model=model,
                                                           model_parameters=model.parameters())
            for batch in loader:
                engine.backward(engine(batch))
                engine.step()

        def init_args():
            parser = argparse.ArgumentParser()
            parser.add_argument("--ds_config", default=None, type=str)
            args, _unknown = parser.parse_known_args()
            return args

        if __name__ == "__main__":
            run_config = init_args()
            train(build_model(), build_loader(), ds_config=run_config.ds_config)
        """)
    write("scripts/run.sh", "torchrun --nproc_per_node 4 train.py \\\n  --ds_config scripts/ds.json\n")
    write("scripts/ds.json", '{\n  "bf16": {"enabled": true},\n  "wall_clock_breakdown": true\n}\n')
    result = run_cli("scan", ".", "--select", "SF905", "--no-summary", cwd=tmp_path)
    assert result.stdout.startswith('scripts/ds.json:3:3: SF905 "wall_clock_breakdown": true')


@pytest.mark.parametrize("set_later, fp32_reported", [
    ('config["bf16"] = {"enabled": True}', False),  # a key set after the literal: it may be 16-bit
    ("pass", True),
])
def test_a_deepspeed_dict_handed_to_a_function_with_keys_set_after_it(write, run_cli, tmp_path, set_later, fp32_reported):
    """DeepSpeedExamples' offload_states.py: `config_dict = {...}`, then `config_dict["bf16"] = ...`
    under a dtype test, handed to `run_model(model, config_dict)`, which initializes the engine."""
    write("train.py", f"""\
        import deepspeed

        def run_model(model, config, loader):
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
            for x, y in loader:
                engine.backward(engine(x, y))
                engine.step()

        def main():
            config = {{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {{"stage": 3}}}}
            if use_bf16():
                {set_later}
            run_model(build_model(), config, build_loader())

        if __name__ == "__main__":
            main()
        """)
    result = run_cli("scan", ".", "--select", "SF905", "--no-summary", cwd=tmp_path)
    assert ('enables neither "bf16" nor "fp16"' in result.stdout) is fp32_reported


@pytest.mark.parametrize("launch, expected", [
    ("torchrun --nproc_per_node 4 train.py --use_torch_amp\n", "SF207"),  # the project's run turns it on
    ("torchrun --nproc_per_node 4 train.py\n", "SF202"),  # no run does: fp32
])
def test_an_autocast_behind_a_parameter_the_launch_command_sets(write, run_cli, tmp_path, launch, expected):
    """CleanTransformer's ft_bloom_DDP.py: `if use_torch_amp: with torch.cuda.amp.autocast():` in
    `train(..., use_torch_amp=None)`, called with `use_torch_amp=run_config.use_torch_amp`."""
    write("train.py", """\
        import argparse
        import torch

        def train(model, loader, optimizer, use_torch_amp=None):
            scaler = torch.cuda.amp.GradScaler()
            for x in loader:
                if use_torch_amp:
                    with torch.cuda.amp.autocast():
                        loss = model(x.cuda()).mean()
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    model(x.cuda()).mean().backward()
                    optimizer.step()

        def init_args():
            parser = argparse.ArgumentParser()
            parser.add_argument("--use_torch_amp", action="store_true", default=False)
            args, _unknown = parser.parse_known_args()
            return args

        if __name__ == "__main__":
            run_config = init_args()
            model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096)).cuda()
            train(model, [], torch.optim.AdamW(model.parameters(), fused=True), use_torch_amp=run_config.use_torch_amp)
        """)
    write("scripts/run.sh", launch)
    result = run_cli("scan", ".", "--select", "SF202,SF207", "--output-format", "json", cwd=tmp_path)
    assert [f["code"] for f in json.loads(result.stdout)] == [expected]


def test_a_deepspeed_config_handed_down_by_a_function_that_calls_itself(write, run_cli, tmp_path):
    """The parameter's value is what the function's own (recursive) call passes: the way back
    through callers ends, and the engine is still found."""
    write("train.py", """\
        import deepspeed

        def train(model, ds_config=None, n=3):
            if n:
                return train(model, ds_config, n - 1)
            engine, _, _, _ = deepspeed.initialize(config_params=ds_config, model=model, model_parameters=model.parameters())
            for x in loader:
                engine.backward(engine(x))
                engine.step()
        """)
    result = run_cli("scan", ".", "--select", "SF905", "--output-format", "json", cwd=tmp_path)
    assert result.exit_code == 1 and [f["code"] for f in json.loads(result.stdout)] == ["SF905"]


def test_accelerate_precision_from_the_launch_config_file(write, run_cli, tmp_path):
    write("train.py", "from accelerate import Accelerator\naccelerator = Accelerator()\naccelerator.backward(loss)\n")
    assert "SF904" in run_cli("scan", ".", "--select", "SF904", "--no-summary", cwd=tmp_path).stdout  # fp32 default
    write("launch.sh", "accelerate launch --config_file configs/one_gpu.yaml train.py\n")
    write("configs/one_gpu.yaml", "distributed_type: 'NO'\nmixed_precision: bf16\n")
    assert run_cli("scan", ".", "--select", "SF904", "--no-summary", cwd=tmp_path).stdout == ""
    # Accelerate's cv_example: the README's multi-GPU run names a config the user writes with
    # `accelerate config`; its single-GPU run sets nothing, so that documented run is fp32
    write("launch.sh", "accelerate launch --config_file config.yaml train.py\n")
    assert run_cli("scan", ".", "--select", "SF904", "--no-summary", cwd=tmp_path).stdout == ""  # unknown: silent
    write("README.md", "```bash\npython train.py  # from a server with a GPU\n```\n")
    assert "a launch command of the project runs the script without it" in \
        run_cli("scan", ".", "--select", "SF904", "--no-summary", cwd=tmp_path).stdout


_DIFFUSERS_ACCELERATE = """\
import argparse
import torch
from accelerate import Accelerator
from diffusers import UNet2DConditionModel

parser = argparse.ArgumentParser()
parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16"])
args = parser.parse_args()
accelerator = Accelerator(mixed_precision=args.mixed_precision)
weight_dtype = torch.float32
if accelerator.mixed_precision == "fp16":
    weight_dtype = torch.float16
elif accelerator.mixed_precision == "bf16":
    weight_dtype = torch.bfloat16
unet = UNet2DConditionModel.from_pretrained("some/model", subfolder="unet")
vae.to(accelerator.device, dtype=weight_dtype)
optimizer = torch.optim.AdamW(unet.parameters(), fused=True)
unet, optimizer, loader = accelerator.prepare(unet, optimizer, loader)
for batch in loader:
    loss = unet(batch["x"], batch["t"], batch["c"]).sample.pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
"""


def test_accelerate_launched_with_mixed_precision_no_trains_in_fp32(write, run_cli, tmp_path):
    """AudioEditing: `accelerate launch --mixed_precision="no" train.py` in every launch script, a
    diffusers `weight_dtype` chosen by `accelerator.mixed_precision`: the run is fp32 for certain
    (a warning, and TF32 advice); with no launch command the machine's `accelerate config` may
    set it (an info note of medium impact, no TF32 advice)."""
    write("train.py", _DIFFUSERS_ACCELERATE)
    found = json.loads(run_cli("scan", ".", "--select", "SF904,SF201", "--output-format", "json", cwd=tmp_path).stdout)
    assert [(f["code"], f["severity"], f["impact"]) for f in found] == [("SF904", "info", "medium")]
    write("train.sh", 'accelerate launch --mixed_precision="no" --num_processes=8 train.py --mixed_precision="no"\n')
    found = json.loads(run_cli("scan", ".", "--select", "SF904,SF201", "--output-format", "json", cwd=tmp_path).stdout)
    assert sorted(f["code"] for f in found) == ["SF201", "SF904"], found
    (fp32,) = [f for f in found if f["code"] == "SF904"]
    assert 'every launch command runs it with `--mixed_precision="no"`' in fp32["message"] and fp32["severity"] == "warning"


_GATED_AMP_UNDER_ACCELERATE = """\
import argparse
import torch
from accelerate import Accelerator, DeepSpeedPlugin, DistributedDataParallelKwargs
parser = argparse.ArgumentParser()
parser.add_argument("--use_amp", action="store_true", default=False)
args = parser.parse_args()
handlers = [DistributedDataParallelKwargs(find_unused_parameters=True)]
accelerator = Accelerator(kwargs_handlers=handlers{plugin})
model = torch.nn.Linear(1024, 1024)
optimizer = torch.optim.Adam(model.parameters())
model, optimizer = accelerator.prepare(model, optimizer)
scaler = torch.cuda.amp.GradScaler() if args.use_amp else None
for x in range(10):
    if args.use_amp:
        with torch.cuda.amp.autocast():
            loss = model(x).sum()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss = model(x).sum()
        accelerator.backward(loss)
        optimizer.step()
"""


@pytest.mark.parametrize("plugin, launch, expected", [
    ("", "python train.py\n", {"SF202", "SF904"}),  # fp32 by default; one process: no DDP wrapper
    ("", "accelerate launch --mixed_precision bf16 train.py\n", {"SF803"}),  # Accelerate's bf16 autocast
    (", deepspeed_plugin=DeepSpeedPlugin(hf_ds_config='ds.json')", "python train.py\n", set()),
])
def test_an_autocast_flag_off_by_default_under_accelerate_that_launches_in_bf16(plugin, launch, expected, write,
                                                                                run_cli, tmp_path):
    """Time-LLM: an `--use_amp` autocast that is off by default is not the run's precision when
    `accelerate launch --mixed_precision bf16` or the DeepSpeed plugin's config sets it; the DDP
    handler is never read once DeepSpeed wraps the model."""
    write("train.py", _GATED_AMP_UNDER_ACCELERATE.format(plugin=plugin))
    write("ds.json", '{"bf16": {"enabled": true}, "zero_optimization": {"stage": 2}}\n')
    write("run.sh", launch)
    result = run_cli("scan", ".", "--select", "SF202,SF803,SF904", "--output-format", "json", cwd=tmp_path)
    assert {finding["code"] for finding in json.loads(result.stdout)} == expected


@pytest.mark.parametrize("precision, expected", [
    ("fp16", ["configs/run.yaml:3:1: SF904 `mixed_precision: fp16` (mixed_precision of `Accelerator`) scales the loss "
              "and checks every gradient for inf each step; bf16 needs neither (impact: medium)"]),
    ("bf16", []),
])
def test_accelerate_precision_from_a_config_spread_into_main(precision, expected, write, run_cli, tmp_path):
    """Tune-A-Video's `main(**OmegaConf.load(args.config))`: `main`'s `mixed_precision`
    parameter is the YAML's entry (its own default "fp16" does not count), reported at its line."""
    write("train.py", """\
        import argparse
        from accelerate import Accelerator
        from omegaconf import OmegaConf

        def main(output_dir, lr=1e-4, mixed_precision="fp16"):
            accelerator = Accelerator(mixed_precision=mixed_precision)
            accelerator.backward(loss)

        if __name__ == "__main__":
            parser = argparse.ArgumentParser()
            parser.add_argument("--config", type=str, default="./configs/run.yaml")
            args = parser.parse_args()
            main(**OmegaConf.load(args.config))
        """)
    write("configs/run.yaml", f"output_dir: runs\nlr: 3.0e-5\nmixed_precision: {precision}\n")
    result = run_cli("scan", "train.py", "--select", "SF904", "--no-summary", cwd=tmp_path)
    assert result.stdout.splitlines() == expected


@pytest.mark.parametrize("gpus, reported", [("4", True), ("0", False)])
def test_lightning_1x_ddp_accelerator_trains_on_the_gpus_it_is_given(gpus, reported, write, run_cli, tmp_path):
    """LoFTR's launch script: `--gpus=4 --accelerator="ddp"`; in Lightning 1.x `accelerator` named
    the distributed backend, so the GPUs are what `gpus` says, and the fp32 default is reported."""
    write("train.py", """\
        import argparse
        import pytorch_lightning as pl

        def parse_args():
            parser = argparse.ArgumentParser()
            parser.add_argument("--exp_name", type=str, default="default")
            parser = pl.Trainer.add_argparse_args(parser)
            return parser.parse_args()

        def main():
            args = parse_args()
            trainer = pl.Trainer.from_argparse_args(args, replace_sampler_ddp=False)
            trainer.fit(Matcher(), datamodule=Pairs())

        if __name__ == "__main__":
            main()
        """)
    write("scripts/train.sh", f'n_gpus={gpus}\npython -u ./train.py --exp_name=outdoor --gpus=${{n_gpus}} '
                              '--accelerator="ddp" --benchmark=True\n')
    result = run_cli("scan", "train.py", "--select", "SF901", "--no-summary", cwd=tmp_path)
    assert ("trains in fp32 (`precision` defaults to 32)" in result.stdout) is reported


def test_zero_grad_of_an_optimizer_accelerate_hands_to_deepspeed_is_left_alone(write, run_cli, tmp_path):
    write("train.py", "import torch\nfrom accelerate import Accelerator\naccelerator = Accelerator()\n"
                      "optimizer = torch.optim.AdamW(model.parameters())\n"
                      "model, optimizer = accelerator.prepare(model, optimizer)\noptimizer.zero_grad()\n")
    write("requirements.txt", "torch==1.13.1\n")
    write("launch.sh", "accelerate launch --config_file configs/multi.yaml train.py\n")
    config = write("configs/multi.yaml", "distributed_type: MULTI_GPU\nmixed_precision: bf16\n")
    assert "train.py:6:1: SF402" in run_cli("scan", ".", "--select", "SF402", "--no-summary", cwd=tmp_path).stdout
    config.write_text("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\nmixed_precision: bf16\n")
    assert run_cli("scan", ".", "--select", "SF402", "--no-summary", cwd=tmp_path).stdout == ""


CHECKPOINTED = """\
from dataclasses import dataclass, field

from transformers import AutoModelForCausalLM, HfArgumentParser


@dataclass
class Options:
    use_lora: bool = False
    gradient_checkpointing: bool = field(default=False)


def main(args: Options):
    model = AutoModelForCausalLM.from_pretrained("gpt2")
    if args.use_lora:
        model = add_adapters(model)
    elif args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    train(model)


if __name__ == "__main__":
    (options,) = HfArgumentParser((Options,)).parse_args_into_dataclasses()
    main(options)
"""


def test_gradient_checkpointing_only_where_a_launch_command_reaches_it(write, run_cli, tmp_path):
    """Behind dataclass options that default to off, on a path that the project's commands take
    only if one of them turns it on (and not the LoRA branch before it)."""
    write("finetune.py", CHECKPOINTED)
    assert run_cli("scan", ".", "--select", "SF902", "--no-summary", cwd=tmp_path).stdout == ""  # off by default
    write("scripts/lora.sh", "accelerate launch finetune.py --use_lora --gradient_checkpointing\n")
    assert run_cli("scan", ".", "--select", "SF902", "--no-summary", cwd=tmp_path).stdout == ""  # the LoRA branch
    write("scripts/full.sh", "accelerate launch finetune.py --gradient_checkpointing\n")
    result = run_cli("scan", ".", "--select", "SF902", "--no-summary", cwd=tmp_path)
    assert result.stdout.startswith("finetune.py:17:9: SF902 `gradient_checkpointing_enable()` saves memory")


def test_gradient_checkpointing_of_parsed_training_arguments_follows_the_json_each_run_names(write, run_cli, tmp_path):
    """`train.py run.json` (read by `HfArgumentParser.parse_json_file`): the flag of each run."""
    write("train.py", "import sys\nimport torch\nfrom transformers import AutoModel, HfArgumentParser, TrainingArguments\n"
                      "parser = HfArgumentParser((TrainingArguments,))\n"
                      "(args,) = parser.parse_json_file(sys.argv[1]) if sys.argv[1:] else parser.parse_args_into_dataclasses()\n"
                      "model = AutoModel.from_pretrained('bert-base-uncased')\n"
                      "if args.gradient_checkpointing:\n    model.gradient_checkpointing_enable()\n"
                      "for batch in loader:\n    accelerator.backward(model(**batch).loss)\n")
    write("README.md", "```\naccelerate launch train.py configs/small.json\n```\n")
    config = write("configs/small.json", '{"output_dir": "out", "gradient_checkpointing": false}')
    assert "gradient_checkpointing_enable" not in run_cli("scan", ".", "--select", "SF902", "--no-summary", cwd=tmp_path).stdout
    config.write_text('{"output_dir": "out", "gradient_checkpointing": true}')
    result = run_cli("scan", ".", "--select", "SF902", "--no-summary", cwd=tmp_path)
    assert "train.py:8:5: SF902 `gradient_checkpointing_enable()` saves memory" in result.stdout


@pytest.mark.parametrize("checkpoint, reported", [("EleutherAI/pythia-160m", True), ("meta-llama/Llama-2-7b-hf", False)])
def test_a_micro_batch_of_a_billion_parameter_model_is_left_alone(checkpoint, reported, write, run_cli, tmp_path):
    """LongLoRA fine-tunes Llama-2-7B on 8k tokens with a micro-batch of 1 x 8 accumulation
    steps: that is what fits in memory, not a slow default; so is recomputing its activations
    (gradient checkpointing). A small model gets both notes."""
    write("train.py", "import transformers\n"
                      "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
                      f"model = AutoModelForCausalLM.from_pretrained('{checkpoint}')\n"
                      "model.gradient_checkpointing_enable()\n"
                      "args = TrainingArguments(output_dir='out', bf16=True, per_device_train_batch_size=1,\n"
                      "                         gradient_accumulation_steps=8, dataloader_num_workers=4)\n"
                      "Trainer(model=model, args=args, train_dataset=data).train()\n")
    result = run_cli("scan", ".", "--select", "SF902", "--no-summary", cwd=tmp_path)
    assert ("micro-batch of 1 with 8 accumulation steps" in result.stdout) is reported
    assert ("`gradient_checkpointing_enable()` saves memory" in result.stdout) is reported


KBIT = """\
from dataclasses import dataclass, field
import transformers
from transformers import AutoModelForCausalLM, HfArgumentParser


@dataclass
class MyArguments(transformers.TrainingArguments):
    load_in_kbits: int = field(default=16)


def prepare_quantized(model):
    model.gradient_checkpointing_enable()
    return model


(args,) = HfArgumentParser((MyArguments,)).parse_args_into_dataclasses()
model = AutoModelForCausalLM.from_pretrained("gpt2")
if args.load_in_kbits in [4, 8]:
    model = prepare_quantized(model)
"""


STRING_OPTION = KBIT.replace("load_in_kbits: int = field(default=16)", 'quantization: str = field(default="none")') \
    .replace("if args.load_in_kbits in [4, 8]:", 'if args.quantization == "4bit":')


@pytest.mark.parametrize("code, off, on", [
    (KBIT, "--load_in_kbits 16", "--load_in_kbits 4"),  # a number in a list
    (STRING_OPTION, "--quantization none", "--quantization 4bit"),  # a string compared with ==
])
def test_gradient_checkpointing_in_a_helper_only_a_quantized_run_calls(code, off, on, write, run_cli, tmp_path):
    """The helper runs only for a quantized load; a launch command's value decides the test (the
    field's default where a command leaves it out): with `off` no run reaches the checkpointing."""
    write("train.py", code)
    write("run.sh", f"torchrun train.py --output_dir out --bf16 True {off}\n")
    assert "gradient_checkpointing_enable" not in run_cli("scan", ".", "--select", "SF902", "--no-summary",
                                                          cwd=tmp_path).stdout
    write("run.sh", f"torchrun train.py --output_dir out --bf16 True {on}\n")
    result = run_cli("scan", ".", "--select", "SF902", "--no-summary", cwd=tmp_path)
    assert "train.py:12:5: SF902 `gradient_checkpointing_enable()` saves memory" in result.stdout


CPU_DEFAULT = """\
import argparse
import torch
parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cpu")
args = parser.parse_args()
model = Net().to(args.device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in batches:
    loss = criterion(model(x.to(args.device)), y.to(args.device))
    loss.backward()
    optimizer.step()
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
"""


def test_a_device_option_that_defaults_to_the_cpu_unless_a_launch_command_passes_cuda(write, run_cli, tmp_path):
    write("train.py", CPU_DEFAULT)
    assert "SF202" not in run_cli("scan", ".", "--select", "SF202", "--no-summary", cwd=tmp_path).stdout
    write("run.sh", "python train.py --device cuda:0\n")
    assert "SF202" in run_cli("scan", ".", "--select", "SF202", "--no-summary", cwd=tmp_path).stdout


# An RL agent (pytorch-soft-actor-critic's shape): `main.py` parses `--cuda`, a `store_true` flag,
# and hands its options to the agent class of `agent.py`, which picks its device from it.
SAC_MAIN = """\
import argparse
from agent import Agent
parser = argparse.ArgumentParser()
parser.add_argument("--cuda", action="store_true", help="run on cuda (default: False)")
args = parser.parse_args()
agent = Agent(8, 2, args)
for episode in range(1000):
    agent.update_parameters(memory, 256)
"""
SAC_AGENT = """\
import torch
from model import QNetwork

class Agent:
    def __init__(self, inputs, actions, args):
        self.device = torch.device("cuda" if args.cuda else "cpu")
        self.critic = QNetwork(inputs, actions).to(device=self.device)
        self.critic_optim = torch.optim.Adam(self.critic.parameters(), lr=3e-4)

    def update_parameters(self, memory, batch_size):
        state, reward = memory.sample(batch_size)
        state = torch.FloatTensor(state).to(self.device)
        loss = (self.critic(state) - torch.FloatTensor(reward).to(self.device)).pow(2).mean()
        self.critic_optim.zero_grad()
        loss.backward()
        self.critic_optim.step()
        return loss.item()
"""
SAC_MODEL = """\
import torch

class QNetwork(torch.nn.Module):
    def __init__(self, inputs, actions):
        super().__init__()
        self.linear = torch.nn.Linear(inputs + actions, 256)

    def forward(self, x):
        return self.linear(x)
"""


def test_an_agent_on_the_cpu_unless_cuda_is_asked_for_gets_no_gpu_advice(write, run_cli, tmp_path):
    """`torch.device("cuda" if args.cuda else "cpu")` with `--cuda` off by default: the default
    run is on the CPU, also where the option is parsed in the script that hands it over. The
    README's `--help` listing and usage line name the flag but pass it in no command; a command
    that passes it brings the GPU advice back."""
    write("main.py", SAC_MAIN)
    write("agent.py", SAC_AGENT)
    write("model.py", SAC_MODEL)
    write("README.md", "```\nusage: main.py [-h] [--cuda]\n\n  --cuda      run on CUDA (default: False)\n```\n\n"
          "```\npython main.py\n```\n")
    assert run_cli("scan", ".", "--no-summary", cwd=tmp_path).stdout == ""
    write("README.md", "```\npython main.py --cuda\n```\n")
    found = run_cli("scan", ".", "--no-summary", cwd=tmp_path).stdout
    assert "agent.py:17:16: SF301" in found and "SF401" in found


def _workspace(tmp_path: Path) -> Path:
    """The bundled hydra workspace project: `train.py` builds the class a config's `_target_`
    names, whose `run()` trains on `torch.device(cfg.training.device)`."""
    project = tmp_path / "hydra_workspace"
    shutil.copytree(PROJECTS / "hydra_workspace", project)
    return project


def test_a_device_every_run_config_of_the_package_names_is_where_a_workspace_trains(run_cli, tmp_path):
    """`pkg/config/*.yaml` beside `pkg/workspace/` is read; their `training.device` is CUDA in
    each, so the workspace trains on a GPU. When one config says `cpu`, the device is unknown:
    the file itself never names CUDA, and no GPU advice is given."""
    project = _workspace(tmp_path)
    assert "SF202" in run_cli("scan", ".", "--no-summary", cwd=project).stdout
    mlp = project / "dpolicy" / "config" / "train_mlp_workspace.yaml"
    mlp.write_text(mlp.read_text().replace("device: cuda:0", "device: cpu"))
    assert run_cli("scan", ".", "--no-summary", cwd=project).stdout == ""


@pytest.mark.parametrize("step, fixed", [("self.model.compute_loss(batch)", False),
                                         ("F.mse_loss(self.model(batch['action']), batch['action'])", True)])
def test_compile_advice_for_a_model_the_step_runs_through_a_method_of_its_own(step, fixed, run_cli, tmp_path):
    """A hydra-built optimizer (`instantiate(cfg.optimizer, params=self.model.parameters())`)
    trains `self.model`. A step that runs only `self.model.compute_loss(batch)` never calls the
    compiled `forward`: no fix, and the reason names the method to compile instead."""
    project = _workspace(tmp_path)
    workspace = project / "dpolicy" / "workspace" / "train_unet_workspace.py"
    code = workspace.read_text().replace("self.model.compute_loss(batch)", step)
    workspace.write_text("import torch.nn.functional as F\n" + code)
    result = run_cli("scan", ".", "--select", "SF501", "--output-format", "json", cwd=project)
    (finding,) = json.loads(result.stdout)
    assert (finding["fix"] is not None) is fixed
    if not fixed:
        assert "`self.model.compute_loss = torch.compile(self.model.compute_loss)`" in finding["no_fix_reason"]


AGENT = """\
import torch
import torch.nn.functional as F
from torch import nn


class Agent:
    def __init__(self, obs_dim, device, lr, use_tb):
        self.device = device
        self.use_tb = use_tb
        self.critic = nn.Sequential(nn.Linear(obs_dim, 1024), nn.ReLU(), nn.Linear(1024, 1)).to(device)
        self.critic_target = nn.Sequential(nn.Linear(obs_dim, 1024), nn.ReLU(), nn.Linear(1024, 1)).to(device)
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=lr)

    def update_critic(self, obs, reward, next_obs):
        metrics = {}
        with torch.no_grad():
            target = reward + 0.99 * self.critic_target(next_obs)
        loss = F.mse_loss(self.critic(obs), target)
        if self.use_tb:
            metrics["critic_loss"] = loss.item()
        self.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.critic_opt.step()
        return metrics

    def update(self, replay_iter, step):
        obs, reward, next_obs = [torch.as_tensor(x, device=self.device) for x in next(replay_iter)]
        return self.update_critic(obs, reward, next_obs)
"""
WORKSPACE = """\
import hydra
import torch


class Workspace:
    def __init__(self, cfg):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.agent = hydra.utils.instantiate(cfg.agent)

    def train(self):
        for step in range(self.cfg.num_train_frames):
            self.agent.update(self.replay_iter, step)


@hydra.main(config_path="cfgs", config_name="config")
def main(cfg):
    Workspace(cfg).train()
"""


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_an_agent_hydra_builds_trains_on_the_device_its_config_gives_it(device, write, run_cli, tmp_path):
    """`agent: {_target_: agent.Agent, device: ${device}}` in `cfgs/config.yaml`: the agent's
    constructor gets the top-level `device`, so its file trains on CUDA though it never names it.
    Its `update()` runs `update_critic()` (which steps the optimizer) once: a step, so the
    `.item()` there syncs every update. The target network evaluated under `no_grad` is a copy of
    the critic, not a frozen backbone: the compile fix stays."""
    write("agent.py", AGENT)
    write("train.py", WORKSPACE)
    write("cfgs/config.yaml", f"""\
        device: {device}
        num_train_frames: 1000000
        agent:
          _target_: agent.Agent
          obs_dim: 24
          device: ${{device}}
          lr: 1e-4
          use_tb: true
        """)
    result = run_cli("scan", ".", "--select", "SF301,SF401,SF501", "--output-format", "json", cwd=tmp_path)
    found = {(f["path"], f["code"], f["fix"] is not None) for f in json.loads(result.stdout)}
    assert found == ({("agent.py", "SF301", False), ("agent.py", "SF401", True), ("agent.py", "SF501", True)}
                     if device == "cuda" else set())


def test_plain_interpolations_of_a_yaml_file_read_as_their_values(tmp_path):
    tree = parse_yaml("device: cuda\nagent:\n  device: ${device}\n  dir: ${now:%H}\n  other: ${missing.key}\n",
                      tmp_path / "c.yaml")
    assert tree.get("agent", "device").value == "cuda"
    assert tree.get("agent", "device").where.line == 3  # still points at its own line
    assert tree.get("agent", "dir").value == "${now:%H}" and tree.get("agent", "other").value == "${missing.key}"


# ---------------------------------------------------------------------- the torch a project pins
ADAM = """\
import torch
model = Net().cuda()
opt = torch.optim.AdamW(model.parameters())
for x in loader:
    model(x.cuda()).sum().backward()
    opt.step()
"""


def test_a_pinned_torch_below_2_silences_advice_that_needs_torch_2(write, run_cli, tmp_path):
    write("train.py", ADAM)
    write("requirements.txt", "numpy\ntorch==1.13.1+cu117  # the cluster's CUDA\n")
    assert "train.py:" not in run_cli("scan", "train.py", "--select", "SF401", cwd=tmp_path).stdout
    # the version named on the command line wins over the pin
    pinned = run_cli("scan", "train.py", "--select", "SF401", "--torch-version", "2.4", cwd=tmp_path)
    assert "SF401" in pinned.stdout
    write("requirements.txt", "torch>=1.13\n")  # a pin that admits the installed torch changes nothing
    assert "SF401" in run_cli("scan", "train.py", "--select", "SF401", cwd=tmp_path).stdout
    # conda's name, as an exported environment writes it (attention-is-all-you-need-pytorch)
    write("requirements.txt", "python==3.6.12\npytorch==1.3.1\npytorch-lightning==0.7.5\n")
    assert "train.py:" not in run_cli("scan", "train.py", "--select", "SF401", cwd=tmp_path).stdout
    write("requirements.txt", "pytorch-lightning==0.7.5\n")  # not torch itself
    assert "SF401" in run_cli("scan", "train.py", "--select", "SF401", cwd=tmp_path).stdout


def test_a_torch_pin_is_also_read_from_poetry_a_readme_install_line_or_an_old_lightning(write, run_cli, tmp_path):
    write("train.py", ADAM)
    # Poetry's table (PyTorch-YOLOv3): torch below 1.13, so no fused-optimizer advice
    write("pyproject.toml", '[tool.poetry.dependencies]\npython = "^3.8"\ntorch = ">=1.10.1, < 1.13.0"\n')
    assert "train.py:" not in run_cli("scan", "train.py", "--select", "SF401", cwd=tmp_path).stdout
    write("pyproject.toml", '[tool.poetry.dependencies]\ntorch = {version = "^2.1", source = "cu121"}\n')
    assert "SF401" in run_cli("scan", "train.py", "--select", "SF401", cwd=tmp_path).stdout  # ^2.1 admits it
    (tmp_path / "pyproject.toml").unlink()
    # an install command of the README, where no requirement file names torch (ngp_pl)
    write("requirements.txt", "einops\n")
    write("README.md", "Works with any recent torch.\n\n* Install pytorch by `pip install torch==1.11.0 "
          "--extra-index-url https://download.pytorch.org/whl/cu113`\n")
    text = run_cli("scan", ".", "--select", "SF401", cwd=tmp_path).stdout
    assert "train.py:" not in text and "README.md: note: the project pins `torch==1.11.0` here" in text, text
    write("README.md", "We trained with torch==1.11.0 but newer ones work.\n")  # prose, no install command
    assert "SF401" in run_cli("scan", "train.py", "--select", "SF401", cwd=tmp_path).stdout
    # a table of the versions the authors ran (DiffSBDD)
    write("README.md", "| Software | Version |\n|---|---|\n| Python | 3.10.4 |\n| PyTorch | 1.12.1 |\n")
    text = run_cli("scan", ".", "--select", "SF401", cwd=tmp_path).stdout
    assert "train.py:" not in text and "README.md: note: the project pins `torch==1.12.1` here" in text, text
    write("README.md", "We trained with torch==1.11.0 but newer ones work.\n")
    # a Lightning release from before torch 2 pins an old torch with it
    write("requirements.txt", "pytorch-lightning==1.7.7\n")
    text = run_cli("scan", ".", "--select", "SF401", cwd=tmp_path).stdout
    assert "train.py:" not in text, text
    assert "the project pins `pytorch-lightning==1.7.7` (so `torch<2`) here" in text, text
    write("requirements.txt", "lightning>=2.1\n")
    assert "SF401" in run_cli("scan", "train.py", "--select", "SF401", cwd=tmp_path).stdout
    # a requirement on a wheel's URL, written once per Python version (simple-simcse's export)
    wheel = "https://download.pytorch.org/whl/cu113/torch-1.12.1%2Bcu113-cp39-cp39-linux_x86_64.whl"
    write("requirements.txt", f'torch @ {wheel} ; python_version >= "3.9"\ntorch @ {wheel} ; python_version < "3.9"\n')
    write("pyproject.toml", f'[tool.poetry.dependencies]\ntorch = {{ url = "{wheel}" }}\n')
    text = run_cli("scan", ".", "--select", "SF401", cwd=tmp_path).stdout
    assert "train.py:" not in text and "the project pins `torch==1.12.1` here" in text, text


@pytest.mark.parametrize("line, pinned", [
    ("  - pytorch=1.11.0", True),  # conda's one `=`: this version
    ("  - pytorch::pytorch=1.11.0=py3.8_cuda11.3_cudnn8.2.0_0", True),
    ("  - pytorch==1.7.0", True),
    ("  - pip:\n    - torch==1.13.1", True),
    ("  - pytorch>=2.1", False),
    ("  - pytorch", False),
])
def test_a_torch_pin_is_read_from_a_conda_environment_file(write, run_cli, tmp_path, line, pinned):
    write("train.py", ADAM)
    write("environment.yml", f"name: env\nchannels:\n  - pytorch\ndependencies:\n  - python=3.8\n{line}\n")
    text = run_cli("scan", ".", "--select", "SF401", cwd=tmp_path).stdout
    assert ("train.py:" not in text) is pinned, text
    assert ("environment.yml: note: the project pins" in text) is pinned, text
    (tmp_path / "environment.yml").rename(tmp_path / "env.yml")  # cdvae's name for it
    text = run_cli("scan", ".", "--select", "SF401", cwd=tmp_path).stdout
    assert ("env.yml: note: the project pins" in text) is pinned, text


def test_lightning_on_a_torch_before_1_12_gets_no_tf32_advice(write, run_cli, tmp_path):
    """Before torch 1.12 fp32 matmuls ran in TF32 by default, and the setting's function did not exist."""
    write("train.py", LIGHTNING_FP16.replace("precision=16, ", ""))
    write("requirements.txt", "torch==1.11.0\npytorch-lightning==1.6.5\n")
    assert "TF32" not in run_cli("scan", "train.py", "--select", "SF901", "--no-summary", cwd=tmp_path).stdout
    write("requirements.txt", "torch==1.12.1\npytorch-lightning==1.6.5\n")
    assert "TF32" in run_cli("scan", "train.py", "--select", "SF901", "--no-summary", cwd=tmp_path).stdout


LIGHTNING_FP16 = """\
import torch
import pytorch_lightning as pl
from torch.utils.data import DataLoader

class System(pl.LightningModule):
    def training_step(self, batch, batch_idx):
        return self.net(batch).sum()

    def train_dataloader(self):
        return DataLoader(self.train_set, num_workers=8, persistent_workers=True, pin_memory=True)

    def val_dataloader(self):
        return DataLoader(self.test_set, num_workers=8, pin_memory=True)

trainer = pl.Trainer(accelerator="gpu", devices=1, precision=16, benchmark=True)
trainer.fit(System())
"""


def test_lightning_1x_gets_its_own_bf16_name_and_a_val_dataloader_keeps_its_workers(write, run_cli, tmp_path):
    write("train.py", LIGHTNING_FP16)
    write("requirements.txt", "torch==2.1.0\npytorch-lightning==1.9.5\n")
    result = run_cli("scan", "train.py", "--select", "SF901,SF103", "--output-format", "json", cwd=tmp_path)
    findings = json.loads(result.stdout)
    assert {f["code"] for f in findings} == {"SF901"}, findings  # nothing on the loader of `val_dataloader()`
    (precision,) = [f for f in findings if f["line"] == 15]
    assert '`precision="bf16"`' in precision["message"]  # "bf16-mixed" came with Lightning 2.0
    apply = run_cli("apply", "train.py", "--select", "SF901", "--unsafe-fixes", "--diff", cwd=tmp_path).stdout
    assert 'precision="bf16"' in apply and "bf16-mixed" not in apply, apply
    write("requirements.txt", "torch==2.1.0\nlightning==2.2.0\n")
    findings = json.loads(run_cli("scan", "train.py", "--select", "SF901", "--output-format", "json",
                                  cwd=tmp_path).stdout)
    assert '`precision="bf16-mixed"`' in next(f for f in findings if f["line"] == 15)["message"]


def test_a_pin_that_switches_rules_off_says_which_once_at_the_requirement_file(write, run_cli, tmp_path):
    write("train.py", ADAM)
    write("helpers.py", "import torch\n")
    write("requirements.txt", "torch==0.4.1\n")
    text = run_cli("scan", ".", "--select", "SF202,SF401,SF102", cwd=tmp_path).stdout
    notes = [line for line in text.splitlines() if "note:" in line]
    assert len(notes) == 1, text  # one pin, two scanned files: said once
    assert notes[0].startswith("requirements.txt: note: the project pins `torch==0.4.1` here"), notes
    assert "1 rule that needs" in notes[0] and "SF401 optimizer-not-fused" in notes[0]
    assert "SF102" not in notes[0] and "SF202" not in notes[0] and "`--torch-version " in notes[0]
    # the fp32 loop is still reported: autocast is worth upgrading torch for (no fix on 0.4.1)
    result = run_cli("scan", ".", "--select", "SF202,SF401", "--output-format", "json", cwd=tmp_path)
    findings = json.loads(result.stdout)  # JSON keeps standard output a list of findings
    assert [(f["code"], f["fix"]) for f in findings] == [("SF202", None)], findings
    assert "targets torch 0.4.1: upgrade torch" in findings[0]["message"]
    assert "requirements.txt: note: the project pins `torch==0.4.1`" in result.stderr  # notes: standard error
    # the version named on the command line, or a pin that switches nothing off: no note
    assert "note:" not in run_cli("scan", ".", "--torch-version", "0.4.1", cwd=tmp_path).stdout
    write("requirements.txt", "torch==0.4.1\n")
    assert "note:" not in run_cli("scan", ".", "--select", "SF102", cwd=tmp_path).stdout


# ---------------------------------------------------------------------- recipes named in the project's docs
TRL_SCRIPT = """\
from trl import ModelConfig, TrlParser
from handbook import ScriptArguments, SFTConfig

def main():
    parser = TrlParser((ScriptArguments, SFTConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config()

if __name__ == "__main__":
    main()
"""
HANDBOOK_CONFIGS = """\
from dataclasses import dataclass, field
import trl

@dataclass
class SFTConfig(trl.SFTConfig):
    chat_template: str = field(default=None)
    dataloader_num_workers: int = 4
"""


@pytest.mark.parametrize("model, reported", [("HuggingFaceTB/SmolLM2-360M", True), ("mistralai/Mistral-7B-v0.1", False)])
def test_gradient_checkpointing_of_a_recipe_for_a_billion_parameter_model_is_left_alone(model, reported, write, run_cli, tmp_path):
    """alignment-handbook's zephyr-7b recipe turns gradient checkpointing on for a 7B full
    fine-tune: what lets the batch fit, not a slow default. The same flag for a 360M model is
    reported (information)."""
    write("pyproject.toml", "[project]\nname = 'handbook'\n")
    write("scripts/sft.py", TRL_SCRIPT.replace("from handbook import ScriptArguments, SFTConfig", "from trl import SFTConfig"))
    write("README.md", "```shell\naccelerate launch scripts/sft.py --config recipes/sft.yaml\n```\n")
    write("recipes/sft.yaml", f"model_name_or_path: {model}\nbf16: true\ngradient_checkpointing: true\n")
    result = run_cli("scan", ".", "--select", "SF902", "--no-summary", cwd=tmp_path)
    assert ("`gradient_checkpointing=True` saves memory" in result.stdout) is reported


@pytest.mark.parametrize("models, reported", [(("EleutherAI/pythia-160m", "EleutherAI/pythia-410m"), True),
                                               (("meta-llama/Llama-2-7b-hf", "h2oai/h2o-danube2-1.8b-base"), False)])
def test_gradient_checkpointing_of_models_launch_commands_name_by_an_option_of_their_own(models, reported, write, run_cli,
                                                                                          tmp_path):
    """EasyContext: an Accelerate loop loads `from_pretrained(args.model)` and turns gradient
    checkpointing on; its launch scripts pass `--model meta-llama/Llama-2-7b-hf` and a 1.8B model:
    billion-parameter models on long sequences need the recompute to fit."""
    write("train.py", """\
import argparse
import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM

def main(args):
    accelerator = Accelerator(mixed_precision="bf16")
    model = AutoModelForCausalLM.from_pretrained(args.model)
    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, make_loader(args))
    for batch in loader:
        accelerator.backward(model(**batch).loss)
        optimizer.step()

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=str, default="EleutherAI/pythia-160m")
    main(parser.parse_args())
""")
    write("train.sh", "".join(f"accelerate launch train.py --model {model}\n" for model in models))
    result = run_cli("scan", ".", "--select", "SF902", "--no-summary", cwd=tmp_path)
    assert ("`gradient_checkpointing_enable()` saves memory" in result.stdout) is reported, result.stdout


def test_recipes_that_disagree_are_each_their_own_run(write, run_cli, tmp_path):
    """alignment-handbook's recipes for a 7B and a 360M model, run by the same script: the
    explicit unfused `optim` is reported in each recipe that sets it; gradient checkpointing and
    a micro-batch of 2 with accumulation only in the small model's recipe, where they are waste;
    the README's copies of one command are one finding."""
    write("scripts/dpo.py", TRL_SCRIPT.replace("from handbook import ScriptArguments, SFTConfig", "from trl import SFTConfig"))
    command = "accelerate launch scripts/dpo.py --config recipes/{}.yaml"
    write("README.md", "```shell\n" + "\n".join(command.format(name) for name in ("big", "small", "small")) + "\n```\n")
    recipe = ("model_name_or_path: {}\nbf16: true\ngradient_accumulation_steps: 8\ngradient_checkpointing: true\n"
              "optim: adamw_torch\nper_device_train_batch_size: 2\n")
    write("recipes/big.yaml", recipe.format("mistralai/Mistral-7B-v0.1"))
    write("recipes/small.yaml", recipe.format("HuggingFaceTB/SmolLM2-360M"))
    found = run_cli("scan", ".", "--select", "SF902", "--no-summary", cwd=tmp_path).stdout.splitlines()
    places = [line.split(": SF902 ")[0] for line in found]
    assert places == ["recipes/small.yaml:3:1", "recipes/small.yaml:4:1", "scripts/dpo.py:5:42",
                      "recipes/big.yaml:5:1", "recipes/small.yaml:5:1"], found
    assert found[0].endswith("a micro-batch of 2 with 8 accumulation steps: accumulation does not make training faster, "
                             "a larger `per_device_train_batch_size` with fewer steps does (impact: medium)")
    assert '`optim="adamw_torch"` runs AdamW as several kernels per step' in found[3]


def test_a_recipe_named_in_a_readme_of_another_folder_is_read(write, run_cli, tmp_path):
    """alignment-handbook's layout: the script imports its config class from the project's own
    package (src layout), and only the recipes' READMEs say how it runs (`--config`, a brace
    pair of recipes, a recipe given as the first argument)."""
    write("pyproject.toml", "[project]\nname = 'handbook'\n")
    write("scripts/sft.py", TRL_SCRIPT)
    write("src/handbook/__init__.py", "from .configs import ScriptArguments, SFTConfig\n")
    write("src/handbook/configs.py", HANDBOOK_CONFIGS)
    write("recipes/small/README.md", """\
        Train it:
        ```shell
        accelerate launch scripts/sft.py --config recipes/small/sft/config_{a,b}.yaml
        accelerate launch scripts/sft.py recipes/small/sft/config_a.yaml --load_in_4bit=true
        ```
        """)
    write("recipes/small/sft/config_a.yaml", "bf16: true\ngradient_checkpointing: true\nlearning_rate: 1.0e-5\n")
    write("recipes/small/sft/config_b.yaml", "bf16: true\ngradient_checkpointing: true\nlearning_rate: 2.0e-5\n")
    result = run_cli("scan", ".", "--select", "SF902", "--no-summary", cwd=tmp_path)
    lines = result.stdout.splitlines()
    # the subclass sets the workers itself (unknown here: no advice); compile is left at its default
    assert any(line.startswith("scripts/sft.py:5:") and "`torch_compile`" in line
               and "dataloader_num_workers" not in line for line in lines), result.stdout
    # both recipes turn checkpointing on: the finding points at the YAML line that does
    assert any(line.startswith("recipes/small/sft/config_a.yaml:2:1: SF902 `gradient_checkpointing=True`")
               for line in lines), result.stdout


def test_a_scan_lists_each_project_folder_once_and_every_script_records_the_listing(tmp_path):
    """Within one scan the scripts of a project share its folder listings (each script looks for
    launch commands in the same folders); each still records them, so the next scan sees a change."""
    for name in ("a.py", "b.py", "run.sh"):
        (tmp_path / name).write_text("python a.py\n" if name == "run.sh" else "")
    with listings_kept():
        first = ProjectFiles.for_script(tmp_path / "a.py", (tmp_path,))
        assert first.listing(tmp_path, (".sh",)) == [tmp_path / "run.sh"]
        (tmp_path / "new.sh").write_text("python b.py\n")
        second = ProjectFiles.for_script(tmp_path / "b.py", (tmp_path,))
        assert second.listing(tmp_path, (".sh",)) == [tmp_path / "run.sh"]  # as the scan found it
        assert first.text(tmp_path / "run.sh") == "python a.py\n"
        (tmp_path / "run.sh").write_text("python b.py\n")
        assert second.text(tmp_path / "run.sh") == "python a.py\n"
        assert second.inputs == first.inputs and len(second.inputs) == 2
    later = ProjectFiles.for_script(tmp_path / "b.py", (tmp_path,))
    assert later.listing(tmp_path, (".sh",)) == [tmp_path / "new.sh", tmp_path / "run.sh"]
    assert later.text(tmp_path / "run.sh") == "python b.py\n"
    assert not inputs_unchanged(second.inputs)  # a cached result of this scan is analysed again


def test_a_result_computed_once_per_scan_is_recorded_for_every_script(tmp_path):
    """``ProjectFiles.recorded``: the second script of a folder reuses the launch files the first
    found, and records every file that search looked at, even one the first had read before."""
    for name in ("a.py", "b.py", "run.sh", "README.md"):
        (tmp_path / name).write_text("python a.py\n")

    def search(project: ProjectFiles) -> list[Path]:
        return [path for path in project.listing(tmp_path, (".sh", ".md")) if "a.py" in (project.text(path) or "")]

    with listings_kept():
        first = ProjectFiles.for_script(tmp_path / "a.py", (tmp_path,))
        first.text(tmp_path / "run.sh")  # read before the search
        found = first.recorded("launch files", lambda: search(first))
        second = ProjectFiles.for_script(tmp_path / "b.py", (tmp_path,))
        assert second.recorded("launch files", lambda: []) == found == [tmp_path / "README.md", tmp_path / "run.sh"]
        assert second.inputs == first.inputs and str(tmp_path / "run.sh") in second.inputs
    (tmp_path / "README.md").write_text("python b.py\n")
    assert not inputs_unchanged(second.inputs)


def test_the_scripts_of_every_folder_share_what_a_scan_keeps_unless_a_link_leads_a_root_out(tmp_path):
    """The project's READMEs are searched once for the scripts of all its folders: each script's
    own folder is a root too, but what lies inside the roots is what lies inside the outermost
    one, unless the script's folder is a link that leads out of it."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    for folder in (project / "a", project / "b", elsewhere):
        folder.mkdir(parents=True)
    (project / "README.md").write_text("python a/train.py\n")
    (project / "linked").symlink_to(elsewhere)
    with listings_kept():
        first = ProjectFiles.for_script(project / "a" / "train.py", (project,))
        found = first.recorded("docs", lambda: first.listing(project, (".md",)))
        second = ProjectFiles.for_script(project / "b" / "train.py", (project,))
        assert second.recorded("docs", lambda: []) == found == [project / "README.md"]
        assert second.inputs == first.inputs
        linked = ProjectFiles.for_script(project / "linked" / "train.py", (project,))
        assert linked.recorded("docs", lambda: []) == []


def test_the_torch_a_folder_pins_is_read_once_per_scan_and_recorded_for_each_script(tmp_path):
    """Every script of a folder gets the torch its requirements pin, and records the requirement
    file it depends on (the cache re-analyses it when the pin changes)."""
    from speedfix.model.versions import TorchVersion, project_target

    (tmp_path / "requirements.txt").write_text("torch<2\n")
    with listings_kept():
        targets = [project_target(ProjectFiles.for_script(tmp_path / name, (tmp_path,)), TorchVersion(2, 4))
                   for name in ("a.py", "b.py")]
        second = ProjectFiles.for_script(tmp_path / "c.py", (tmp_path,))
        assert project_target(second, TorchVersion(2, 4)) == targets[0] == targets[1] == TorchVersion(1, 13)
        assert str(tmp_path / "requirements.txt") in second.inputs
    (tmp_path / "requirements.txt").write_text("torch>=2\n")
    assert not inputs_unchanged(second.inputs)


def test_the_installed_torch_is_read_as_importlib_metadata_finds_it(tmp_path, monkeypatch):
    """Without importing importlib.metadata: the first folder of the import path that holds
    torch's .dist-info (METADATA) or .egg-info (a folder with PKG-INFO, or a file) decides."""
    import importlib.metadata
    import sys
    import zipfile

    from speedfix.model.versions import installed_torch_version

    def folder(name: str, entries: dict[str, str]) -> str:
        path = tmp_path / name
        path.mkdir()
        for entry, text in entries.items():
            (path / entry).parent.mkdir(parents=True, exist_ok=True)
            (path / entry).write_text(text)
        return str(path)

    empty = folder("empty", {"torchvision-0.20.0.dist-info/METADATA": "Name: torchvision\nVersion: 0.20.0\n"})
    wheel = folder("wheel", {"torch-2.5.1+cu124.dist-info/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: 2.5.1+cu124\n\nVersion: 9\n"})
    egg = folder("egg", {"Torch.egg-info/PKG-INFO": "Name: torch\nVersion: 1.13.1\n"})
    old = folder("old", {"torch-1.4.0-py3.8.egg-info": "Name: torch\nVersion: 1.4.0\n"})
    archive = tmp_path / "site.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("torch-3.0.0.dist-info/METADATA", "Name: torch\nVersion: 3.0.0\n")
    for path in ([empty, wheel, egg], [empty, egg, wheel], [old, wheel], [empty, str(tmp_path / "missing.zip")],
                 [empty, str(archive), wheel]):
        monkeypatch.setattr(sys, "path", path)
        importlib.invalidate_caches()
        expected = None
        try:
            expected = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            pass
        installed_torch_version.cache_clear()  # read once per process
        assert installed_torch_version() == expected
    found = []
    for path in ([wheel], [egg], [old], [empty]):
        monkeypatch.setattr(sys, "path", path)
        installed_torch_version.cache_clear()
        found.append(installed_torch_version())
    installed_torch_version.cache_clear()
    assert found == ["2.5.1+cu124", "1.13.1", "1.4.0", None]


@pytest.mark.parametrize("compile_flag, override, reported", [
    ("false", "", True), ("true", "", False), ("false", " model.compile=true", False)])
def test_an_option_of_the_composed_hydra_config_gates_the_compile(write, run_cli, tmp_path, compile_flag, override,
                                                                 reported):
    """nanoT5: `if args.model.compile: model = torch.compile(model)` with `compile: false` in the
    config `@hydra.main` composes: the default run trains eagerly (a command may override it)."""
    write("configs/default.yaml", f"precision: 'bf16'\nmodel:\n  name: t5\n  compile: {compile_flag}  # Pytorch 2.0\n")
    write("main.py", """\
        import hydra
        import torch


        @hydra.main(config_path="configs", config_name="default", version_base="1.1")
        def main(args):
            model = Net().cuda()
            if args.model.compile:
                model = torch.compile(model)
            optimizer = torch.optim.AdamW(model.parameters(), fused=True)
            for x in loader:
                model(x.cuda(non_blocking=True)).sum().backward()
                optimizer.step()


        if __name__ == "__main__":
            main()
        """)
    write("README.md", f"```\npython main.py{override}\n```\n")
    result = run_cli("scan", "main.py", "--select", "SF501", "--no-summary", "--no-cache", cwd=tmp_path)
    assert ("it is compiled only when `args.model.compile`, which is off by default" in result.stdout) is reported
