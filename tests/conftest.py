from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from speedfix.cli import app

ROOT = Path(__file__).resolve().parent.parent

# Bytecode is written during the test run even where the environment says not to (some sandboxes
# and CI images set PYTHONDONTWRITEBYTECODE): without it every `speedfix` process the tests start
# compiles the package again (0.7 s of a 1.4 s scan on 2 cores) and each worker rewrites the test
# modules' asserts again (7 s). The `__pycache__` folders it writes are ignored by git.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# A fresh clone has no bytecode yet, and the processes the first tests start (two workers' worth,
# at once) each compiled the package again: a clean clone's first run took 312 s, the same clone's
# next run 265 s, and 272 s with the package compiled first. Done once, before the workers start,
# it costs about a second (nothing when the bytecode is up to date).
if "PYTEST_XDIST_WORKER" not in os.environ:
    import compileall

    for _folder in ("speedfix", "rules", "benchmarks"):
        compileall.compile_dir(ROOT / _folder, quiet=2)

# One intra-op thread for torch in the test process and in every script the tests run: two
# workers share two cores, and two OpenMP threads per tiny model only spin against each other (a
# framework fixture's run took twice the wall time under load; a full run 270 s against 305 s).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Tests that take far longer than the others (a fresh install from the wheel and a bench run from
# it; a compiled model run with and without the harness: 15-20 s each) run first: queued last, one of
# them kept a worker busy while the other had nothing left to take (work stealing moves queued
# tests, not a running one).
LONGEST_FIRST = ("test_a_fresh_install_pulls_no_torch_its_help_and_scan_work_and_the_bench_runs_from_the_wheel",
                 "test_compiled_model_has_the_same_graphs_and_breaks_with_and_without_the_harness")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.originalname not in LONGEST_FIRST)  # a stable sort: the rest keep their order

# A small CUDA training script with one finding for most rules (used by several test files).
TRAIN_SCRIPT = textwrap.dedent(
    """\
    import torch
    from torch.utils.data import DataLoader


    def main():
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = Net().to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        scaler = torch.cuda.amp.GradScaler()
        loader = DataLoader(train_set, batch_size=32, shuffle=True)
        running = 0.0
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            with torch.autocast("cuda", dtype=torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16):
                loss = model(x, y)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            running += loss.item()
            if step % 100 == 0:
                print(f"step {step}: {running / 100:.3f}")
                running = 0.0


    if __name__ == "__main__":
        main()
    """
)


@pytest.fixture
def train_script() -> str:
    return TRAIN_SCRIPT


class Result:
    """A CLI run: exit code, standard output and standard error."""

    def __init__(self, exit_code: int, stdout: str, stderr: str) -> None:
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr

    def __repr__(self) -> str:
        return f"Result(exit_code={self.exit_code}, stdout={self.stdout!r}, stderr={self.stderr!r})"


@pytest.fixture
def run_cli(monkeypatch):
    """Run `speedfix ARGS...` in-process (no cache, installed torch never consulted)."""
    monkeypatch.setenv("SPEEDFIX_NO_CACHE", "1")

    def run(*args: str, cwd: Path | None = None) -> Result:
        if cwd is not None:
            monkeypatch.chdir(cwd)
        runner = CliRunner()
        result = runner.invoke(app, [str(a) for a in args], obj={"script_args": []}, catch_exceptions=False)
        return Result(result.exit_code, result.stdout, result.stderr)

    return run


@pytest.fixture
def write(tmp_path):
    """write("name.py", code) -> Path, dedenting the code."""

    def _write(name: str, code: str, *, encoding: str = "utf-8") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(textwrap.dedent(code).encode(encoding))
        return path

    return _write


# A CUDA training script with exactly one finding (SF102: a DataLoader without pin_memory).
GOOD_SCRIPT = """\
import torch
from torch.utils.data import DataLoader

loader = DataLoader(ds, batch_size=32)
for x, y in loader:
    loss = model(x.cuda(non_blocking=True)).sum()
    loss.backward()
    opt.step()
"""


@pytest.fixture
def good_script() -> str:
    """A small CUDA training script with exactly one finding (SF102)."""
    return GOOD_SCRIPT


@pytest.fixture
def counted(monkeypatch):
    """The names of the files really analysed (not served from the cache); the cache is on."""
    import speedfix.engine.analysis as analysis_module

    calls: list[str] = []
    original = analysis_module.analyze

    def counting(source, path, *args, **kwargs):
        calls.append(Path(path).name)
        return original(source, path, *args, **kwargs)

    monkeypatch.setattr(analysis_module, "analyze", counting)  # the scan imports it when it analyses
    monkeypatch.delenv("SPEEDFIX_NO_CACHE", raising=False)
    return calls


@pytest.fixture(scope="session")
def built_once(tmp_path_factory, request) -> Callable[[str, Callable[[Path], Any]], Any]:
    """built_once(name, build) -> what build(folder) returned (JSON data), built once for the whole
    run: the first xdist worker to ask builds it in a folder all workers share, the others wait for
    it and read it back (the pattern pytest-xdist documents for session fixtures). For set-ups that
    cost seconds, such as an installed hook environment, which each worker would otherwise build."""
    root = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):
        root = root.parent  # the run's folder, above each worker's own

    def get(name: str, build: Callable[[Path], Any]) -> Any:
        folder, done = root / f"once-{name}", root / f"once-{name}.json"
        with open(root / f"once-{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if done.exists():
                return json.loads(done.read_text())
            shutil.rmtree(folder, ignore_errors=True)  # a build that failed in another worker
            folder.mkdir()
            value = build(folder)
            done.write_text(json.dumps(value))
            return value

    return get


@pytest.fixture(scope="session")
def _empty_folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("no-project")


@pytest.fixture(scope="module")
def outside_the_checkout(_empty_folder):
    """Run a module's tests in an empty folder. Code analysed from a string under a relative name
    (`fix_code(code, path="t.py")`) has the current folder as its project: from the checkout, every
    call would read this repository's own files (launch scripts, configs) as that code's project,
    which the tests do not mean and which costs more than the analysis of the code itself."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(_empty_folder)
        yield _empty_folder
