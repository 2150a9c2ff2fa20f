"""A/A: every bundled workload against a byte-identical copy of itself, repeated.

An identical script must never be called "faster" or "slower". This runs the comparison that
``speedfix bench A.py A_copy.py`` runs (the same Session, interval and verdict), ``--repeats``
times per workload, and prints each verdict and the false-verdict rate. The interval is
distribution-free (``speedfix.bench.stats``): with n pairs, the chance that an A/A comparison
gets a verdict is at most 2 / 2**n whatever the noise (3.1% at the default 6 pairs).

    python benchmarks/aa_false_verdicts.py                  # tiny sizes, 3 repeats per workload
    python benchmarks/aa_false_verdicts.py --repeats 10 --json aa.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from speedfix.bench.compare import Session
from speedfix.bench.runner import RunSpec
from speedfix.bench.settings import CompareSettings
from speedfix.bench.stats import FASTER, MIN_VERDICT_PAIRS, SLOWER
from speedfix.bench.suite import cuda_available, fixtures_dir, load_suite


def bound(pairs: int) -> float:
    """At most this share of A/A comparisons gets a verdict: [min, max] up to 8 pairs, 95% after."""
    return 2 / 2**pairs if pairs <= 8 else 0.05


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="A/A comparisons per workload")
    parser.add_argument("--pairs", type=int, default=MIN_VERDICT_PAIRS, help="pairs per comparison")
    parser.add_argument("--warmup", type=int, default=10, help="warm-up steps")
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--calibrate", action="store_true",
                        help="size the window by calibration runs, as bench A.py B.py does by default, instead of "
                             "--warmup/--steps")
    parser.add_argument("--full", action="store_true", help="real sizes (for a GPU)")
    parser.add_argument("--workload", action="append", help="only this workload (repeatable)")
    parser.add_argument("--json", type=Path, help="write every comparison's figures as JSON")
    opts = parser.parse_args()
    fixed = not opts.calibrate
    settings = CompareSettings(warmup=opts.warmup if fixed else None, steps=opts.steps if fixed else None,
                               max_pairs=opts.pairs, min_pairs=opts.pairs, budget_s=3600.0, seed_band_runs=0)
    window = f"warm-up {opts.warmup}, window {opts.steps} steps" if fixed else (
        f"calibrated window (the slower variant's {settings.warmup_s:g} s warm-up and {settings.window_s:g} s window)")
    print(f"device: {'cuda' if cuda_available() else 'cpu'}; {opts.pairs} pairs per comparison, {window}")
    rows, false = [], 0
    with tempfile.TemporaryDirectory(prefix="speedfix-aa-") as tmp:
        work = Path(tmp)
        shutil.copytree(fixtures_dir(), work, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        for workload in load_suite(work):
            if opts.workload and workload.name not in opts.workload:
                continue
            original = work / workload.script
            copy = original.with_name(f"{original.stem}_copy.py")
            shutil.copyfile(original, copy)
            args = list(workload.gpu_args if opts.full else workload.tiny_args)
            for repeat in range(opts.repeats):
                session = Session(RunSpec(original, args, work, label="A", real_cwd=True), settings)
                outcome = session.compare([RunSpec(copy, args, work, label="A copy", real_cwd=True)]).to_json()
                speed = outcome["candidates"][0].get("speedup") or {}
                verdict = speed.get("verdict", "no measurement")
                false += verdict in (FASTER, SLOWER)
                lo, hi = speed.get("ci95_median") or (None, None)
                rows.append({"workload": workload.name, "repeat": repeat, "verdict": verdict,
                             "median": speed.get("median"), "interval": [lo, hi], "per_pair": speed.get("per_pair")})
                pairs = ", ".join(f"{r:.3f}" for r in speed.get("per_pair") or [])
                print(f"{workload.name:15s} #{repeat}  {speed.get('median', float('nan')):.3f}x "
                      f"[{lo or 0:.3f}, {hi or 0:.3f}]  {verdict:22s} pairs: {pairs}", flush=True)
    rate = false / len(rows) if rows else 0.0
    print(f"\nfalse verdicts (faster or slower for an identical script): {false} of {len(rows)} ({rate:.1%}); "
          f"the bound for {opts.pairs} pairs is {bound(opts.pairs):.1%} per comparison")
    if opts.json:
        opts.json.write_text(json.dumps({"schema": "speedfix.aa/0.1", "rows": rows, "false": false}, indent=1))
    return 1 if false else 0


if __name__ == "__main__":
    sys.exit(main())
