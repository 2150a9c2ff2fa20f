"""Scan cost against file size: one generated training module of 100 KB, 1 MB and 5 MB.

    python benchmarks/scan_size.py                  # 100 KB, 1 MB, 5 MB
    python benchmarks/scan_size.py --sizes 100,500  # sizes in KB

Each module is one file of many training functions (imports, a model class, a DataLoader, a
step loop with `.item()`, `empty_cache()`, a deprecated GradScaler, ...), so every rule has work
to do and the file has findings throughout. The figure is the wall-clock time of analysing the
file in this process, on one core (no start-up, no cache; the file-size cap and time limit are
lifted so that the big files are really scanned), and its CPU time, which other processes on a
busy machine disturb less. It prints figures and the growth ratio of CPU time between consecutive
sizes (time ratio / size ratio: 1.0 is linear); it asserts nothing.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from speedfix.commands.scan import scan_file  # noqa: E402
from speedfix.workspace.config import Settings  # noqa: E402
from speedfix.workspace.discovery import Target  # noqa: E402

HEADER = '''\
"""A generated training module (benchmarks/scan_size.py)."""
import gc
import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3)
        self.bn = nn.BatchNorm2d(16)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.bn(self.conv(x)).mean((2, 3)))

'''

# One training function; {i} makes every copy distinct.
BLOCK = '''

def train_{i}(data, epochs={i}):
    """Train variant {i}."""
    device = torch.device("cuda")
    model = Net().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.cuda.amp.GradScaler()
    loader = DataLoader(TensorDataset(*data), batch_size={i} % 64 + 1, shuffle=True)
    history_{i} = []
    for epoch in range(epochs):
        for step, (x, y) in enumerate(loader):
            x = x.to(device)
            y = y.to(device)
            optimizer.zero_grad(set_to_none=False)
            # forward pass of variant {i}
            with torch.cuda.amp.autocast():
                loss = nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            history_{i}.append(loss.item())
            torch.cuda.empty_cache()
            if step % 100 == 0:
                print(f"epoch {{epoch}} step {{step}}: {{sum(history_{i}) / len(history_{i}):.4f}}")
        gc.collect()
    return history_{i}
'''


def training_module(size: int) -> str:
    """A training module of about ``size`` bytes."""
    parts = [HEADER]
    total = len(HEADER)
    index = 0
    while total < size:
        block = BLOCK.format(i=index)
        parts.append(block)
        total += len(block)
        index += 1
    return "".join(parts)


def scan_seconds(path: Path) -> tuple[float, float, int]:
    """(wall-clock seconds, CPU seconds, findings) of scanning ``path`` once."""
    settings = replace(Settings(root=path.parent), max_file_size=None, file_time_limit=None)
    start, cpu = time.perf_counter(), time.process_time()
    analysis = scan_file(Target(path, explicit=True), settings)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    if analysis.error is not None:
        raise SystemExit(f"{path}: {analysis.error.render()}")
    return elapsed, cpu, len(analysis.findings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,1000,5000", help="module sizes in KB, comma-separated")
    args = parser.parse_args()
    sizes = [int(float(kb) * 1000) for kb in args.sizes.split(",")]
    print(f"python {platform.python_version()}, {platform.machine()}, one core, in-process analysis")
    print(f"{'size':>8} {'lines':>8} {'findings':>9} {'wall s':>7} {'CPU s':>7} {'KB/s':>6}  growth of CPU time (time ratio / size ratio)")
    previous: tuple[int, float] | None = None
    with tempfile.TemporaryDirectory() as folder:
        for size in sizes:
            code = training_module(size)
            path = Path(folder) / f"train_{size}.py"
            path.write_text(code, encoding="utf-8")
            seconds, cpu, findings = scan_seconds(path)
            path.unlink()
            growth = ""
            if previous is not None:
                size_ratio = len(code) / previous[0]
                time_ratio = cpu / previous[1]
                growth = f"{time_ratio:.1f}x time for {size_ratio:.1f}x size = {time_ratio / size_ratio:.2f}"
            print(
                f"{len(code) / 1000:>6.0f}KB {code.count(chr(10)):>8} {findings:>9} {seconds:>7.2f} {cpu:>7.2f} "
                f"{len(code) / 1000 / cpu:>6.0f}  {growth}",
                flush=True,
            )
            previous = (len(code), cpu)


if __name__ == "__main__":
    main()
