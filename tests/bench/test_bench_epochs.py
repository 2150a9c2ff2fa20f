"""Only training is timed: the time between epochs (evaluation, checkpoints, the recompiles they
cause) is measured on its own, and a compilation inside the window never gives an "ok" figure.

No test here depends on how fast the machine is: each run is compared with itself (the rate of
its steps inside the epochs), the pauses are many times a step, and sleeps are lower bounds.
"""

from __future__ import annotations

import pytest

from speedfix.bench.runner import RunSpec, run_once

# 20 training steps per epoch, then a no_grad evaluation pass (a new batch size each epoch: a
# model compiled with dynamic=False compiles again at every evaluation) and a pause
EPOCHS = """
import sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset

PAUSE = float(sys.argv[1])
torch.manual_seed(0)
train = DataLoader(TensorDataset(torch.randn(160, 64), torch.randn(160, 1)), batch_size=8)
val_data = TensorDataset(torch.randn(32, 64), torch.randn(32, 1))
net = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
model = {model}
opt = torch.optim.SGD(net.parameters(), lr=0.01)
for epoch in range(1000):
    net.train()
    for x, y in train:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    with torch.no_grad():
        for x, y in DataLoader(val_data, batch_size=4 + epoch):
            model(x)
    time.sleep(PAUSE)
"""

PAUSE = 1.0


def window_pauses(result):
    return [p for p in result.epochs.between if p.phase == "window" and p.at_step >= result.steps.warmup]


def assert_in_epoch_rate(result) -> None:
    """The reported rate is the rate of the steps inside the epochs, and no step holds a pause.

    Both compare the run with itself: a step that crossed an epoch end holds the whole pause
    when the pause is billed (the sleep is a lower bound), and the pauses here are many times a
    step, so a billed pause would make the ratio a small fraction."""
    pauses = window_pauses(result)
    per_step, warmup = result.timing.per_step_s, result.steps.warmup
    crossing = {p.at_step - warmup for p in pauses}  # index of the step that went on after the pause
    assert all(per_step[i] < p.seconds for i, p in zip(sorted(crossing), pauses) if i < len(per_step))
    inside = [d for i, d in enumerate(per_step) if i not in crossing]
    in_epoch_rate = len(inside) / sum(inside)
    assert result.timing.steps_per_s / in_epoch_rate > 0.5, (result.timing.steps_per_s, in_epoch_rate)


def test_a_validation_pause_between_epochs_is_reported_apart_and_not_billed(write_script, quick_config, tmp_path):
    script = write_script("epochs.py", EPOCHS.format(model="net"))
    result = run_once(RunSpec(script, [str(PAUSE)], tmp_path), quick_config(warmup_steps=5, steps=40))
    assert result.status == "ok", result.message
    assert result.epochs.detected_by == "dataloader"
    pauses = window_pauses(result)
    assert len(pauses) >= 1  # 40 timed steps of 20-step epochs cross at least one epoch end
    assert all(p.seconds >= PAUSE for p in pauses)  # the evaluation and the sleep, measured
    assert result.epochs.between_in_window_s >= PAUSE * len(pauses)
    # the window is training time: its steps add up to it, and the rate is the in-epoch rate
    assert sum(result.timing.per_step_s) == pytest.approx(result.timing.window_s, rel=0.05)
    assert_in_epoch_rate(result)
    assert result.data.samples_per_s == pytest.approx(8 * result.timing.steps_per_s)


def test_an_eval_mode_recompile_between_epochs_is_not_in_the_window(write_script, quick_config, tmp_path):
    script = write_script("compiled_epochs.py", EPOCHS.format(model='torch.compile(net, backend="eager", dynamic=False)'))
    result = run_once(RunSpec(script, ["0.2"], tmp_path), quick_config(warmup_steps=3, steps=30, timeout_s=240.0,
                                                                       result_grace_s=30.0))
    assert result.status == "ok", result.message
    assert result.compile.compilations >= 2
    assert result.compile.in_window == 0 and result.compile.window_restarts == []
    pauses = window_pauses(result)
    # 30 timed steps of 20-step epochs hold an epoch end, and every evaluation compiles
    assert pauses and all(p.compilations >= 1 for p in pauses)
    assert_in_epoch_rate(result)


# a compiled model whose input shape (rows) changes as the steps go: each new shape compiles again.
# Each step sleeps 50 ms: the warm-up settles when its last steps took similar times, and steps of
# a few microseconds vary by more than 3x on a busy machine (the warm-up then ran past step 15).
RESHAPING = """
import time
import torch
import torch._dynamo
torch._dynamo.config.cache_size_limit = 64
model = torch.compile(torch.nn.Linear(16, 1), backend="eager", dynamic=False)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(100_000):
    loss = model(torch.randn({rows}, 16)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.05)
"""


def run_reshaping(write_script, quick_config, tmp_path, rows: str, steps: int):
    script = write_script("reshape.py", RESHAPING.format(rows=rows))
    return run_once(RunSpec(script, [], tmp_path), quick_config(warmup_steps=3, steps=steps, timeout_s=240.0,
                                                                result_grace_s=30.0))


def test_a_compilation_inside_the_window_restarts_it(write_script, quick_config, tmp_path):
    # a new input shape at step 15: Dynamo compiles again while the window is open
    result = run_reshaping(write_script, quick_config, tmp_path, "8 if step < 15 else 12", steps=15)
    assert result.status == "ok", result.message
    (restart,) = result.compile.window_restarts
    assert restart["at_step"] == 16 and restart["compilations"] >= 1
    assert result.compile.in_window == 0
    assert result.steps.warmup > 16  # the warm-up went on past the compilation
    assert "compiled inside the window at step 16" in result.message


def test_a_window_that_keeps_compiling_is_never_ok(write_script, quick_config, tmp_path):
    result = run_reshaping(write_script, quick_config, tmp_path, "8 + step // 8", steps=10)  # new every 8 steps
    assert result.status == "unsettled", result.message
    assert len(result.compile.window_restarts) == 3 and result.compile.in_window >= 1
    assert "no figure without compilation" in result.message
