"""What the benchmark's write guard (an audit hook, speedfix/bench/guard.py) costs a training step.

An audit hook runs on every audit event of the process, not only on the writes it checks. This
measures, in fresh processes (a hook cannot be removed):

* how many audit events a training step raises (a tiny MLP with AdamW; without DataLoader
  workers, and with 2 fork workers, whose batches arrive through sockets and pickles);
* what one event costs with the guard's hook installed against none (``id()`` raises an event:
  a loop of them, best of 5).

    python benchmarks/guard_cost.py

Events per step times the cost per event is the guard's cost per step.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

EVENTS = """
import collections, json, sys
import torch
from torch.utils.data import DataLoader, TensorDataset

counts = collections.Counter()
counting = [False]

def hook(event, args):
    if counting[0]:
        counts[event] += 1

sys.addaudithook(hook)
workers = int(sys.argv[1])
loader = DataLoader(TensorDataset(torch.randn(512, 32), torch.randn(512, 1)), batch_size=16, num_workers=workers,
                    persistent_workers=workers > 0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.AdamW(model.parameters())
steps = 0
for epoch in range(3):
    counting[0] = epoch > 0
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += counting[0]
print(json.dumps({"steps": steps, "events": sum(counts.values()), "by_event": dict(counts)}))
"""

PER_EVENT = """
import json, sys, time
sys.path.insert(0, sys.argv[2])
if sys.argv[1] == "guard":
    from speedfix.bench.guard import Guard
    Guard(protected=["/nonexistent/project"], allowed=["/tmp"]).install()
x, n = object(), 1_000_000

def loop():
    t = time.perf_counter()
    for _ in range(n):
        id(x)
    return (time.perf_counter() - t) / n

print(json.dumps(min(loop() for _ in range(5))))
"""


def run(code: str, *args: str) -> object:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    import speedfix

    root = str(__import__("pathlib").Path(speedfix.__file__).resolve().parents[1])
    bare, guarded = run(PER_EVENT, "bare", root), run(PER_EVENT, "guard", root)
    per_event = guarded - bare
    print(f"one audit event: {bare * 1e9:.0f} ns without a hook, {guarded * 1e9:.0f} ns with the guard: "
          f"{per_event * 1e9:.0f} ns per event")
    for workers in (0, 2):
        data = run(EVENTS, str(workers))
        per_step = data["events"] / data["steps"]
        print(f"{workers} DataLoader workers: {per_step:.1f} audit events per step ({data['by_event']}): "
              f"{per_step * per_event * 1e6:.2f} us per step for the guard")


if __name__ == "__main__":
    main()
