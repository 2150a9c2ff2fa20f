"""benchmarks/gpu_acceptance.py: items planned against the deadline, run, stopped or skipped with a
note, and the JSON/Markdown written, on a CPU with --tiny."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_acceptance.py"


def load():
    spec = importlib.util.spec_from_file_location("gpu_acceptance", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def fake_probe(env: dict) -> dict:
    return {"torch": "2.x", "cuda": None, "device": "cpu"}  # the real probe runs in the command-line test


SPEED = {"pairs": 6, "median": 1.5, "ci95_median": [1.4, 1.6], "verdict": "faster", "per_pair": [1.5] * 6}
EXPERT = {"pairs": 6, "median": 1.6, "ci95_median": [1.55, 1.7], "verdict": "faster", "per_pair": [1.6] * 6}


def fake_item(cmd: list[str], *, cwd: Path, env: dict, log: Path, timeout_s: float):
    """Stands in for the speedfix subprocess: writes what each kind of item writes."""
    log.write_text("fake\n")
    if "--suite" in cmd:
        workload = cmd[cmd.index("--workload") + 1]
        # cnn_classifier's budget ran out after 3 pairs: figures without an interval
        pairs = 3 if workload == "cnn_classifier" else 6
        speed = {**SPEED, "pairs": pairs, "ci95_median": [0.0, None], "verdict": "inconclusive",
                 "per_pair": [1.5] * pairs} if pairs < 6 else SPEED
        Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps({"workloads": [{
            "name": workload, "metric": "samples_per_s", "pairs": pairs, "before": 1000.0, "after": 1500.0,
            "speedup": speed, "expert": 1600.0, "expert_speedup": EXPERT, "captured": 0.83,
            "loss_check": "ok: within seed band", "peak_before": 2.0 * 2**30, "peak_after": 1.5 * 2**30}]}))
        return 1, False
    if "--verify" in cmd:
        script = Path(cmd[cmd.index("apply") + 1])
        script.with_name(f"{script.stem}.speedfix-verify.json").write_text(json.dumps({
            "summary": "kept 2 of 2 fixes (SF304, SF402); written to the script",
            "comparison": {"original_runs": {"samples_per_s": 1000.0}},
            "combinations": [{"label": "SF304+SF402", "decision": "kept", "kept": True, "metric": "samples_per_s",
                              "speedup": SPEED, "codes": ["SF304", "SF402"],
                              "numerics": {"kind": "exact", "level": "identical", "passed": True, "reason": ""}}]}))
        return 0, False
    if "lightning_vae.py" in " ".join(cmd):
        return None, True  # still running at the deadline
    return 2, False  # hf_causal_lm: the original could not be benchmarked


def test_items_are_planned_run_stopped_or_skipped_and_reported(tmp_path):
    acceptance = load()
    out = tmp_path / "results"
    items = "suite-sd,verify-sd,suite-cnn_classifier,pair-lightning_vae,pair-hf_causal_lm"
    # 30 s a run: suite-sd (23 runs) does not fit in 600 s; verify-sd (16) does, and is measured at
    # about 0 s a run (the fake), after which everything fits
    assert acceptance.main(["--tiny", "--out", str(out), "--items", items, "--deadline-s", "600",
                            "--run-cost-s", "30"], run=fake_item,
                           probe_with=fake_probe) == 0
    report = json.loads((out / "acceptance.json").read_text())
    status = {i["item"]: i["status"] for i in report["items"]}
    assert status == {"suite-sd": "skipped", "verify-sd": "done", "suite-cnn_classifier": "done",
                      "pair-lightning_vae": "stopped at the deadline", "pair-hf_causal_lm": "failed"}
    notes = {i["item"]: i["note"] for i in report["items"]}
    assert notes["suite-sd"].startswith("not started: planned 23 runs x 30.0 s = 690 s")
    assert notes["pair-lightning_vae"].startswith("stopped after") and "pair-hf_causal_lm.log" in notes["pair-hf_causal_lm"]
    cnn = next(i for i in report["items"] if i["item"] == "suite-cnn_classifier")
    assert cnn["figures"]["speedup"] == "1.50x (no interval: 3 pairs)" and cnn["figures"]["expert_share"] == "83.0%"
    assert cnn["note"] == "3 of 6 pairs: its budget ran out before a verdict"
    assert cnn["figures"]["peak_memory"] == "2.0 GiB -> 1.5 GiB" and "--tiny" in cnn["command"]
    verify = next(i for i in report["items"] if i["item"] == "verify-sd")
    assert verify["figures"]["verify"].startswith("kept 2 of 2 fixes") and verify["figures"]["verdict"] == "faster"
    assert (out / "verify-sd.json").exists()  # copied from beside the script
    table = (out / "acceptance.md").read_text()
    assert "| suite-cnn_classifier | done |" in table and "| suite-sd | skipped |" in table
    assert "share of the expert's gain" in table and "verify decisions" in table


def test_a_real_run_from_the_command_line_stops_at_its_deadline(tmp_path):
    import torch  # the version the probe reports (the test process imports it only here)

    # the real subprocesses on a CPU: the first item is stopped at the deadline (or skipped, if the
    # machine is so busy that no time was left), the second is skipped; both reports are written
    out = tmp_path / "results"
    result = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--out", str(out), "--deadline-s", "25",
                             "--run-cost-s", "0.1", "--items", "verify-sd,suite-sd"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "acceptance.json").read_text())
    assert report["device"] == {"torch": torch.__version__, "cuda": torch.version.cuda, "device": "cpu"}
    first, second = report["items"]
    assert first["status"] in ("stopped at the deadline", "skipped") and first["note"]
    assert second["status"] == "skipped" and "before the deadline" in second["note"]
    assert "| verify-sd |" in (out / "acceptance.md").read_text()


def fake_facts(cmd: list[str], *, cwd: Path, env: dict, log: Path, timeout_s: float):
    """A ``speedfix bench SCRIPT`` run and a harness_overhead.py run, as their JSON reads."""
    log.write_text("fake\n")
    out = Path(cmd[cmd.index("--json") + 1])
    if "harness_overhead.py" in cmd[1]:
        out.write_text(json.dumps({"rows": [{"status": "ok", "ratio": 0.98, "graph_breaks": [0, 0],
                                             "recompiles": [0, 1]}]}))
        return 0, False
    script = Path(cmd[cmd.index("bench") + 1])
    assert script.is_file() and Path(cmd[cmd.index("--cwd") + 1]) == script.parent
    finding = {"code": "SF101", "file": str(script.with_name("data.py")), "line": 19, "static": False}
    out.write_text(json.dumps({"status": "ok", "data": {"samples_per_s": 2400.0}, "runtime": {
        "findings": [finding] if script.name == "train.py" else [], "autocast": None,
        "loaders": [{"file": str(script), "line": 7, "trained_on": True, "num_workers": 0, "pin_memory": False}]}}))
    return 0, False


def test_facts_and_overhead_items_report_what_the_run_found_and_what_the_harness_added(tmp_path):
    acceptance = load()
    out = tmp_path / "results"
    assert acceptance.main(["--tiny", "--out", str(out), "--items", "overhead-sd,facts-json_loader,facts-sd_speedfix",
                            "--deadline-s", "600", "--run-cost-s", "1"], run=fake_facts,
                           probe_with=fake_probe) == 0
    items = {i["item"]: i for i in json.loads((out / "acceptance.json").read_text())["items"]}
    assert {name: i["status"] for name, i in items.items()} == dict.fromkeys(items, "done")
    loader = items["facts-json_loader"]
    assert loader["figures"]["runtime"] == "SF101 data.py:19 (run time only)"
    assert loader["command"][-1] == "--" and "--tiny" not in loader["command"]  # the project takes no arguments
    assert "autocast not seen" in items["facts-sd_speedfix"]["figures"]["facts"]  # a compiled model's training calls
    assert items["facts-sd_speedfix"]["command"][-1] == "--tiny"  # sd.py's arguments
    overhead = items["overhead-sd"]["figures"]
    assert (overhead["overhead"], overhead["recompiles"]) == ("harness/bare throughput 0.980", "bare 0, harness 1")
    assert items["overhead-sd"]["planned_s"] == 2.0  # a bare and a harness run at 1 s (the first item)
    assert "| facts-json_loader | done |" in (out / "acceptance.md").read_text()
