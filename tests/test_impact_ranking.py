"""A big win outranks a minor one in the same file: one host sync per step ranks below mixed
precision and compile, TF32 follows the kind of network wherever it is advised, DataParallel is a
big loss, and an explicit worker count or fp16 is never ranked with the largest gaps. Each script
is a small version of a pattern met in real training code."""

from __future__ import annotations

import json

# A fp32 training loop of a network of another package, with per-step host syncs.
LOOP = """\
import torch
from torch.utils.data import DataLoader
from mylib import build_model

model = build_model().cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(train_set, batch_size=64, num_workers=4, pin_memory=True)
for epoch in range(10):
    for x, y in loader:
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        SYNCS
"""


def _json(run_cli, *args, cwd):
    result = run_cli("scan", *args, "--output-format", "json", "--torch-version", "2.4", cwd=cwd)
    assert result.exit_code in (0, 1), result.stderr
    return json.loads(result.stdout)


def _one(findings, code):
    found = [f for f in findings if f["code"] == code]
    assert len(found) == 1, (code, findings)
    return found[0]


def _scan(run_cli, write, tmp_path, name, code):
    write(name, code)
    return _json(run_cli, name, cwd=tmp_path)


def test_one_sync_per_step_ranks_below_mixed_precision(run_cli, write, tmp_path):
    found = _scan(run_cli, write, tmp_path, "one.py", LOOP.replace("SYNCS", "print(loss.item())"))
    assert _one(found, "SF301")["impact"] == "medium"
    assert _one(found, "SF202")["impact"] == "high"
    # a `torch.cuda.synchronize()` every step costs the same
    found = _scan(run_cli, write, tmp_path, "wait.py", LOOP.replace("SYNCS", "torch.cuda.synchronize()"))
    assert _one(found, "SF302")["impact"] == "medium"


def test_a_sync_per_element_of_the_batch_is_high(run_cli, write, tmp_path):
    per_sample = "for i in range(y.size(0)):\n            hits += int(out[i].argmax().item() == y[i])"
    sync = _one(_scan(run_cli, write, tmp_path, "each.py", LOOP.replace("SYNCS", per_sample)), "SF301")
    assert sync["impact"] == "high"
    assert "in a loop over `range(y.size(0))` inside the step" in sync["impact_reason"]
    listed = "accuracy = [p.item() for p in (out.argmax(1) == y)]"
    assert _one(_scan(run_cli, write, tmp_path, "listed.py", LOOP.replace("SYNCS", listed)), "SF301")["impact"] == "high"
    # a loop over a few named values is no loop over the batch
    named = "for name, value in {'loss': loss, 'out': out.mean()}.items():\n            print(name, value.item())"
    assert _one(_scan(run_cli, write, tmp_path, "named.py", LOOP.replace("SYNCS", named)), "SF301")["impact"] == "medium"


def test_three_waits_in_one_step_are_high_unless_the_model_is_large(run_cli, write, tmp_path):
    three = ("total += loss.item()\n        correct += (out.argmax(1) == y).sum().item()\n"
             "        top5 += (out.topk(5, 1).indices == y[:, None]).any(1).sum().item()")
    sync = _one(_scan(run_cli, write, tmp_path, "three.py", LOOP.replace("SYNCS", three)), "SF301")
    assert sync["impact"] == "high" and sync["impact_reason"] == "3 separate waits for the GPU in one step"
    large = LOOP.replace("from mylib import build_model\n", "from transformers import AutoModelForCausalLM\n").replace(
        "build_model()", 'AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf")')
    sync = _one(_scan(run_cli, write, tmp_path, "large.py", large.replace("SYNCS", three)), "SF301")
    assert sync["impact"] == "low" and sync["impact_reason"].startswith("a large model (about 7.0B parameters)")
    # the checkpoint an option names by default says nothing of the run when a launch command names
    # another (codealpaca: `--model_name_or_path <your_path_to_llama>`): its size is unknown
    optioned = large.replace('"meta-llama/Llama-2-7b-hf"', "args.model_name_or_path").replace(
        "import torch\n", "import argparse\nimport torch\n", 1).replace(
        "model = ", 'parser = argparse.ArgumentParser()\nparser.add_argument("--model_name_or_path", '
        'default="meta-llama/Llama-2-7b-hf")\nargs = parser.parse_args()\nmodel = ', 1).replace("SYNCS", three)
    assert _one(_scan(run_cli, write, tmp_path, "optioned.py", optioned), "SF301")["impact"] == "low"
    write("README.md", "```\ntorchrun optioned.py --model_name_or_path <your_path_to_hf_llama>\n```\n")
    assert _one(_json(run_cli, "optioned.py", cwd=tmp_path), "SF301")["impact"] == "high"


def test_compile_is_worth_less_for_a_billion_parameter_model(run_cli, write, tmp_path):
    """Most of a large model's step is large matmuls, which compile leaves to the same kernels."""
    plain = LOOP.replace("SYNCS", "pass")
    assert _one(_scan(run_cli, write, tmp_path, "plain.py", plain), "SF501")["impact"] == "high"
    large = plain.replace("from mylib import build_model\n", "from transformers import AutoModelForCausalLM\n").replace(
        "build_model()", 'AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf")')
    compile_note = _one(_scan(run_cli, write, tmp_path, "large.py", large), "SF501")
    assert compile_note["impact"] == "low"
    assert compile_note["impact_reason"].startswith("a large model (about 7.0B parameters)")
    assert "matmuls" in compile_note["impact_reason"]


def test_an_unpinned_loader_is_worth_little_to_a_billion_parameter_model(run_cli, write, tmp_path):
    """A copy of a batch is a small share of the step of a large model (seconds)."""
    unpinned = LOOP.replace(", pin_memory=True", "").replace("SYNCS", "pass")
    assert _one(_scan(run_cli, write, tmp_path, "plain.py", unpinned), "SF102")["impact"] == "medium"
    large = unpinned.replace("from mylib import build_model\n", "from transformers import AutoModelForCausalLM\n").replace(
        "build_model()", 'AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf")')
    pin = _one(_scan(run_cli, write, tmp_path, "large.py", large), "SF102")
    assert pin["impact"] == "low" and pin["impact_reason"].startswith("a large model (about 7.0B parameters)")


REWARD_MODEL = """\
from dataclasses import dataclass, field
import torch
from transformers import AutoModelForSequenceClassification, HfArgumentParser, Trainer, TrainingArguments


@dataclass
class ScriptArguments:
    model_name: str = field(default="meta-llama/Meta-Llama-3-8B-Instruct")


script_args = HfArgumentParser(ScriptArguments).parse_args_into_dataclasses()[0]
model = AutoModelForSequenceClassification.from_pretrained(script_args.model_name, num_labels=1, torch_dtype=torch.bfloat16)
args = TrainingArguments(output_dir="out", bf16=True, per_device_train_batch_size=1)
Trainer(model=model, args=args, train_dataset=train_set).train()
"""


def test_the_settings_beside_the_precision_are_worth_little_to_a_billion_parameter_model(run_cli, write, tmp_path):
    """RLHFlow's reward models: the checkpoint is a field default of the script's own dataclass
    (`parse_args_into_dataclasses()[0]`); the workers and compile left at their defaults are small
    next to steps of seconds. Launch commands that name it decide, a shell variable set nowhere
    in them (DeepSeek-Coder's README sets `MODEL` and passes `$MODEL_PATH`) passed over."""
    bundle = _one(_scan(run_cli, write, tmp_path, "rm.py", REWARD_MODEL), "SF902")
    assert "`torch_compile`" in bundle["message"] and bundle["impact"] == "low", bundle
    assert "a large model (about 8.0B parameters)" in bundle["impact_reason"]
    write("README.md", '```bash\nMODEL="org/model-7b"\naccelerate launch rm.py --model_name $MODEL\n```\n\n'
                       '```bash\naccelerate launch rm.py --model_name $MODEL_PATH\n```\n')
    bundle = _one(_json(run_cli, "rm.py", cwd=tmp_path), "SF902")
    assert bundle["impact"] == "low" and "about 7.0B" in bundle["impact_reason"], bundle
    write("README.md", "```bash\naccelerate launch rm.py --model_name <your_model>\n```\n")
    assert _one(_json(run_cli, "rm.py", cwd=tmp_path), "SF902")["impact"] == "medium"


def test_values_read_one_after_another_wait_once(run_cli, write, tmp_path):
    """After the first read the GPU has nothing queued: reading the other losses it already
    computed, statement after statement, adds no wait (a detector's or SAM's loss meters)."""
    meters = ("meter_a.update(loss_a.item())\n        meter_b.update(loss_b.item())\n"
              "        meter_c.update(loss_c.item())\n        print(float(loss))")
    code = LOOP.replace("loss = torch.nn.functional.cross_entropy(out, y)",
                        "loss_a, loss_b, loss_c = out.sum(), out.mean(), out.std()\n        loss = loss_a + loss_b + loss_c")
    sync = _one(_scan(run_cli, write, tmp_path, "meters.py", code.replace("SYNCS", meters)), "SF301")
    assert sync["impact"] == "medium" and "impact_reason" not in sync
    # a check before backward and the reads after the step: two waits, still medium
    guarded = code.replace("optimizer.zero_grad()", "if bool(loss == 0):\n            continue\n        optimizer.zero_grad()")
    sync = _one(_scan(run_cli, write, tmp_path, "guarded.py", guarded.replace("SYNCS", meters)), "SF301")
    assert sync["impact"] == "medium"
    # `.detach()` queues no GPU work: reading `loss_b.detach().item()` waits no more than `loss_b.item()`
    detached = meters.replace(".item()", ".detach().item()")
    sync = _one(_scan(run_cli, write, tmp_path, "detached.py", code.replace("SYNCS", detached)), "SF301")
    assert sync["impact"] == "medium" and "impact_reason" not in sync


# Metrics of another module, each computed on the GPU and read back as a Python float.
METRICS = """import torch


def dice(pred, target):
    inter = torch.sum((pred > 0.5) * target)
    return 2 * float(inter) / (float(torch.sum(pred > 0.5)) + float(torch.sum(target)) + 1e-6)


def jaccard(pred, target):
    return float(torch.sum((pred > 0.5) * target)) / float(torch.sum((pred > 0.5) + target > 0))
"""


def test_metric_helpers_of_another_file_that_read_values_count_as_waits(run_cli, write, tmp_path):
    write("metrics.py", METRICS)
    code = LOOP.replace("from mylib import build_model\n", "from mylib import build_model\nfrom metrics import dice, jaccard\n")
    steps = "epoch_loss += loss.item()\n        d += dice(out, y)\n        j += jaccard(out, y)"
    write("train.py", code.replace("SYNCS", steps))
    sync = _one([f for f in _json(run_cli, "train.py", "metrics.py", cwd=tmp_path) if f["path"] == "train.py"], "SF301")
    assert sync["impact"] == "high"
    assert sync["impact_reason"] == "3 separate waits for the GPU in one step (2 in the helpers it calls: `dice`, `jaccard`)"


def test_a_metric_computed_on_host_copies_every_step_counts_as_host_work(run_cli, write, tmp_path):
    """Two waits (the loss, then probabilities computed after it), then scikit-learn scores the
    step's outputs on the CPU while the GPU idles: high. Copies only kept for later stay medium."""
    code = LOOP.replace("from mylib import build_model\n", "from mylib import build_model\nfrom sklearn.metrics import roc_auc_score\n")
    scored = ("total += loss.item()\n        probs = torch.sigmoid(out)\n"
              "        aucs.append(roc_auc_score(y.cpu().numpy(), probs.detach().cpu().numpy()))")
    sync = _one(_scan(run_cli, write, tmp_path, "scored.py", code.replace("SYNCS", scored)), "SF301")
    assert sync["impact"] == "high"
    assert sync["impact_reason"] == "2 separate waits for the GPU in one step, then the CPU computes `roc_auc_score` on host copies"
    kept = "total += loss.item()\n        outputs.append(out.detach().cpu().numpy())"
    assert _one(_scan(run_cli, write, tmp_path, "kept.py", code.replace("SYNCS", kept)), "SF301")["impact"] == "medium"


# A Lightning script whose LightningModule lives in another module and picks its network by name.
LIGHTNING = """\
import argparse
from pytorch_lightning import Trainer
from module import ClassifierModule


def main(args):
    trainer = Trainer(accelerator="gpu", devices=1, max_epochs=30)
    trainer.fit(ClassifierModule(args))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--classifier", type=str, default="resnet18")
    main(parser.parse_args())
"""

# A LightningModule that builds its own layers and optimizer.
OWN_LAYERS = """\
import torch
import torch.nn as nn
import pytorch_lightning as pl


class Net(pl.LightningModule):
    def __init__(self, hidden):
        super().__init__()
        self.body = LAYERS

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.body(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


trainer = pl.Trainer(accelerator="gpu", devices=1)
trainer.fit(Net(512), loader)
"""


def _tf32(findings):
    (found,) = [f for f in findings if f["code"] in ("SF201", "SF901", "SF902") and "TF32" in f["message"]]
    return found


def test_tf32_advice_of_lightning_follows_the_kind_of_network(run_cli, write, tmp_path):
    tf32 = _tf32(_scan(run_cli, write, tmp_path, "train.py", LIGHTNING))
    assert tf32["code"] == "SF901" and tf32["impact"] == "low"
    assert tf32["impact_reason"] == ("a conv net by its name (`--classifier` defaults to `resnet18`): cuDNN already "
                                     "runs its convolutions in TF32")
    # nothing names the network: medium, not the fp32 finding's high
    unnamed = LIGHTNING.replace('    parser.add_argument("--classifier", type=str, default="resnet18")\n', "")
    assert _tf32(_scan(run_cli, write, tmp_path, "unnamed.py", unnamed))["impact"] == "medium"
    # a LightningModule of this file: its own layers decide
    conv = "nn.Sequential(nn.Conv2d(3, hidden, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10))"
    assert _tf32(_scan(run_cli, write, tmp_path, "conv.py", OWN_LAYERS.replace("LAYERS", conv)))["impact"] == "low"
    mlp = "nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, 10))"
    assert _tf32(_scan(run_cli, write, tmp_path, "mlp.py", OWN_LAYERS.replace("LAYERS", mlp)))["impact"] == "high"


def test_tf32_of_a_hugging_face_trainer_in_fp32_is_said_in_its_fp32_finding(run_cli, write, tmp_path):
    # bf16 closes most of that one gap (TF32 speeds up the matmuls it leaves in fp32): one finding,
    # ranked as the precision is, for a transformer as for a conv net (the evaluators of two
    # held-out sets called a second TF32 finding on the same `TrainingArguments` a duplicate)
    script = """\
    import torch
    from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments

    if __name__ == "__main__":
        model = AutoModelForSequenceClassification.from_pretrained(CHECKPOINT, num_labels=2)
        args = TrainingArguments(output_dir="out", num_train_epochs=3)
        Trainer(model=model, args=args, train_dataset=train_set).train()
    """
    for name, checkpoint in (("bert.py", "bert-base-uncased"), ("resnet.py", "microsoft/resnet-50")):
        tf32 = _tf32(_scan(run_cli, write, tmp_path, name, script.replace("CHECKPOINT", f'"{checkpoint}"')))
        assert tf32["code"] == "SF902" and "fp32 (neither `bf16` nor `fp16`)" in tf32["message"]
        assert tf32["impact"] == "high" and tf32["fix"]


def test_data_parallel_is_a_big_loss(run_cli, write, tmp_path):
    code = LOOP.replace("SYNCS", "").replace("build_model().cuda()", "torch.nn.DataParallel(build_model()).cuda()")
    assert _one(_scan(run_cli, write, tmp_path, "dp.py", code), "SF801")["impact"] == "high"


def test_fp16_and_toy_models_are_not_ranked_with_the_largest_gaps(run_cli, write, tmp_path):
    script = """\
    import torch
    import torch.nn as nn
    from accelerate import Accelerator


    class ConvNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 16, kernel_size=5, padding=2)
            self.fc = nn.Linear(16 * 28 * 28, 10)

        def forward(self, x):
            return self.fc(self.conv(x).flatten(1))


    def main():
        accelerator = Accelerator(mixed_precision=PRECISION)
        model = ConvNet()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer, loader = accelerator.prepare(model, optimizer, train_loader)
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()


    if __name__ == "__main__":
        main()
    """
    # the sizes given by keyword (`kernel_size=5`) count: about 130k parameters, a toy model
    toy = _one(_scan(run_cli, write, tmp_path, "toy.py", script.replace("PRECISION", '"no"')), "SF904")
    assert toy["impact"] == "medium" and toy["impact_reason"].startswith("a small model")
    fp16 = _one(_scan(run_cli, write, tmp_path, "fp16.py", script.replace("PRECISION", '"fp16"')
                      .replace("16 * 28 * 28", "4096 * 28 * 28")), "SF904")
    assert fp16["impact"] == "medium" and "bf16 saves the loss scaling" in fp16["impact_reason"]


def test_a_loader_cycled_by_a_generator_still_feeds_training(run_cli, write, tmp_path):
    script = """\
    import torch
    from torch.utils.data import DataLoader
    from mylib import build_model


    def sample_data(loader):
        while True:
            for batch in loader:
                yield batch


    def train(loader, model, optimizer):
        loader = sample_data(loader)
        for step in range(100000):
            x = next(loader).cuda()
            loss = model(x).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


    if __name__ == "__main__":
        model = build_model().cuda()
        loader = DataLoader(dataset, batch_size=32, shuffle=True, num_workers=4)
        train(loader, model, torch.optim.Adam(model.parameters()))
    """
    pin = _one(_scan(run_cli, write, tmp_path, "gan.py", script), "SF102")
    assert pin["impact"] == "medium" and "impact_reason" not in pin  # not "only evaluation reads it"


# A trainer class of the kind segmentation repositories write: validation inside the epoch loop
# and a test pass after it, both without `no_grad()`.
SOLVER = """\
import torch
from mylib import build_model


class Solver:
    def __init__(self, train_loader, valid_loader, test_loader):
        self.net = build_model().cuda()
        self.opt = torch.optim.Adam(self.net.parameters(), lr=1e-4)
        self.train_loader, self.valid_loader, self.test_loader = train_loader, valid_loader, test_loader

    def train(self):
        for epoch in range(100):
            self.net.train()
            for images, masks in self.train_loader:
                loss = torch.nn.functional.binary_cross_entropy_with_logits(self.net(images.cuda()), masks.cuda())
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
            self.net.eval()
            for images, masks in self.valid_loader:
                score = dice(self.net(images.cuda()), masks.cuda())
        self.net.eval()
        for images, masks in self.test_loader:
            score = dice(self.net(images.cuda()), masks.cuda())
"""


def test_a_test_pass_run_once_ranks_below_a_validation_loop_run_every_epoch(run_cli, write, tmp_path):
    found = [f for f in _scan(run_cli, write, tmp_path, "solver.py", SOLVER) if f["code"] == "SF702"]
    by_line = {f["line"]: f for f in found}
    assert by_line[20]["impact"] == "high"  # every epoch
    assert by_line[23]["impact"] == "medium"  # once, after the epochs
    assert by_line[23]["impact_reason"] == "one pass after or outside the training loop, not every epoch"


# A Hugging Face fine-tune that leaves TrainingArguments at their defaults, on token ids tokenized ahead.
HF_DEFAULTS = """\
from datasets import load_dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments

tokenizer = AutoTokenizer.from_pretrained("distilbert-base-uncased")
reviews = load_dataset("imdb").map(lambda rows: tokenizer(rows["text"], truncation=True), batched=True)
model = AutoModelForSequenceClassification.from_pretrained("distilbert-base-uncased", num_labels=2)
args = TrainingArguments(output_dir="out", per_device_train_batch_size=32, num_train_epochs=3)
Trainer(model=model, args=args, train_dataset=reviews["train"], tokenizer=tokenizer).train()
"""


def test_fp32_left_at_the_default_outranks_the_other_defaults_of_the_call(run_cli, write, tmp_path):
    found = [f for f in _scan(run_cli, write, tmp_path, "finetune.py", HF_DEFAULTS)
             if f["code"] == "SF902" and "keep slow defaults" in f["message"]]
    (precision,) = [f for f in found if "besides" not in f["message"]]
    (rest,) = [f for f in found if "besides fp32" in f["message"]]
    assert precision["impact"] == "high" and precision["message"].endswith(
        "fp32 (neither `bf16` nor `fp16`), and nothing enables TF32 for the matmuls left in fp32")
    assert rest["impact"] == "medium" and "dataloader_num_workers" in rest["message"]  # compile is among them
