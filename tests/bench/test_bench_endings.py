"""What a run that ends badly is blamed on must be true: a worker's os._exit is the worker's, a
kill from outside is not the script's, a late signal handler does not lose the result."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from speedfix.bench import runner
from speedfix.bench.child import Harness
from speedfix.bench.runner import RunSpec, no_result_message, run_once

WORKER_EXIT = """
import os
import torch
from torch.utils.data import DataLoader, Dataset

class Data(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 40:
            os._exit(3)
        return torch.randn(4)

if __name__ == "__main__":
    model = torch.nn.Linear(4, 1)
    for epoch in range(100):  # no torch.optim, which imports Dynamo: backward() is the clock
        for x in DataLoader(Data(), batch_size=4, num_workers=2):
            model(x).sum().backward()
"""


def test_a_dataloader_workers_os_exit_is_reported_as_the_workers(write_script, quick_config, tmp_path):
    script = write_script("worker_exit.py", WORKER_EXIT)
    result = run_once(RunSpec(script, [], tmp_path), quick_config(steps=100))
    assert result.status == "error"
    assert result.reported, result.message  # the child wrote its result: it was not killed
    line = WORKER_EXIT.splitlines().index("            os._exit(3)") + 1
    assert f"called os._exit(3) at {script}:{line}" in result.message
    assert "killed" not in result.message


def test_an_exception_raised_while_the_child_ends_does_not_lose_the_result():
    # DataLoader's SIGCHLD handler raises in the main process when a worker died, wherever it is:
    # also inside the harness while it writes the result of the script's own error.
    harness = Harness.__new__(Harness)
    calls = []

    def finish_after_script(**ending):
        calls.append(ending)
        if len(calls) == 1:
            raise RuntimeError("DataLoader worker (pid 123) exited unexpectedly")

    harness.finish_after_script = finish_after_script
    harness.mirror_root = None
    assert harness._end({}) == 1  # the script "returned", then the late error came
    assert [type(c.get("exc")).__name__ for c in calls] == ["NoneType", "RuntimeError"]
    calls.clear()
    original = ValueError("bad batch")
    assert harness._end({"exc": original}) == 1
    assert [c["exc"] for c in calls] == [original, original]  # the script's own error stays the cause


def run_and_kill(script, args, cwd, config, pid_file, signum=signal.SIGKILL):
    """Run the script; once it wrote ``pid_file``, kill that pid from outside (as the out-of-memory
    killer or a user would)."""
    def killer():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                os.kill(int(pid_file.read_text()), signum)
                return
            except (OSError, ValueError):
                time.sleep(0.05)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    result = run_once(RunSpec(script, args, cwd), config)
    thread.join(timeout=5)
    return result


WAITS = """
import os, sys, time
import torch
model = torch.nn.Linear(4, 1)
for step in range(100_000):  # backward() is the clock
    model(torch.randn(8, 4)).sum().backward()
    if step == 2:
        pid = os.getppid() if sys.argv[2] == "parent" else os.getpid()
        with open(sys.argv[1] + ".tmp", "w") as f:
            f.write(str(pid))
        os.replace(sys.argv[1] + ".tmp", sys.argv[1])
        time.sleep(600)
"""


@pytest.mark.parametrize("whom, phrase", [
    ("parent", "the benchmark supervisor was killed by SIGKILL before the child wrote a result; the script sent it "
               "no signal: another process killed it"),
    ("child", "the child was killed by SIGKILL without a result (not by a signal the script sent"),
])
def test_a_kill_from_outside_is_not_blamed_on_the_script(write_script, quick_config, tmp_path, whom, phrase):
    if whom == "parent" and not runner.SUPERVISED:
        pytest.skip("the supervisor needs Linux")
    script = write_script("waits.py", WAITS, tmp_path / "project")
    pid_file = tmp_path / "pid"
    result = run_and_kill(script, [str(pid_file), whom], script.parent, quick_config(steps=1000), pid_file)
    assert result.status == "error"
    assert phrase in " ".join(result.message.split())
    assert "killed its parent" not in result.message


def test_the_messages_name_the_cause_they_know():
    signal_note = {"kind": "signal", "target": "parent", "call": "os.kill(77, SIGKILL)"}
    assert no_result_message(-9, True, [signal_note]).startswith("the script killed its parent process")
    assert "a crash in native code" in no_result_message(-int(signal.SIGSEGV), False, [])
    exit_note = {"kind": "exit", "pid": 5, "code": 0, "where": "train.py:12"}
    message = no_result_message(1, False, [exit_note])
    assert message.startswith("the child exited with code 1 without a result")
    assert "a forked worker process (pid 5) called os._exit(0) at train.py:12" in message
