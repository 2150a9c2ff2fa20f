"""Every finding carries an impact: the rules estimate it from what the script is, a benchmark
of the script decides it, and the reports lead with the highest."""

from __future__ import annotations

import json

import pytest

from speedfix.engine.findings import Finding, Impact, Severity
from speedfix.engine.impact import Measurements, judge

# A CUDA script with a training loader and a test loader, a small MLP (about 0.1M parameters).
SMALL = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test(model, loader):
    model.eval()
    with torch.no_grad():
        for x, y in loader:
            model(x.to("cuda"))


def main():
    train_loader = DataLoader(train_set, batch_size=64, shuffle=True, num_workers=4)
    test_loader = DataLoader(test_set, batch_size=1000, num_workers=4)
    model = Net().to("cuda")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(10):
        for x, y in train_loader:
            x, y = x.to("cuda"), y.to("cuda")
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(loss.item())
        test(model, test_loader)


main()
"""


def _json(run_cli, *args, cwd):
    result = run_cli("scan", *args, "--output-format", "json", "--torch-version", "2.4", cwd=cwd)
    assert result.exit_code in (0, 1), result.stderr
    return json.loads(result.stdout)


def _by(findings, code, line=None):
    return [f for f in findings if f["code"] == code and (line is None or f["line"] == line)]


# The test loader of SMALL without workers: SF101 advises them, at low impact.
NO_TEST_WORKERS = SMALL.replace("DataLoader(test_set, batch_size=1000, num_workers=4)", "DataLoader(test_set, batch_size=1000)")


def test_the_rules_estimate_the_impact_for_this_script(run_cli, write, tmp_path):
    write("train.py", NO_TEST_WORKERS)
    found = _json(run_cli, "train.py", cwd=tmp_path)
    assert all(f["impact"] in ("high", "medium", "low") for f in found)
    (train_pin,) = _by(found, "SF102", 24)
    assert train_pin["impact"] == "medium" and "impact_reason" not in train_pin
    # the test loader that only evaluation reads: no pinning advice, its missing workers are low
    assert not _by(found, "SF102", 25) and not _by(found, "SF103", 25)
    (test_workers,) = _by(found, "SF101", 25)
    assert test_workers["impact"] == "low"
    assert test_workers["impact_reason"] == "a loader that only evaluation or testing reads"
    # a small model: compile and mixed precision matter less, a fused optimizer little
    (compiled,) = _by(found, "SF501")
    assert compiled["impact"] == "medium" and compiled["impact_reason"] == "a small model (about 0.1M parameters)"
    (fused,) = _by(found, "SF401")
    assert fused["impact"] == "low"
    # the loaders are not pinned: `non_blocking` does nothing until SF102 pins them
    (sync,) = _by(found, "SF104")[:1]
    assert sync["impact"] == "low" and "unpinned" in sync["impact_reason"]


def test_a_big_or_unknown_model_keeps_the_rules_usual_impact(run_cli, write, tmp_path):
    write("train.py", SMALL.replace("nn.Linear(784, 128)", "nn.Linear(784, 128 * 1024)")
          .replace("nn.Linear(128, 10)", "nn.Linear(128 * 1024, 10)"))
    write("zoo.py", SMALL.replace("Net().to", "torchvision.models.resnet50().to").replace("import torch\n", "import torch\nimport torchvision\n", 1))
    write("hub.py", SMALL.replace("Net().to", "AutoModel.from_pretrained('gpt2').to")
          .replace("import torch\n", "import torch\nfrom transformers import AutoModel\n", 1))
    for name in ("train.py", "zoo.py", "hub.py"):
        found = _json(run_cli, name, cwd=tmp_path)
        assert _by(found, "SF501")[0]["impact"] == "high", name
        # a fused optimizer matters for a pretrained transformer's many parameters only
        assert _by(found, "SF401")[0]["impact"] == ("medium" if name == "hub.py" else "low"), name
    # TF32: a conv net's convolutions already use it; a zoo transformer's matmuls do not
    assert _by(_json(run_cli, "zoo.py", cwd=tmp_path), "SF201")[0]["impact"] == "low"
    write("vit.py", SMALL.replace("Net().to", "torchvision.models.vit_b_16().to").replace("import torch\n", "import torch\nimport torchvision\n", 1))
    assert _by(_json(run_cli, "vit.py", cwd=tmp_path), "SF201")[0]["impact"] == "high"


def test_compile_is_low_where_every_step_generates_its_samples_first(run_cli, write, tmp_path):
    grpo = """\
import torch
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained("some/small-chat-model").cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
for batch in loader:
    completions = model.generate(batch["input_ids"].cuda(), max_new_tokens=256)
    rewards = reward(completions)
    for i, name in enumerate(reward_names):  # a sync per reward function, for the log
        log(name, rewards[:, i].mean().item())
    loss = policy_loss(model(completions).logits, rewards)
    loss.backward()
    optimizer.step()
"""
    write("grpo.py", grpo)
    found = _json(run_cli, "grpo.py", cwd=tmp_path)
    (compiled,) = _by(found, "SF501")
    assert compiled["impact"] == "low" and "`model.generate(...)`" in compiled["impact_reason"]
    (synced,) = _by(found, "SF301")  # decoding syncs at every token: a few more per step change little
    assert synced["impact"] == "low" and "`model.generate(...)`" in synced["impact_reason"]
    write("sft.py", grpo.replace("    completions = model.generate(batch[\"input_ids\"].cuda(), max_new_tokens=256)\n", "")
          .replace("completions", "batch[\"input_ids\"].cuda()"))
    (compiled,) = _by(_json(run_cli, "sft.py", cwd=tmp_path), "SF501")
    assert compiled["impact"] == "high"


LINEAR_PROBE = """\
import torch
import torchvision

model = torchvision.models.resnet50()
for name, param in model.named_parameters():
    if name not in ["fc.weight", "fc.bias"]:
        param.requires_grad = False
model = model.cuda()
parameters = list(filter(lambda p: p.requires_grad, model.parameters()))
optimizer = torch.optim.SGD(parameters, lr=30.0)
for x, y in loader:
    loss = torch.nn.functional.cross_entropy(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_compile_is_medium_for_a_linear_probe_on_a_frozen_backbone(run_cli, write, tmp_path):
    """MoCo's linear classification: every parameter but `fc`'s frozen by name. Compiling still
    speeds up the frozen forward pass, but the backward pass is the head's only."""
    write("probe.py", LINEAR_PROBE)
    (compiled,) = _by(_json(run_cli, "probe.py", cwd=tmp_path), "SF501")
    assert compiled["impact"] == "medium" and "frozen" in compiled["impact_reason"]
    freeze = LINEAR_PROBE[LINEAR_PROBE.index("for name"):LINEAR_PROBE.index("model = model.cuda()")]
    write("full.py", LINEAR_PROBE.replace(freeze, ""))
    (compiled,) = _by(_json(run_cli, "full.py", cwd=tmp_path), "SF501")
    assert compiled["impact"] == "high"
    gated = "if config['finetune_norm']:\n" + "".join(f"    {line}\n" for line in freeze.splitlines())
    write("gated.py", LINEAR_PROBE.replace(freeze, gated))  # sr3: frozen only in the runs that ask for it
    (compiled,) = _by(_json(run_cli, "gated.py", cwd=tmp_path), "SF501")
    assert compiled["impact"] == "high"
    write("unet.py", LINEAR_PROBE.replace("model = model.cuda()", "model.layer4.requires_grad_(True)\nmodel = model.cuda()"))
    (compiled,) = _by(_json(run_cli, "unet.py", cwd=tmp_path), "SF501")  # fastcomposer: a whole submodule trains again
    assert compiled["impact"] == "high"


OPTION_SIZED_MODEL = """\
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, args, data):
        super().__init__()
        self.m = data.m
        self.gru = nn.GRU(self.m, args.hidRNN)
        self.linear = nn.Linear(args.hidRNN, self.m)

    def forward(self, x):
        r, _ = self.gru(x)
        return self.linear(r[-1])
"""

OPTION_SIZED_SCRIPT = """\
import argparse
import torch
import models

parser = argparse.ArgumentParser()
parser.add_argument('--hidRNN', type=int, default=100)
parser.add_argument('--batch_size', type=int, default=1024)
parser.add_argument('--model', type=str, default='LSTNet')
args = parser.parse_args()
data = load(args)
model = eval('models.' + args.model).Model(args, data).cuda()
optimizer = torch.optim.Adam(model.parameters(), fused=True)
for epoch in range(100):
    for x, y in data.batches(args.batch_size):
        optimizer.zero_grad()
        loss = (model(x.cuda(non_blocking=True)) - y.cuda(non_blocking=True)).pow(2).mean()
        loss.backward()
        optimizer.step()
"""


@pytest.mark.parametrize("launch, impact", [(None, "medium"), ("--hidRNN 50", "medium"), ("--hidRNN 1024", "high")])
def test_a_model_sized_by_small_width_options_is_small(run_cli, write, tmp_path, launch, impact):
    """LSTNet: `eval('models.' + args.model).Model(args, Data)` of another file, its widths from
    `--hidRNN 100` (the batch size is no width): a small model the scan cannot count, so compile,
    mixed precision and TF32 are worth less; not where a launch command makes it wide."""
    write("models/LSTNet.py", OPTION_SIZED_MODEL)
    write("models/__init__.py", "from models import LSTNet\n")
    write("main.py", OPTION_SIZED_SCRIPT)
    if launch is not None:
        write("run.sh", f"python main.py {launch}\n")
    found = _json(run_cli, "main.py", cwd=tmp_path)
    for code in ("SF501", "SF202"):
        (finding,) = _by(found, code)
        assert finding["impact"] == impact
        if impact == "medium":
            assert finding["impact_reason"] == "a small model by its options (widths up to 100)"


GRAPH_NET = """\
import torch
from model import Encoder

encoder = Encoder(num_features, 128, activation).cuda()
optimizer = torch.optim.Adam(encoder.parameters(), lr=0.001, fused=True)
for epoch in range(200):
    for data in loader:
        optimizer.zero_grad()
        loss = encoder(data.x.cuda(non_blocking=True), data.edge_index.cuda(non_blocking=True)).sum()
        loss.backward()
        optimizer.step()
"""


@pytest.mark.parametrize("where", ["import", "requirements", None])
def test_compile_is_medium_for_a_graph_network(run_cli, write, tmp_path, where):
    """GRACE (`torch_geometric.nn.GCNConv` imported by the script) and QCNet (its layers import
    `torch_geometric` in files the scan does not link, the project requires it): batches of graphs
    of changing sizes make compile recompile or run with dynamic shapes."""
    script = GRAPH_NET
    if where == "import":
        script = "from torch_geometric.nn import GCNConv\n" + script
    elif where == "requirements":
        write("requirements.txt", "torch>=2.1\ntorch-geometric==2.4.0\n")
    write("train.py", script)
    (compiled,) = _by(_json(run_cli, "train.py", cwd=tmp_path), "SF501")
    if where is None:
        assert compiled["impact"] == "high"
    else:
        assert compiled["impact"] == "medium" and compiled["impact_reason"].startswith("a graph network (torch")


HANDED_CONV_NET = """\
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.convs = nn.Sequential(nn.Conv1d(1, 64, 3, padding=1), nn.ReLU(), nn.Conv1d(64, 1, 3, padding=1))

    def forward(self, x):
        return self.convs(x)


def _train_impl(replica_id, model, loader):
    opt = torch.optim.Adam(model.parameters(), lr=2e-4, fused=True)
    for x in loader:
        loss = model(x.cuda(non_blocking=True)).abs().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def train(loader):
    model = Net().cuda()
    _train_impl(0, model, loader)
"""


def test_a_network_handed_to_the_training_function_is_the_one_its_callers_build(run_cli, write, tmp_path):
    """wavegrad: `train()` builds the conv net and hands it to `_train_impl(replica_id, model,
    ...)`, which trains it: TF32 is worth little, cuDNN runs the convolutions in TF32 already."""
    write("learner.py", HANDED_CONV_NET)
    (tf32,) = _by(_json(run_cli, "learner.py", cwd=tmp_path), "SF201")
    assert tf32["impact"] == "low" and "conv net" in tf32["impact_reason"]


PADDED_CONV_TRAINING = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from data import collate_batch

model = nn.Sequential(nn.Conv1d(1024, 1024, 5, padding=2), nn.ReLU(), nn.Conv1d(1024, 1024, 5, padding=2), nn.ReLU(),
                      nn.Conv1d(1024, 1024, 5, padding=2)).cuda()
optimizer = torch.optim.AdamW(model.parameters(), fused=True)
loader = DataLoader(train_set, batch_size=16, num_workers=8, pin_memory=True, collate_fn=collate_batch)
for x, y in loader:
    loss = (model(x.cuda(non_blocking=True)) - y.cuda(non_blocking=True)).abs().mean()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("collate, impact", [("    return pad_sequence(batch, batch_first=True)\n", "low"),
                                             ("    return torch.stack(batch)\n", "medium")])
def test_cudnn_autotuning_is_worth_little_for_batches_padded_to_their_longest_sample(collate, impact, run_cli, write,
                                                                                     tmp_path):
    """FragmentVC: `collate_batch` of the data module pads each batch to its longest utterance;
    benchmark mode tunes the convolutions again for every new length."""
    write("data.py", "import torch\nfrom torch.nn.utils.rnn import pad_sequence\n\n\ndef collate_batch(batch):\n" + collate)
    write("train.py", PADDED_CONV_TRAINING)
    (cudnn,) = _by(_json(run_cli, ".", cwd=tmp_path), "SF601")
    assert cudnn["impact"] == impact


def test_a_hub_model_is_as_big_as_its_checkpoint_or_config_says(run_cli, write, tmp_path):
    hub = "import torch\nfrom transformers import AutoModel, GPT2Config, GPT2LMHeadModel\n"
    write("tiny.py", SMALL.replace("Net().to", "AutoModel.from_pretrained('prajjwal1/bert-tiny').to")
          .replace("import torch\n", hub, 1))
    write("config.py", SMALL.replace("Net().to", "GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, vocab_size=1000)).to")
          .replace("import torch\n", hub, 1))
    tiny = _by(_json(run_cli, "tiny.py", cwd=tmp_path), "SF501")[0]
    assert tiny["impact"] == "medium" and tiny["impact_reason"] == "a small model (about 4.4M parameters)"
    assert _by(_json(run_cli, "config.py", cwd=tmp_path), "SF501")[0]["impact"] == "medium"
    # LoRA: the optimizer updates the adapters only, so fusing it is worth little
    write("lora.py", SMALL.replace("Net().to", "get_peft_model(AutoModel.from_pretrained('gpt2'), LoraConfig(r=8)).to")
          .replace("import torch\n", "import torch\nfrom peft import LoraConfig, get_peft_model\nfrom transformers import AutoModel\n", 1))
    assert _by(_json(run_cli, "lora.py", cwd=tmp_path), "SF401")[0]["impact"] == "low"


def test_adapters_made_by_a_project_helper_with_loralib_are_a_lora_run(run_cli, write, tmp_path):
    """ChatGLM-finetune-LoRA's `model = get_lora_model(model, lora_config)`: a helper of another
    file that swaps in loralib layers and calls `mark_only_lora_as_trainable`."""
    write("lora_utils.py", "import loralib as lora\n\n\ndef get_lora_model(model, config):\n"
          "    lora.mark_only_lora_as_trainable(model)\n    return model\n\n\ndef unrelated(model):\n    return model\n")
    hub = "import torch\nfrom transformers import AutoModel\nfrom lora_utils import get_lora_model, unrelated\n"
    for name, helper in (("lora.py", "get_lora_model"), ("whole.py", "unrelated")):
        built = f"AutoModel.from_pretrained('gpt2').to(\"cuda\")\n    model = {helper}(model, {{}})"
        write(name, SMALL.replace('Net().to("cuda")', built).replace("import torch\n", hub, 1))
        found = _json(run_cli, name, "lora_utils.py", cwd=tmp_path)
        assert _by(found, "SF401")[0]["impact"] == ("low" if name == "lora.py" else "medium"), name


def test_tf32_is_high_for_known_matmuls_and_medium_for_a_model_the_scan_cannot_see(run_cli, write, tmp_path):
    write("mlp.py", SMALL.replace("nn.Linear(784, 128)", "nn.Linear(784, 128 * 1024)")
          .replace("nn.Linear(128, 10)", "nn.Linear(128 * 1024, 10)"))
    write("factory.py", SMALL.replace("Net().to", "build_model(cfg).to")
          .replace("import torch\n", "import torch\nfrom mylib import build_model\n", 1))
    assert _by(_json(run_cli, "mlp.py", cwd=tmp_path), "SF201")[0]["impact"] == "high"
    (tf32,) = _by(_json(run_cli, "factory.py", cwd=tmp_path), "SF201")
    assert tf32["impact"] == "medium" and tf32["impact_reason"].startswith("a model whose layers the scan does not see")


def test_cudnn_switched_off_weighs_the_layers_cudnn_would_run(run_cli, write, tmp_path):
    """High with a convolution, low for an MLP (cuBLAS runs its matmuls), medium for a model
    the scan cannot see."""
    off = SMALL.replace("def main():\n", "def main():\n    torch.backends.cudnn.enabled = False\n")
    write("mlp.py", off)
    write("conv.py", off.replace("nn.Linear(784, 128)", "nn.Sequential(nn.Conv2d(1, 8, 3), nn.Flatten(), nn.LazyLinear(128))"))
    write("factory.py", off.replace("Net().to", "build_model(cfg).to")
          .replace("import torch\n", "import torch\nfrom mylib import build_model\n", 1))
    assert [_by(_json(run_cli, name, cwd=tmp_path), "SF601")[0]["impact"] for name in ("conv.py", "mlp.py", "factory.py")] \
        == ["high", "low", "medium"]


def test_a_synchronize_under_an_option_is_low(run_cli, write, tmp_path):
    timed = SMALL.replace("            print(loss.item())\n",
                          "            if args.sync_each_step:\n                torch.cuda.synchronize()\n")
    write("train.py", "import argparse\n" + timed.replace(
        "def main():\n", "def main():\n    parser = argparse.ArgumentParser()\n"
        "    parser.add_argument('--sync-each-step', action='store_true')\n    args = parser.parse_args()\n"))
    (sync,) = _by(_json(run_cli, "train.py", cwd=tmp_path), "SF302")
    assert sync["impact"] == "low" and sync["impact_reason"] == "it runs only while an option is on, or to time a step"


def test_a_data_module_that_builds_an_image_dataset_of_another_file_feeds_decoded_images(run_cli, write, tmp_path):
    """ophthalmology: the DataModule builds `sets.RetinaImages(...)` and splits it with
    `random_split`; the images are opened in that class's `__getitem__`, in data/sets.py."""
    write("data/sets.py", "import PIL.Image\nfrom torch.utils.data import Dataset\n\n\nclass RetinaImages(Dataset):\n"
          "    def __init__(self, paths):\n        self.paths = paths\n\n    def __getitem__(self, index):\n"
          "        return PIL.Image.open(self.paths[index])\n\n    def __len__(self):\n        return len(self.paths)\n")
    write("data/modules.py", "import lightning as L\nfrom torch.utils.data import DataLoader, random_split\n"
          "from data import sets\n\n\nclass RetinaData(L.LightningDataModule):\n    def setup(self, stage=None):\n"
          "        self.data_set = sets.RetinaImages(PATHS)\n"
          "        self.train_dataset, self.val_dataset = random_split(self.data_set, [0.9, 0.1])\n\n"
          "    def train_dataloader(self):\n        return DataLoader(self.train_dataset, batch_size=32, num_workers=1)\n")
    (workers,) = _by(_json(run_cli, "data", cwd=tmp_path), "SF101")
    assert workers["impact"] == "high"


@pytest.mark.parametrize("pin, impact", [("", "low"), (", pin_memory=True", "medium")])
def test_a_trainer_class_handed_the_loaders_of_its_importer_knows_whether_they_are_pinned(run_cli, write, tmp_path,
                                                                                          pin, impact):
    """Dual-Path-RNN: train_rnn.py builds the loaders (unpinned) and hands them to the trainer
    class of trainer.py, whose loop copies each batch: the copy stays synchronous until SF102."""
    write("trainer.py", "import torch\n\n\nclass Trainer:\n    def __init__(self, model, train_dataloader, optimizer):\n"
          "        self.model, self.loader, self.optimizer = model.cuda(), train_dataloader, optimizer\n"
          "        self.device = torch.device('cuda')\n\n    def train(self):\n        for mix, ref in self.loader:\n"
          "            mix, ref = mix.to(self.device), ref.to(self.device)\n"
          "            loss = (self.model(mix) - ref).pow(2).mean()\n            loss.backward()\n"
          "            self.optimizer.step()\n")
    write("train.py", "import torch\nfrom torch.utils.data import DataLoader\nfrom trainer import Trainer\n\n"
          f"loader = DataLoader(train_set, batch_size=4, num_workers=4{pin})\n"
          "Trainer(Net(), loader, optimizer).train()\n")
    (copy,) = _by(_json(run_cli, ".", cwd=tmp_path), "SF104")
    assert copy["path"] == "trainer.py" and copy["impact"] == impact


def test_batches_read_by_their_images_are_images_beside_a_prompts_token_ids(run_cli, write, tmp_path):
    """remove-background-diffusion: a Hugging Face image dataset in the step's `batch["image"]`,
    and a tokenizer run once for the empty prompt: the loader decodes images, no token ids."""
    write("train.py", "import torch\nfrom datasets import load_dataset\nfrom torch.utils.data import DataLoader\n"
          "from transformers import CLIPTokenizer\n\n"
          "tokenizer = CLIPTokenizer.from_pretrained('stable-diffusion')\n"
          "empty = tokenizer([''], padding='max_length', return_tensors='pt').input_ids.cuda()\n"
          "train_dataset = load_dataset('masks', split='train')\ntrain_dataset.set_format('torch', columns=['image'])\n"
          "loader = DataLoader(train_dataset, batch_size=4, shuffle=True)\nunet = UNet().cuda()\n"
          "for batch in loader:\n    loss = unet(batch['image'].cuda(), empty).mean()\n    loss.backward()\n"
          "    optimizer.step()\n")
    (workers,) = _by(_json(run_cli, "train.py", cwd=tmp_path), "SF101")
    assert workers["impact"] == "high"


@pytest.mark.parametrize("built, impact", [("SRCNN()", "medium"), ("SRCNN(num_channels=channels)", "high")])
def test_a_model_class_of_another_file_is_counted_from_the_layers_it_builds(run_cli, write, tmp_path, built, impact):
    """SRCNN: models.py's three convolutions, sized by literals and `__init__`'s default, and a
    helper class built in a loop: 85,025 parameters, a small model. A size the scan cannot
    read (an argument of the call) leaves the count unknown."""
    write("models.py", "from torch import nn\n\n\nclass Block(nn.Module):\n    def __init__(self, channels):\n"
          "        super().__init__()\n        self.conv = nn.Conv2d(channels, channels, 3)\n\n\n"
          "class SRCNN(nn.Module):\n    def __init__(self, num_channels=1):\n        super().__init__()\n"
          "        self.conv1 = nn.Conv2d(num_channels, 64, kernel_size=9, padding=9 // 2)\n"
          "        self.conv2 = nn.Conv2d(64, 32, kernel_size=5, padding=5 // 2)\n"
          "        self.blocks = nn.ModuleList()\n        for _ in range(3):\n            self.blocks.append(Block(32))\n"
          "        self.conv3 = nn.Conv2d(32, num_channels, kernel_size=5, padding=5 // 2)\n        self.relu = nn.ReLU()\n")
    write("train.py", "import torch\nfrom models import SRCNN\n\n"
          f"model = {built}.cuda()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
          "for x, y in loader:\n    loss = (model(x.cuda()) - y.cuda()).pow(2).mean()\n    loss.backward()\n"
          "    optimizer.step()\n")
    (autocast,) = _by(_json(run_cli, ".", cwd=tmp_path), "SF202")
    assert autocast["impact"] == impact
    if impact == "medium":
        assert autocast["impact_reason"] == "a small model (about 85,025 parameters)"


def test_channels_last_without_mixed_precision_is_low(run_cli, write, tmp_path):
    conv = SMALL.replace("nn.Linear(784, 128)", "nn.Conv2d(3, 64, 3)").replace("nn.Linear(128, 10)", "nn.Linear(64, 10)")
    write("fp32.py", conv.replace("nn.Conv2d(3, 64, 3)", "nn.Conv2d(3, 4096, 3)"))
    assert not _by(_json(run_cli, "fp32.py", cwd=tmp_path), "SF206")  # trained here in fp32: SF202 first
    # trained by a loop of another file, whose precision this one cannot see: low
    write("engine.py", "def train(model, loader, opt):\n    for x, y in loader:\n"
          "        model(x.cuda()).sum().backward()\n        opt.step()\n")
    write("main.py", "import torch\nimport torchvision\nfrom engine import train\n"
          "model = torchvision.models.resnet50().cuda()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
          "for epoch in range(10):\n    train(model, loader, opt)\n")
    (layout,) = _by(_json(run_cli, ".", cwd=tmp_path), "SF206")
    assert layout["impact"] == "low" and "no mixed precision" in layout["impact_reason"]


def _bench(tmp_path, name="train.speedfix-bench.json", *, wait=0.58, step=0.02, device="cuda", script="train.py"):
    data = {"schema": "speedfix.bench/0.1", "status": "ok", "script": script, "device": {"type": device},
            "timing": {"step_time_s": {"median": step}}, "data": {"data_wait_fraction": wait}}
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_a_bench_result_beside_the_script_decides(run_cli, write, tmp_path):
    write("train.py", SMALL.replace(", num_workers=4)", ")"))
    _bench(tmp_path, wait=0.58, step=0.02)
    found = _json(run_cli, "train.py", cwd=tmp_path)
    (train_workers,) = _by(found, "SF101", 24)
    assert train_workers["impact"] == "high" and train_workers["impact_measured"] is True
    assert "58% of the step time waiting for data" in train_workers["impact_reason"]
    assert _by(found, "SF101", 25)[0]["impact"] == "low"  # the benchmark measures the training loop only
    assert "impact_measured" not in _by(found, "SF102", 24)[0]  # pinning is not what a data wait asks for
    (sync,) = _by(found, "SF301")
    assert sync["impact"] == "high" and "median step of 20 ms" in sync["impact_reason"]
    # the text report puts the measured loader first
    lines = run_cli("scan", "train.py", "--no-summary", "--torch-version", "2.4", cwd=tmp_path).stdout.splitlines()
    assert lines[0].startswith("train.py:24:20: SF101") and lines[0].endswith("(impact: high, measured)")


def test_a_bench_result_can_lower_the_impact_when_measured_on_a_gpu(run_cli, write, tmp_path):
    write("train.py", SMALL.replace("num_workers=4)\n    test", "num_workers=0)\n    test", 1))
    _bench(tmp_path, wait=0.01, step=0.8)
    found = _json(run_cli, "train.py", cwd=tmp_path)
    assert _by(found, "SF101", 24)[0]["impact"] == "low"  # the loader keeps up
    _bench(tmp_path, wait=0.01, step=0.8, device="cpu")  # a CPU run says nothing about the GPU's wait
    found = _json(run_cli, "train.py", cwd=tmp_path)
    assert _by(found, "SF101", 24)[0]["impact"] == "high" and "impact_reason" not in _by(found, "SF101", 24)[0]


def test_bench_result_given_on_the_command_line(run_cli, write, tmp_path):
    write("train.py", SMALL)
    given = _bench(tmp_path, "run.json", wait=0.3)
    write("train.py", SMALL.replace(", num_workers=4)", ")"))
    found = _json(run_cli, "train.py", "--bench-result", given, cwd=tmp_path)
    assert _by(found, "SF101", 24)[0]["impact_measured"] is True
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "speedfix.bench.compare/0.1"}', encoding="utf-8")
    result = run_cli("scan", "train.py", "--bench-result", bad, cwd=tmp_path)
    assert result.exit_code == 2 and "not the result of one `speedfix bench SCRIPT --json` run" in result.stderr
    result = run_cli("scan", "train.py", "--bench-result", tmp_path / "missing.json", cwd=tmp_path)
    assert result.exit_code == 2


def test_an_unreadable_bench_result_beside_the_script_is_a_note(run_cli, write, tmp_path):
    write("train.py", SMALL)
    (tmp_path / "train.speedfix-bench.json").write_text("{not json", encoding="utf-8")
    result = run_cli("scan", "train.py", "--torch-version", "2.4", cwd=tmp_path)
    assert result.exit_code == 1
    assert "train.py: note: train.speedfix-bench.json: cannot read a `speedfix bench` result" in result.stdout


def test_judge_thresholds():
    def finding(measure):
        return Finding("SF101", "n", "m", Severity.WARNING, None, impact=Impact.HIGH, measure=measure)

    cases = [(0.25, "cuda", Impact.HIGH), (0.10, "cuda", Impact.MEDIUM), (0.06, "cuda", Impact.HIGH),
             (0.02, "cuda", Impact.LOW), (0.02, "cpu", Impact.HIGH), (0.10, "cpu", Impact.MEDIUM)]
    for wait, device, expected in cases:
        found = finding("data_wait")
        judge([found], Measurements("r.json", device=device, data_wait=wait))
        assert found.impact is expected, (wait, device)
    unmeasured = finding(None)
    judge([unmeasured], Measurements("r.json", device="cuda", data_wait=0.9))
    assert unmeasured.impact is Impact.HIGH and not unmeasured.measured
    sync = finding("host_sync")
    judge([sync], Measurements("r.json", device="cuda", step_time_s=0.9))
    assert sync.impact is Impact.LOW and "900 ms" in (sync.impact_reason or "")


def test_min_impact_filters_scan_and_apply(run_cli, write, tmp_path):
    path = write("train.py", SMALL)
    write("starved.py", SMALL.replace("shuffle=True, num_workers=4)", "shuffle=True)"))  # SF101: high
    found = _json(run_cli, "train.py", "--min-impact", "medium", cwd=tmp_path)
    assert found and all(f["impact"] in ("high", "medium") for f in found)
    assert {f["impact"] for f in _json(run_cli, "starved.py", "--min-impact", "HIGH", cwd=tmp_path)} == {"high"}
    bad = run_cli("scan", "train.py", "--min-impact", "huge", cwd=tmp_path)
    assert bad.exit_code == 2 and "--min-impact must be one of high, medium, low, not 'huge'" in bad.stderr
    # apply: only the fixes of findings at that impact or higher; the low ones are not listed as left
    result = run_cli("apply", "train.py", "--min-impact", "medium", "--torch-version", "2.4", cwd=tmp_path)
    fixed = path.read_text(encoding="utf-8")
    assert fixed.count("pin_memory=True") == 1 and "non_blocking=True" in fixed
    assert "DataLoader(test_set, batch_size=1000, num_workers=4)" in fixed  # its pin_memory is low impact
    assert "train.py:25:" not in result.stdout
    path.write_text(SMALL, encoding="utf-8")
    (tmp_path / "pyproject.toml").write_text('[tool.speedfix]\nmin-impact = "high"\n', encoding="utf-8")
    assert {f["impact"] for f in _json(run_cli, "starved.py", cwd=tmp_path)} == {"high"}
    (tmp_path / "pyproject.toml").write_text('[tool.speedfix]\nmin-impact = 3\n', encoding="utf-8")
    bad = run_cli("scan", "train.py", cwd=tmp_path)
    assert bad.exit_code == 2 and "`min-impact` must be one of high, medium, low" in bad.stderr


SUBCLASS_TEST_LOADER = """\
import torch
from torch.utils.data import DataLoader


class PaddedLoader(DataLoader):
    pass


train_loader = DataLoader(train_set, batch_size=64, num_workers=4, pin_memory=True, persistent_workers=True)
test_loader = PaddedLoader(test_set, batch_size=256)
model = Net().cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(10):
    for x, y in train_loader:
        loss = loss_fn(model(x.cuda()), y.cuda())
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        for x, y in test_loader:
            model(x.cuda())
"""


def test_a_dataloader_subclass_that_only_evaluation_reads_is_low(run_cli, write, tmp_path):
    write("train.py", SUBCLASS_TEST_LOADER)
    (workers,) = _by(_json(run_cli, "train.py", cwd=tmp_path), "SF101", 10)
    assert workers["impact"] == "low" and workers["impact_reason"] == "a loader that only evaluation or testing reads"


def test_sarif_ranks_and_text_orders_by_impact(run_cli, write, tmp_path):
    write("train.py", NO_TEST_WORKERS)
    sarif = json.loads(run_cli("scan", "train.py", "--output-format", "sarif", cwd=tmp_path).stdout)
    run = sarif["runs"][0]
    ranks = {(r["ruleId"], r["locations"][0]["physicalLocation"]["region"]["startLine"]): r["rank"] for r in run["results"]}
    assert ranks[("SF102", 24)] == 50 and ranks[("SF101", 25)] == 20
    assert all(0 <= rank <= 100 for rank in ranks.values())
    assert all(r["properties"]["impact"] in ("high", "medium", "low") for r in run["results"])
    rules = {rule["id"]: rule for rule in run["tool"]["driver"]["rules"]}
    assert rules["SF205"]["defaultConfiguration"]["rank"] == 80 and rules["SF402"]["defaultConfiguration"]["rank"] == 20


@pytest.mark.parametrize(("value", "message"), [
    ("1.x", "not a torch version: '1.x'"),
    ("abc", "not a torch version: 'abc'"),
    ("99", "no torch 99 exists"),
    ("3.0", "no torch 3.0 exists"),
])
def test_torch_version_is_validated(run_cli, write, tmp_path, value, message):
    write("train.py", SMALL)
    for command in ("scan", "apply"):
        result = run_cli(command, "train.py", "--torch-version", value, cwd=tmp_path)
        assert result.exit_code == 2 and f"--torch-version: {message}" in result.stderr, result.stderr
    (tmp_path / "pyproject.toml").write_text(f'[tool.speedfix]\ntorch-version = "{value}"\n', encoding="utf-8")
    result = run_cli("scan", "train.py", cwd=tmp_path)
    assert result.exit_code == 2 and message in result.stderr


@pytest.mark.parametrize("value", ["2.4", "1.13.1", "2.13.0+cpu", "2.5.0a0", "v2.1", "2.6.0.dev20240101"])
def test_real_torch_versions_are_accepted(run_cli, write, tmp_path, value):
    write("train.py", "import torch\n")
    assert run_cli("scan", "train.py", "--torch-version", value, cwd=tmp_path).exit_code == 0


def test_editor_diagnostics_lead_with_the_highest_impact(tmp_path):
    pytest.importorskip("pygls")
    from pygls.workspace.position_codec import PositionCodec

    from speedfix.server import LineIndex, check, diagnostics
    from speedfix.workspace.config import Settings

    starved = SMALL.replace("shuffle=True, num_workers=4)", "shuffle=True)")  # SF101: high
    checked = check(tmp_path / "train.py", starved, Settings(root=tmp_path, torch_version="2.4"))
    shown = diagnostics(checked, LineIndex(starved, PositionCodec()))
    impacts = [d.data["impact"] for d in shown]
    assert impacts == sorted(impacts, key=["high", "medium", "low"].index) and impacts[-1] == "low"
    assert all(d.message.endswith(f"(impact: {d.data['impact']})") for d in shown)
    quiet = check(tmp_path / "train.py", starved, Settings(root=tmp_path, torch_version="2.4", min_impact=Impact.HIGH))
    assert {d.data["impact"] for d in diagnostics(quiet, LineIndex(starved, PositionCodec()))} == {"high"}


def test_a_cached_finding_without_an_impact_is_analysed_again():
    from speedfix.commands.scan import _loaded
    from speedfix.engine.findings import to_record

    finding = Finding("SF102", "dataloader-no-pin-memory", "m", Severity.WARNING, None, path="t.py", impact=Impact.LOW,
                      impact_reason="a loader that only evaluation or testing reads")
    record = {"error": None, "findings": [to_record(finding)], "notes": []}
    restored = _loaded(record)
    assert restored is not None and restored.findings[0].impact is Impact.LOW
    assert restored.findings[0].impact_reason == "a loader that only evaluation or testing reads"
    del record["findings"][0]["impact"]  # written by a version without impacts
    assert _loaded(record) is None


@pytest.mark.parametrize("dest, width", [
    ("hidden_size", True), ("nhid", True), ("hidRNN", True), ("d_model", True), ("emsize", True), ("latent_dim", True),
    ("n_embd", True), ("rnn_size", True), ("batch_size", False), ("seq_len", False), ("img_size", False),
    ("num_channels", False), ("n_heads", False), ("vocab_size", False), ("window", False), ("input_dim", False),
    ("dropout", False), ("lr", False)])
def test_which_options_set_a_networks_width(dest, width):
    from speedfix.model.workload import _width_option

    assert _width_option(dest) is width
