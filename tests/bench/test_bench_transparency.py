"""The harness must be invisible to torch.compile: the same Dynamo graphs, graph breaks and
compiled frames with it as without it, and nothing left to recompile later.

``backend="eager"`` runs Dynamo's tracing and guards without a C++ compiler, so this runs on any
CPU. A harness hook that Dynamo can see (a global module hook calling ``os.getpid()``) shows up
here as one graph break per module call and extra graphs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from speedfix.bench.runner import RunSpec, run_once

# Both ways of compiling a module: the OptimizedModule wrapper and Module.compile(), which
# compiles _call_impl itself (so Dynamo reads the global hooks there). A no_grad evaluation call
# comes first, as in scripts that estimate the loss before training.
COMPILED_SCRIPT = """
import atexit, json, os
import torch
import torch._dynamo.utils


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.act = torch.nn.GELU()

    def forward(self, x):
        return self.act(self.lin(x)) + x


def dump():
    c = torch._dynamo.utils.counters
    with open(os.environ["SPEEDFIX_TEST_COUNTERS"], "w") as f:
        json.dump({"graphs": c["stats"]["unique_graphs"], "graph_breaks": sum(c["graph_break"].values()),
                   "frames_ok": c["frames"]["ok"], "frames_total": c["frames"]["total"]}, f)


atexit.register(dump)
torch.manual_seed(0)
wrapped = torch.nn.Sequential(Block(), Block(), torch.nn.Linear(16, 1))
compiled = torch.compile(wrapped, backend="eager")
inner = torch.nn.Sequential(Block(), Block(), torch.nn.Linear(16, 1))
inner.compile(backend="eager")
params = list(wrapped.parameters()) + list(inner.parameters())
opt = torch.optim.SGD(params, lr=0.01)
x, y = torch.randn(32, 16), torch.randn(32, 1)
with torch.no_grad():
    compiled(x), inner(x)
for step in range(STEPS):
    loss = torch.nn.functional.mse_loss(compiled(x) + inner(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

WARMUP, WINDOW = 4, 6


def _counters(path) -> dict:
    return json.loads(path.read_text())


def test_compiled_model_has_the_same_graphs_and_breaks_with_and_without_the_harness(write_script, quick_config,
                                                                                    tmp_path, monkeypatch):
    # The harness stops the script after warm-up + window (+ the steps its compile-aware
    # warm-up may add: up to 200 on a busy machine, where steps take uneven times); the bare run
    # does at least as many steps. Steps after compilation compile nothing, so the counters of a
    # transparent harness equal the bare ones. The counters are written outside the script's
    # folder: the run may not change that one.
    script = write_script("compiled.py", f"STEPS = {WARMUP + WINDOW + 220}\n" + COMPILED_SCRIPT, tmp_path / "project")
    bare_out, harness_out = tmp_path / "bare.json", tmp_path / "harness.json"

    env = {**os.environ, "SPEEDFIX_TEST_COUNTERS": str(bare_out)}
    subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, check=True, timeout=300)

    monkeypatch.setenv("SPEEDFIX_TEST_COUNTERS", str(harness_out))
    result = run_once(RunSpec(script, [], script.parent), quick_config(warmup_steps=WARMUP, steps=WINDOW, timeout_s=240.0,
                                                                 result_grace_s=30.0))

    assert result.status == "ok", result.message
    bare, measured = _counters(bare_out), _counters(harness_out)
    assert bare["graph_breaks"] == 0  # the script itself compiles cleanly
    assert measured == bare
    compile_info = result.compile
    assert compile_info.watched and compile_info.compilations >= 2
    assert compile_info.in_window == 0  # nothing compiled while the window was open
    assert compile_info.seconds > 0
    assert result.clock == "optimizer.step"
    assert result.data.batch_size == 32  # read from the first model call, before any compile
    # the run-time facts were recorded in the same run (they add nothing Dynamo sees): both compilations
    # (Module.compile() goes through torch.compile) and the compiled model of the first training call
    assert [(c.target.rsplit(".", 1)[-1], c.method, c.backend) for c in result.runtime.compiled] == [
        ("Sequential", False, "eager"), ("Sequential", True, "eager")]
    # the model is read at the evaluation call: the hook is gone before Dynamo traces the training calls
    assert result.runtime.model.compiled and result.runtime.model.seen_in == "evaluation"
    assert result.runtime.autocast is None and result.runtime.errors == []
