"""What an active `torch.profiler.profile()` costs a small training step on this machine.

    python benchmarks/profiler_cost.py

Times 300 steps of a 3-layer MLP (batch 32, one CPU thread) with and without the profiler
around them, five times alternating, and prints the medians. The figure in SF604's docs comes
from this script; it prints figures and asserts nothing.
"""

from __future__ import annotations

import statistics
import time

import torch

STEPS = 300


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))

    def train(steps: int) -> None:
        for _ in range(steps):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    def plain() -> float:
        start = time.perf_counter()
        train(STEPS)
        return time.perf_counter() - start

    def profiled() -> float:
        start = time.perf_counter()
        with torch.profiler.profile():
            train(STEPS)
        return time.perf_counter() - start

    train(50)  # warm-up
    without, within = [], []
    for _ in range(5):
        without.append(plain())
        within.append(profiled())
    a, b = statistics.median(without), statistics.median(within)
    print(f"torch {torch.__version__}: {a / STEPS * 1e3:.2f} ms/step without the profiler, "
          f"{b / STEPS * 1e3:.2f} ms/step inside torch.profiler.profile(): {b / a:.2f}x")


if __name__ == "__main__":
    main()
