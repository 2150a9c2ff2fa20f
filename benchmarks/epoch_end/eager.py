"""An MLP trained on random data with an evaluation pass after every 250-step epoch; a 20 ms pause
per step stands in for what makes the original slow. compiled.py runs it with --compile: without
the pause and with torch.compile, which recompiles at the first epoch end (the last, smaller batch;
evaluation in eval mode). `speedfix bench eager.py compiled.py` shows where the comparison puts
its window (docs/benchmarks.md, "Where the window goes")."""
import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

COMPILE = "--compile" in sys.argv
torch.manual_seed(0)
x, y = torch.randn(250 * 64 + 10, 256), torch.randint(0, 10, (250 * 64 + 10,))
x_test, y_test = torch.randn(4000, 256), torch.randint(0, 10, (4000,))
train = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
test = DataLoader(TensorDataset(x_test, y_test), batch_size=500)
model = nn.Sequential(nn.Linear(256, 2048), nn.ReLU(), nn.Dropout(0.1), nn.Linear(2048, 2048), nn.ReLU(),
                      nn.Linear(2048, 10))
if COMPILE:
    model = torch.compile(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(20):
    model.train()
    for inputs, targets in train:
        loss = nn.functional.cross_entropy(model(inputs), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if not COMPILE:
            time.sleep(0.02)
    model.eval()
    with torch.no_grad():
        correct = sum((model(inputs).argmax(1) == targets).sum().item() for inputs, targets in test)
    print(f"epoch {epoch} accuracy {correct / len(y_test):.3f}")
