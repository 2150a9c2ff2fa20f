"""What a finding's impact rests on when the file does not show the model's layers or the
loader's dataset: the names that build the model, a Hugging Face checkpoint, the task, the
augmentations the file composes, whether the loader is pinned. Each script is a small version of
a pattern met in real training code (a segmentation net chosen by name from a project registry,
a BERT fine-tune without `Trainer`, a CycleGAN whose networks live in models.py, a small ViT on
cats and dogs)."""

from __future__ import annotations

import json

from speedfix.model.workload import Family, name_family

# A segmentation training script whose network comes from the project's registry by name.
REGISTRY = """\
import argparse
import torch
import torch.nn as nn
from torch.utils import data
import network
from utils import ext_transforms as et


def get_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=str, default="deeplabv3plus_mobilenet")
    parser.add_argument("--crop_size", type=int, default=513)
    return parser.parse_args()


def main():
    opts = get_args()
    train_transform = et.ExtCompose([
        et.ExtRandomScale((0.5, 2.0)),
        et.ExtRandomCrop(size=(opts.crop_size, opts.crop_size)),
        et.ExtToTensor(),
    ])
    train_dst = Segmentation(root="data", transform=train_transform)
    train_loader = data.DataLoader(train_dst, batch_size=16, shuffle=True, num_workers=2)
    model = network.modeling.__dict__[opts.model](num_classes=21)
    model = nn.DataParallel(model).to("cuda")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(30):
        for images, labels in train_loader:
            images = images.to("cuda", dtype=torch.float32)
            labels = labels.to("cuda", dtype=torch.long)
            optimizer.zero_grad()
            loss = criterion(model(images), labels)
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
"""

# A BERT fine-tune written by hand: the model class comes from a table, the dataset from the caller.
TOKENS = """\
import torch
from torch.utils.data import DataLoader, RandomSampler
from transformers import BertConfig

from utils import MODEL_CLASSES


class Trainer:
    def __init__(self, args, train_dataset):
        self.args = args
        self.train_dataset = train_dataset
        self.config_class, self.model_class = MODEL_CLASSES[args.model_type]
        self.model = self.model_class.from_pretrained(args.model_name_or_path)
        self.model.to("cuda")

    def train(self):
        loader = DataLoader(self.train_dataset, sampler=RandomSampler(self.train_dataset), batch_size=32)
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=5e-5)
        for epoch in range(3):
            for batch in loader:
                batch = tuple(t.to("cuda") for t in batch)
                inputs = {"input_ids": batch[0], "attention_mask": batch[1], "labels": batch[2]}
                loss = self.model(**inputs)[0]
                loss.backward()
                optimizer.step()
                self.model.zero_grad()
"""


def _json(run_cli, *args, cwd):
    result = run_cli("scan", *args, "--output-format", "json", "--torch-version", "2.4", cwd=cwd)
    assert result.exit_code in (0, 1), result.stderr
    return json.loads(result.stdout)


def _one(findings, code, line=None):
    found = [f for f in findings if f["code"] == code and (line is None or f["line"] == line)]
    assert len(found) == 1, (code, line, findings)
    return found[0]


def test_architecture_names_say_the_family():
    assert name_family("deeplabv3plus_mobilenet") is Family.CONV
    assert name_family("GeneratorResNet") is Family.CONV
    assert name_family("UNet_conditional") is Family.CONV
    assert name_family("ViT") is Family.MATMUL
    assert name_family("bert-base-uncased") is Family.MATMUL
    assert name_family("activation") is None  # `vit` inside a word names nothing
    assert name_family("Discriminator") is None
    assert name_family("resnet_transformer") is None  # the words disagree
    assert name_family("GraphCNN") is None  # a graph network, whatever else its name says
    assert name_family("GCNII") is None
    assert name_family("Paragraph") is None  # `graph` inside a word


def test_a_conv_net_chosen_by_name_ranks_its_loader_over_tf32_and_unpinned_copies(run_cli, write, tmp_path):
    write("main.py", REGISTRY)
    found = _json(run_cli, "main.py", cwd=tmp_path)
    tf32 = _one(found, "SF201")
    assert tf32["impact"] == "low" and "`deeplabv3plus_mobilenet`" in tf32["impact_reason"]
    # 2 workers decoding and randomly scaling images: the loader is the big win
    assert _one(found, "SF101")["impact"] == "high"
    # an unpinned loader: non_blocking does nothing until SF102 pins it
    copies = [f for f in found if f["code"] == "SF104"]
    assert len(copies) == 1 and copies[0]["impact"] == "low"  # images and labels: one transfer of the batch
    assert _one(found, "SF102")["impact"] == "medium"


def test_without_augmentations_an_explicit_worker_count_stays_medium(run_cli, write, tmp_path):
    write("main.py", REGISTRY.replace("et.ExtRandomScale((0.5, 2.0)),", "")
          .replace("et.ExtRandomCrop(size=(opts.crop_size, opts.crop_size)),", ""))
    assert _one(_json(run_cli, "main.py", cwd=tmp_path), "SF101")["impact"] == "medium"


def test_a_pinned_loader_keeps_non_blocking_copies_at_medium(run_cli, write, tmp_path):
    write("main.py", REGISTRY.replace("num_workers=2)", "num_workers=2, pin_memory=True)"))
    copies = [f for f in _json(run_cli, "main.py", cwd=tmp_path) if f["code"] == "SF104"]
    assert len(copies) == 1 and copies[0]["impact"] == "medium"


def test_a_hub_transformer_fine_tuned_in_fp32_gets_tf32_high_and_its_token_loader_less(run_cli, write, tmp_path):
    write("trainer.py", TOKENS)
    found = _json(run_cli, "trainer.py", cwd=tmp_path)
    assert _one(found, "SF201")["impact"] == "high"
    assert not [f for f in found if f["code"] == "SF101"]  # token ids tokenized ahead: nothing for workers
    assert _one(found, "SF102")["impact"] == "low"
    assert _one(found, "SF104")["impact"] == "low"
    # the same trainer without `transformers` and token ids: nothing tells what the model is
    plain = TOKENS.replace("from transformers import BertConfig\n", "").replace(
        '{"input_ids": batch[0], "attention_mask": batch[1], "labels": batch[2]}', '{"x": batch[0], "y": batch[1]}'
    ).replace("self.model_class.from_pretrained(args.model_name_or_path)", "build_model(args)")
    write("plain.py", plain)
    found = _json(run_cli, "plain.py", cwd=tmp_path)
    assert _one(found, "SF201")["impact"] == "medium"
    assert _one(found, "SF101")["impact"] == "high"


def test_networks_of_another_module_are_judged_by_their_class_names(run_cli, write, tmp_path):
    gan = REGISTRY.replace("network.modeling.__dict__[opts.model](num_classes=21)", "GeneratorResNet((3, 256, 256), 9)")
    write("cyclegan.py", gan.replace("import network\n", "from models import *\n"))
    assert _one(_json(run_cli, "cyclegan.py", cwd=tmp_path), "SF201")["impact"] == "low"
    # a small vision transformer: its matmuls do the work, but they are small
    vit = gan.replace("GeneratorResNet((3, 256, 256), 9)", "ViT(dim=128, image_size=224, patch_size=32, num_classes=2)")
    write("vit.py", vit.replace("from models import *\n", "from vit_pytorch import ViT\n"))
    tf32 = _one(_json(run_cli, "vit.py", cwd=tmp_path), "SF201")
    assert tf32["impact"] == "medium" and tf32["impact_reason"] == "a small transformer (width 128)"
    write("vit_base.py", vit.replace("dim=128", "dim=768"))
    assert _one(_json(run_cli, "vit_base.py", cwd=tmp_path), "SF201")["impact"] == "high"


def test_decoded_images_and_tokenizers_say_what_a_loader_carries(run_cli, write, tmp_path):
    # DCGAN on a folder of JPEGs: 2 workers decode 128 images per batch for a small, fast step
    folder = REGISTRY.replace("et.ExtRandomScale((0.5, 2.0)),", "").replace(
        "et.ExtRandomCrop(size=(opts.crop_size, opts.crop_size)),", "").replace(
        'Segmentation(root="data", transform=train_transform)', 'dset.ImageFolder(root="data", transform=train_transform)')
    write("folder.py", folder.replace("import network\n", "import network\nimport torchvision.datasets as dset\n"))
    assert _one(_json(run_cli, "folder.py", cwd=tmp_path), "SF101")["impact"] == "high"
    # a text classifier whose batches come from a tokenizer (the step passes the whole batch on)
    moved = '        self.model.to("cuda")\n'
    text = TOKENS.replace("from transformers import BertConfig\n", "from transformers import AutoTokenizer\n").replace(
        '                inputs = {"input_ids": batch[0], "attention_mask": batch[1], "labels": batch[2]}\n', "").replace(
        "self.model(**inputs)", "self.model(*batch)").replace(
        moved, moved + '        self.tokenizer = AutoTokenizer.from_pretrained("bert-base-uncased")\n')
    write("text.py", text)
    found = _json(run_cli, "text.py", cwd=tmp_path)
    assert not [f for f in found if f["code"] == "SF101"]  # tokenized ahead: a worker would only index and pad
    assert _one(found, "SF102")["impact"] == "low"
    # the same classifier over a Dataset of its own that tokenizes each item as it is read
    per_item = text.replace("class Trainer:", (
        "class Reviews(torch.utils.data.Dataset):\n"
        "    def __getitem__(self, i):\n"
        "        return self.tokenizer(self.texts[i], truncation=True, return_tensors='pt')\n\n\n"
        "class Trainer:"))
    write("per_item.py", per_item)
    workers = _one(_json(run_cli, "per_item.py", cwd=tmp_path), "SF101")
    assert workers["impact"] == "medium"
    assert workers["impact_reason"].endswith("tokenized item by item: cheap next to a transformer step")


def test_augmenting_cifar_in_memory_is_no_heavy_image_pipeline(run_cli, write, tmp_path):
    cifar = REGISTRY.replace('Segmentation(root="data", transform=train_transform)',
                             'torchvision.datasets.CIFAR10(root="data", train=True, transform=train_transform)')
    write("cifar.py", cifar.replace("import network\n", "import network\nimport torchvision\n"))
    workers = _one(_json(run_cli, "cifar.py", cwd=tmp_path), "SF101")
    assert workers["impact"] == "medium" and workers["impact_reason"] == "an explicit worker count"
