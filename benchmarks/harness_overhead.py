"""Harness overhead: each bundled script's throughput bare (its own clock) against ``speedfix bench``.

The harness must not change what it measures. For every suite workload and variant (the
original, speedfix's ``apply --unsafe-fixes`` output, the expert; eager on a CPU, compiled where
the script compiles on CUDA) this runs the script

* bare: ``python script.py ARGS`` with nothing added to its process; the figure is the script's
  own progress line, ``step N ... (X ms/step)``, printed every 50 steps after a host sync;
* under the harness: ``speedfix.bench.runner.run_once``, the code path of ``speedfix bench``;

and compares the mean step time over the same steps: the 50-step intervals of the bare log that
lie inside the harness's timed window. Runs alternate (harness first, then bare first; a bare run
goes on until the end of the window the harness picked, or the previous pair's). With
``--torch-logs`` both runs also log Dynamo's graph breaks and recompiles to files, and the table
counts them: a transparent harness adds none.

    python benchmarks/harness_overhead.py                 # tiny sizes on a CPU
    python benchmarks/harness_overhead.py --full --torch-logs --json overhead.json

Prints one row per run pair and the median ratio per variant; "ok" when it lies within 3%.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from speedfix.bench.runner import RunSpec, run_once
from speedfix.bench.settings import RunConfig
from speedfix.bench.suite import cuda_available, fixtures_dir, load_suite, write_speedfix_variant
from speedfix.fixes import fixer

LOG_EVERY = 50
STEP_LINE = re.compile(r"\bstep (\d+)\b.*\(([\d.]+) ms/step\)")
TOLERANCE = 0.03


def variants(workload, work: Path) -> dict[str, Path]:
    """original, speedfix (apply --unsafe-fixes output, as the suite makes it) and expert scripts."""
    original = work / workload.script
    found = {"original": original}
    fixed, _ = write_speedfix_variant(original, fixer)
    if fixed is not None:
        found["speedfix"] = fixed
    if workload.expert:
        found["expert"] = work / workload.expert
    return found


def bare_run(script: Path, args: list[str], cwd: Path, until_step: int, timeout_s: float,
             logs_out: Path | None) -> dict[int, float]:
    """Run the script with nothing added; return {step: ms/step of the 50 steps ending there}."""
    env = dict(os.environ)
    if logs_out:
        env.update(TORCH_LOGS="graph_breaks,recompiles", TORCH_LOGS_OUT=str(logs_out))
    proc = subprocess.Popen([sys.executable, str(script), *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    steps: dict[int, float] = {}

    def kill() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout_s, kill)  # holds even when the script falls silent
    timer.start()
    try:
        for line in proc.stdout:
            match = STEP_LINE.search(line)
            if match:
                steps[int(match.group(1))] = float(match.group(2))
                if int(match.group(1)) >= until_step:
                    break
    finally:
        timer.cancel()
        kill()
        proc.wait()
    return steps


def harness_run(script: Path, args: list[str], cwd: Path, warmup: int, steps: int, timeout_s: float,
                logs_out: Path | None) -> dict:
    saved = {k: os.environ.get(k) for k in ("TORCH_LOGS", "TORCH_LOGS_OUT")}
    if logs_out:
        os.environ.update(TORCH_LOGS="graph_breaks,recompiles", TORCH_LOGS_OUT=str(logs_out))
    try:
        # the fixtures are a throwaway copy: run in it, as the bare run does, not in a mirror of it
        return run_once(RunSpec(script, args, cwd, real_cwd=True),
                        RunConfig(warmup_steps=warmup, steps=steps, timeout_s=timeout_s)).to_json()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def intervals(ends: list[int], bare_ms: list[float], other_ms: list[float]) -> dict:
    return {"interval_ends": ends, "bare_intervals_ms": bare_ms, "harness_intervals_ms": other_ms,
            "bare_ms": statistics.fmean(bare_ms), "harness_ms": statistics.fmean(other_ms),
            "steps_compared": len(ends) * LOG_EVERY}


def same_steps(bare: dict[int, float], result: dict) -> dict | None:
    """ms/step bare and under the harness, per log interval inside the harness window."""
    start = (result.get("steps") or {}).get("warmup") or 0
    per_step = (result.get("timing") or {}).get("per_step_s") or []
    ends = [e for e in sorted(bare) if e - LOG_EVERY >= start and e <= start + len(per_step)]
    if not ends:
        return None
    # per_step[i] is the duration of step start + 1 + i
    harness = [1000 * sum(per_step[e - LOG_EVERY - start:e - start]) / LOG_EVERY for e in ends]
    return intervals(ends, [bare[e] for e in ends], harness)


def bare_vs_bare(first: dict[int, float], second: dict[int, float], start: int, end: int) -> dict | None:
    """The script's own run-to-run noise, measured the same way (--aa): the second bare run in
    the harness's place."""
    ends = [e for e in sorted(first) if e - LOG_EVERY >= start and e <= end and e in second]
    return intervals(ends, [first[e] for e in ends], [second[e] for e in ends]) if ends else None


def count_lines(path: Path, needle: str) -> int | None:
    try:
        return sum(needle in line for line in path.read_text(errors="replace").splitlines())
    except OSError:
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="real sizes (default: tiny unless CUDA is available)")
    parser.add_argument("--tiny", action="store_true", help="tiny CPU sizes")
    parser.add_argument("--workload", action="append", help="only this workload (repeatable)")
    parser.add_argument("--variant", action="append", choices=["original", "speedfix", "expert"],
                        help="only this variant (repeatable)")
    parser.add_argument("--warmup", type=int, default=50, help="harness warm-up steps (a minimum when compiling)")
    parser.add_argument("--steps", type=int, default=200, help="timed steps (a multiple of 50)")
    parser.add_argument("--repeats", type=int, default=1, help="pairs per variant (alternating order)")
    parser.add_argument("--timeout", type=float, default=300.0, help="per run, seconds")
    parser.add_argument("--torch-logs", action="store_true", help="count Dynamo graph breaks and recompiles")
    parser.add_argument("--aa", action="store_true",
                        help="bare against bare: the scripts' own run-to-run noise, measured the same way")
    parser.add_argument("--json", type=Path, help="write every figure as JSON")
    opts = parser.parse_args()
    full = opts.full or (cuda_available() and not opts.tiny)
    rows = []
    print(f"device: {'cuda' if cuda_available() else 'cpu'}; size: {'full' if full else 'tiny'}; "
          f"warm-up {opts.warmup}, window {opts.steps} steps; python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="speedfix-overhead-") as tmp:
        work = Path(tmp) / "fixtures"
        shutil.copytree(fixtures_dir(), work, ignore=shutil.ignore_patterns("__pycache__"))
        logs = Path(tmp) / "logs"
        logs.mkdir()
        for workload in load_suite(work):
            if opts.workload and workload.name not in opts.workload:
                continue
            args = list(workload.gpu_args if full else workload.tiny_args)
            for name, script in variants(workload, work).items():
                if opts.variant and name not in opts.variant:
                    continue
                last_window_end = opts.warmup + opts.steps + 100
                for repeat in range(opts.repeats):
                    tag = f"{workload.name}-{name}-{repeat}"
                    log_h = logs / f"{tag}-harness.log" if opts.torch_logs else None
                    log_b = logs / f"{tag}-bare.log" if opts.torch_logs else None
                    order = ["harness", "bare"] if repeat % 2 == 0 else ["bare", "harness"]
                    result, bare = None, {}
                    if opts.aa:
                        until = opts.warmup + opts.steps
                        first = bare_run(script, args, work, until, opts.timeout, log_h)
                        bare = bare_run(script, args, work, until, opts.timeout, log_b)
                        compared = bare_vs_bare(first, bare, opts.warmup, until)
                        row = {"workload": workload.name, "variant": name, "repeat": repeat, "aa": True,
                               **(compared or {})}
                        if compared:
                            row["ratio"] = row["bare_ms"] / row["harness_ms"]
                        rows.append(row)
                        print(f"{workload.name:15s} {name:9s} #{repeat} bare/bare ratio "
                              f"{row.get('ratio', float('nan')):.3f}", flush=True)
                        continue
                    for which in order:
                        if which == "harness":
                            result = harness_run(script, args, work, opts.warmup, opts.steps, opts.timeout, log_h)
                            window_end = ((result.get("steps") or {}).get("warmup") or 0) + opts.steps
                        else:
                            # far enough for the window the harness picked (the previous pair's
                            # when bare runs first: compilation settles at about the same step)
                            until = (window_end if result else last_window_end) + LOG_EVERY
                            bare = bare_run(script, args, work, until, opts.timeout, log_b)
                    last_window_end = window_end
                    row = {"workload": workload.name, "variant": name, "repeat": repeat, "order": order,
                           "status": result["status"], "message": result.get("message"),
                           "compile": result.get("compile"), "clock": result.get("clock"),
                           "harness_warmup": (result.get("steps") or {}).get("warmup"),
                           "samples_per_s": (result.get("data") or {}).get("samples_per_s"),
                           "harness_share": (result.get("timing") or {}).get("harness_share")}
                    compared = same_steps(bare, result) if result["status"] == "ok" else None
                    if compared:
                        row.update(compared, ratio=compared["bare_ms"] / compared["harness_ms"])  # harness / bare throughput
                    if opts.torch_logs:
                        row["graph_breaks"] = [count_lines(p, "Graph break") for p in (log_b, log_h)]
                        row["recompiles"] = [count_lines(p, "Recompiling") for p in (log_b, log_h)]
                    rows.append(row)
                    ratio = f"{row['ratio']:.3f}" if "ratio" in row else "-"
                    extra = (f" breaks bare/harness {row['graph_breaks']} recompiles {row['recompiles']}"
                             if opts.torch_logs else "")
                    compiled = (row["compile"] or {}).get("compilations") or 0
                    print(f"{workload.name:15s} {name:9s} #{repeat} {row['status']:8s} "
                          f"bare {row.get('bare_ms', float('nan')):8.3f} ms/step  harness "
                          f"{row.get('harness_ms', float('nan')):8.3f} ms/step  ratio {ratio}  "
                          f"compilations {compiled} ({(row['compile'] or {}).get('seconds') or 0:.1f} s)  "
                          f"warm-up {row['harness_warmup']}  harness's own share "
                          f"{100 * (row['harness_share'] or 0):.3f}%{extra}", flush=True)
    what = "second bare / first bare" if opts.aa else "harness/bare"
    print(f"\nmedian {what} throughput ratio per variant (ok: within 3%):")
    failed = 0
    for key in sorted({(r["workload"], r["variant"]) for r in rows}):
        ratios = [r["ratio"] for r in rows if (r["workload"], r["variant"]) == key and "ratio" in r]
        if not ratios:
            print(f"  {key[0]:15s} {key[1]:9s} no comparable run")
            failed += 1
            continue
        median = statistics.median(ratios)
        ok = abs(median - 1) <= TOLERANCE
        failed += not ok
        print(f"  {key[0]:15s} {key[1]:9s} {median:.3f} {'ok' if ok else 'OUTSIDE 3%'}  (pairs: {len(ratios)})")
    if opts.json:
        opts.json.write_text(json.dumps({"schema": "speedfix.harness_overhead/0.1", "full": full,
                                         "cuda": cuda_available(), "rows": rows}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
