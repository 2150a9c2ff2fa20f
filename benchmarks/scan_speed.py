"""Scan-speed benchmark: files/s and lines/s of `speedfix scan` on a tree of training scripts.

    python benchmarks/scan_speed.py                 # a generated tree of 100 fixture-based scripts
    python benchmarks/scan_speed.py PATH [--jobs N]  # any tree of your own
    python benchmarks/scan_speed.py PATH --torchfix /other/venv/bin/torchfix   # side by side

Each figure is the best of --repeat wall-clock runs of the real command (`python -m speedfix
scan PATH`), interpreter start-up included: what a user or a pre-commit hook waits for. Both
tools run in the tree's folder, as a user scans a project from its top: speedfix reads a
script's launch commands and configs inside the current folder too when it holds the script,
so run from a folder above the tree (/tmp) it would read whatever else lies there. Modules
run from bytecode, as an installed copy does (an untimed first run writes it). Cold runs
use --no-cache; warm runs reuse the cache the previous run wrote. It prints figures; it asserts
nothing.

When TorchFix is installed (on the PATH, or given with --torchfix; keep it in a virtual
environment of its own: it is no dependency of speedfix), its `torchfix --select=ALL PATH` is
timed in the same run, each TorchFix run right after a cold speedfix run with the same number of
jobs, so that both see the same machine load; the ratios of the best and of the median times
are printed, with the load average. Without TorchFix that part is skipped.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def generated_tree(folder: Path, count: int) -> Path:
    """`count` training scripts made from the bundled fixtures, each one slightly different."""
    sources = sorted(p for p in FIXTURES.glob("*.py") if ".fixed" not in p.name)
    for index in range(count):
        source = sources[index % len(sources)]
        text = source.read_text(encoding="utf-8").replace("BATCH_SIZE", f"BATCH_SIZE_{index}")
        target = folder / f"project_{index // 10}" / f"{source.stem}_{index}.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"# variant {index}\n{text}", encoding="utf-8")
    return folder


def count(tree: Path) -> tuple[int, int]:
    files = [p for p in tree.rglob("*.py") if ".speedfix_cache" not in p.parts]
    return len(files), sum(p.read_bytes().count(b"\n") for p in files)


# Both tools run as an installed copy runs: from compiled bytecode. pip compiles an installed
# package; an editable checkout under PYTHONDONTWRITEBYTECODE=1 would compile every module from
# source on every run (about 0.1 s of a 2 s scan), which no user pays.
ENVIRONMENT = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}


def timed(command: list[str], repeat: int, cwd: Path) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=ENVIRONMENT, cwd=cwd)
        best = min(best, time.perf_counter() - start)
    return best


def torchfix_command(given: str | None) -> list[str] | None:
    """The TorchFix executable to compare with, or None when there is none."""
    found = given or shutil.which("torchfix")
    return [found] if found and Path(found).exists() else None


def side_by_side(scan: list[str], torchfix: list[str], tree: Path, jobs: int, repeat: int) -> tuple[list[float], list[float]]:
    """Cold times of speedfix and TorchFix, each TorchFix run right after a speedfix run."""
    ours, theirs = [], []
    for _ in range(repeat):
        ours.append(timed([*scan, "--no-cache", "--jobs", str(jobs)], 1, tree))
        theirs.append(timed([*torchfix, "--select=ALL", "-j", str(jobs), str(tree)], 1, tree))
    return ours, theirs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", nargs="?", type=Path, help="tree to scan (default: a generated one)")
    parser.add_argument("--files", type=int, default=100, help="size of the generated tree")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--torchfix", help="TorchFix executable to time side by side (default: `torchfix` on the PATH)")
    parser.add_argument("--torchfix-repeat", type=int, default=1, help="runs of each tool in the comparison")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="speedfix-scan-bench-"))
    try:
        tree = (args.path or generated_tree(scratch / "tree", args.files)).resolve()
        shutil.rmtree(tree / ".speedfix_cache", ignore_errors=True)
        files, lines = count(tree)
        scan = [sys.executable, "-m", "speedfix", "scan", str(tree), "--no-summary"]
        timed([*scan, "--no-cache", "--jobs", "1"], 1, tree)  # untimed: writes the bytecode of every module
        startup = timed([sys.executable, "-c", "import speedfix.cli"], args.repeat, tree)
        runs = {
            "cold, 1 job": timed([*scan, "--no-cache", "--jobs", "1"], args.repeat, tree),
            f"cold, {args.jobs} jobs": timed([*scan, "--no-cache", "--jobs", str(args.jobs)], args.repeat, tree),
        }
        timed(scan, 1, tree)  # fill the cache
        runs["warm (cache)"] = timed(scan, args.repeat, tree)
        print(f"tree: {tree} ({files} files, {lines} lines)")
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
        print(f"interpreter + import start-up: {startup:.2f} s")
        for label, seconds in runs.items():
            print(f"{label:>14}: {seconds:6.2f} s  {files / seconds:7.0f} files/s  {lines / seconds:8.0f} lines/s")
        torchfix = torchfix_command(args.torchfix)
        if torchfix is None:
            print("TorchFix: not installed, no comparison (pass --torchfix PATH)")
            return
        for jobs in dict.fromkeys((1, args.jobs)):
            ours, theirs = side_by_side(scan, torchfix, tree, jobs, args.torchfix_repeat)
            for label, pick in (("best", min), ("median", statistics.median)):
                print(f"cold, {jobs} job{'s' if jobs > 1 else ''}, {label} of {len(ours)}: speedfix {pick(ours):.2f} s,"
                      f" TorchFix --select=ALL {pick(theirs):.2f} s: speedfix is {pick(theirs) / pick(ours):.1f}x faster")
        print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
