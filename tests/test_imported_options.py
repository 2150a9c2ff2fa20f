"""Options a script reads from a parser in another file of its project, and DeepSpeed configs named
through an f-string or `os.path.join` of the run's options: what the default run (or every launch
command) gives them is what the rules judge."""

from __future__ import annotations

OPTIONS = """\
import argparse


def parse_training_args(input_args=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16"])
    parser.add_argument("--set_grads_to_none", action="store_true")
    return parser.parse_args(input_args)
"""

TRAIN = """\
import torch
from accelerate import Accelerator
from helpers.options import parse_training_args


def main(args):
    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    optimizer = torch.optim.AdamW(model.parameters())
    for batch in loader:
        optimizer.zero_grad(set_to_none=args.set_grads_to_none)
        accelerator.backward(model(batch).sum())
        optimizer.step()


if __name__ == "__main__":
    args = parse_training_args()
    main(args)
"""


def _scan(run_cli, folder, *rules: str) -> str:
    return run_cli("scan", ".", "--select", ",".join(rules), "--no-summary", cwd=folder).stdout


def test_options_of_a_parser_in_another_file_of_the_project(write, run_cli, tmp_path):
    write("src/helpers/options.py", OPTIONS)
    write("src/train.py", TRAIN)
    found = _scan(run_cli, tmp_path / "src", "SF904", "SF402")
    assert "train.py:7:" in found and "SF904" in found  # default None: fp32 unless a launch sets it
    assert "train.py:10:9: SF402 `zero_grad(set_to_none=args.set_grads_to_none)` is False" in found


def test_a_launch_command_that_sets_the_options_wins(write, run_cli, tmp_path):
    write("src/helpers/options.py", OPTIONS)
    write("src/train.py", TRAIN)
    write("src/launch.sh", "accelerate launch --mixed_precision bf16 train.py --set_grads_to_none\n")
    assert _scan(run_cli, tmp_path / "src", "SF904", "SF402") == ""


def test_a_function_that_does_not_parse_the_options_is_not_read(write, run_cli, tmp_path):
    write("src/helpers/options.py", OPTIONS.replace("return parser.parse_args(input_args)", "return parser"))
    write("src/train.py", TRAIN)
    assert "SF402" not in _scan(run_cli, tmp_path / "src", "SF402")


DEEPSPEED_TRAIN = """\
import argparse
import os
import deepspeed

parser = argparse.ArgumentParser()
parser.add_argument("--model", type=str, default="tiny")
parser.add_argument("--stage", type=int)
args = parser.parse_args()
engine, optimizer, _, _ = deepspeed.initialize(model=model, config={path})
"""

FP16 = '{\n  "train_batch_size": 8,\n  "fp16": {"enabled": true}\n}\n'


def test_deepspeed_config_named_by_an_f_string_of_the_launch_options(write, run_cli, tmp_path):
    write("train.py", DEEPSPEED_TRAIN.replace("{path}", 'f"ds/{args.model}_stage_{args.stage}.json"'))
    write("ds/lora_stage_1.json", FP16)
    write("ds/tiny_stage_2.json", FP16)
    assert _scan(run_cli, tmp_path, "SF905") == ""  # `--stage` has no default: no file is known
    write("run.sh", "deepspeed train.py --model lora --stage 1\n")
    assert _scan(run_cli, tmp_path, "SF905").startswith('ds/lora_stage_1.json:3:3: SF905 "fp16"')


def test_deepspeed_config_named_by_a_path_join_of_option_defaults(write, run_cli, tmp_path):
    code = DEEPSPEED_TRAIN.replace('"--stage", type=int', '"--stage", type=int, default=2')
    write("train.py", code.replace("{path}", 'os.path.join("ds", f"{args.model}_stage_{args.stage}.json")'))
    write("ds/tiny_stage_2.json", FP16)
    assert _scan(run_cli, tmp_path, "SF905").startswith('ds/tiny_stage_2.json:3:3: SF905 "fp16"')


WORKER_OPTIONS = """\
import argparse


def parse_opts():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n_threads", type=int, default=4)
    return parser.parse_args()
"""

WRAPPED = """\
import torch
from opts import parse_opts


def get_opt():
    opt = parse_opts()
    opt.begin_epoch = 1
    return opt


def main():
    opt = get_opt()
    loader = torch.utils.data.DataLoader(clips, batch_size=8, pin_memory=True, num_workers=opt.n_threads)
    for epoch in range(opt.begin_epoch, 100):
        for x, y in loader:
            loss = net(x.cuda()).mean()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
"""


def test_a_local_function_that_adjusts_and_returns_the_imported_parsers_options(write, run_cli, tmp_path):
    write("opts.py", WORKER_OPTIONS)
    write("main.py", WRAPPED)
    found = _scan(run_cli, tmp_path, "SF103")
    assert "main.py:13:14: SF103" in found and "starts its 4 worker processes" in found
