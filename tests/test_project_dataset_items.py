"""A loader's dataset whose class another file of the project defines: what its `__getitem__`
does decides whether the samples are token ids tokenized ahead (SF101 stays quiet) or work done
item by item, which worker processes would take off the training process."""

from __future__ import annotations

import json
import textwrap

TRAIN = textwrap.dedent(
    """
    import argparse
    import torch
    from transformers import AutoTokenizer
    from data.pairs import CaptionedPairs

    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained("some/model")
    pairs = CaptionedPairs("images/", tokenizer=tokenizer)
    loader = torch.utils.data.DataLoader(pairs, batch_size=4, shuffle=True, num_workers=args.workers)
    for epoch in range(10):
        for batch in loader:
            loss = net(batch["pixels"].cuda(), batch["input_ids"].cuda())
            loss.backward()
            opt.step()
            opt.zero_grad()
    """
)

PAIRS = """
from PIL import Image
from torch.utils.data import Dataset


class CaptionedPairs(Dataset):
    def __init__(self, folder, tokenizer):
        self.folder, self.tokenizer = folder, tokenizer

    def __getitem__(self, index):
        image = Image.open(f"{self.folder}/{index}.png")
        ids = self.tokenizer(self.captions[index], return_tensors="pt").input_ids
        return {"pixels": self.to_tensor(image), "input_ids": ids}
"""

# Tune-A-Video: the prompt is tokenized once, each item decodes the video's frames from its file.
VIDEO = """
import decord
from torch.utils.data import Dataset


class CaptionedPairs(Dataset):
    def __init__(self, folder, tokenizer):
        self.ids = tokenizer("a man is skiing").input_ids

    def __getitem__(self, index):
        frames = decord.VideoReader(f"{self.folder}/{index}.mp4", width=512, height=512).get_batch(range(8))
        return {"pixels": frames, "input_ids": self.ids}
"""

AHEAD = """
from torch.utils.data import Dataset


class CaptionedPairs(Dataset):
    def __init__(self, folder, tokenizer):
        self.ids = [tokenizer(text).input_ids for text in read_captions(folder)]

    def __getitem__(self, index):
        return {"pixels": self.pixels[index], "input_ids": self.ids[index]}
"""


def _sf101_lines(run_cli, tmp_path, dataset: str) -> list[str]:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "data" / "pairs.py").write_text(dataset, encoding="utf-8")
    (tmp_path / "train.py").write_text(TRAIN, encoding="utf-8")
    result = run_cli("scan", "train.py", "data/pairs.py", "--select", "SF101", "--no-summary", cwd=tmp_path)
    return [line for line in result.stdout.splitlines() if " SF101 " in line]


def test_a_dataset_of_another_file_that_tokenizes_each_item_gets_workers(run_cli, tmp_path):
    lines = _sf101_lines(run_cli, tmp_path, PAIRS)
    assert len(lines) == 1 and lines[0].startswith("train.py:")
    assert "resolves to 0" in lines[0]


def test_a_dataset_of_another_file_that_tokenized_ahead_does_not(run_cli, tmp_path):
    assert _sf101_lines(run_cli, tmp_path, AHEAD) == []


def test_a_dataset_of_another_file_that_decodes_video_frames_gets_workers(run_cli, tmp_path):
    """The tokenizer is for the prompt; the samples are frames decoded from a video file."""
    lines = _sf101_lines(run_cli, tmp_path, VIDEO)
    assert len(lines) == 1 and lines[0].startswith("train.py:")


WINDOWS = """
import numpy as np
from torch.utils.data import Dataset


class CaptionedPairs(Dataset):
    def __init__(self, folder, tokenizer):
        self.data = np.load(folder + "/series.npy")

    def __getitem__(self, index):
        start = index + np.random.randint(0, 4)
        return self.data[start:start + 96].astype(np.float32), self.data[start + 96:start + 120]
"""


def test_a_dataset_of_another_file_that_slices_arrays_it_holds_is_low(run_cli, tmp_path):
    """Crossformer's `Dataset_MTS`: `__getitem__` only slices the arrays `__init__` loaded, a
    worker process would save little."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "data" / "pairs.py").write_text(WINDOWS, encoding="utf-8")
    series = (TRAIN.replace("from transformers import AutoTokenizer\n", "").replace('tokenizer = AutoTokenizer.from_pretrained("some/model")\n', "")
              .replace("tokenizer=tokenizer", "tokenizer=None").replace('loss = net(batch["pixels"].cuda(), batch["input_ids"].cuda())',
                                                                       "loss = net(batch[0].cuda(), batch[1].cuda())"))
    (tmp_path / "train.py").write_text(series, encoding="utf-8")
    result = run_cli("scan", "train.py", "data/pairs.py", "--select", "SF101", "--output-format", "json", cwd=tmp_path)
    (finding,) = json.loads(result.stdout)
    assert finding["impact"] == "low" and "`CaptionedPairs` only crops" in finding["impact_reason"]
    (tmp_path / "data" / "pairs.py").write_text(WINDOWS.replace("np.random.randint(0, 4)", "load_offset(index)"),
                                                encoding="utf-8")
    result = run_cli("scan", "train.py", "data/pairs.py", "--select", "SF101", "--output-format", "json", cwd=tmp_path)
    assert json.loads(result.stdout)[0]["impact"] == "high"  # a call of its own: work the scan cannot see
