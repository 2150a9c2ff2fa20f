"""One prepared GPU check: suite rows, ``apply --verify`` and the framework fixtures, within a deadline.

A GPU machine may be lent for 15 minutes, start-up included; this turns them into results. From a
checkout, with the wheels brought along in ``.whl/`` (see docs/benchmarks.md):

    pip install --no-index --find-links .whl libcst typer rich PyYAML
    python benchmarks/gpu_acceptance.py --out results/

Items, in this order unless ``--items`` says otherwise (the last two kinds on request only):

* ``verify-sd``: ``speedfix apply sd.py --verify --unsafe-fixes`` (the combination of the fixes
  first); its decisions and the time it took to reach them;
* ``suite-sd``, ``suite-cnn_classifier``: ``speedfix bench --suite`` rows with verdicts (original
  against ``apply --unsafe-fixes`` output against the expert version);
* ``pair-lightning_vae``, ``pair-hf_causal_lm``: ``speedfix bench ORIGINAL APPLY_OUTPUT``;
* ``facts-<script>``: one ``speedfix bench SCRIPT`` run: the settings the script ran with and the
  findings made of them on this device (``facts-sd_speedfix`` is sd.py's ``apply --unsafe-fixes``
  output; ``facts-json_loader`` a two-file project whose loader settings come from a JSON file);
* ``overhead-<workload>``: ``benchmarks/harness_overhead.py --torch-logs`` on the workload's
  ``apply --unsafe-fixes`` output (compiled on a GPU): its step time bare and under the harness,
  and Dynamo's graph breaks and recompiles in each.

Every item runs ``speedfix`` in a subprocess on a scratch copy of the fixtures. Before it starts,
its cost is planned (its runs times the cost of one run: ``--run-cost-s`` at first, then what the
finished items measured); an item that would not end before the deadline is skipped with a note,
and one still running at the deadline is stopped (SIGTERM, which speedfix turns into a clean stop
of its runs; SIGKILL if that takes too long). Nothing runs past ``--deadline-s``. After every item,
``acceptance.json`` and ``acceptance.md`` (device, torch, date, samples/s, speedup with interval,
share of the expert's gain, loss check, peak memory, verify decisions, wall time) are rewritten in
``--out``, beside each item's own JSON and log.

speedfix need not be installed: from a checkout, ``speedfix.rules`` and ``speedfix.fixtures``
(the top-level ``rules/`` and ``fixtures/`` folders, mapped by the wheel) are linked into a
temporary package folder that the items import. ``--tiny`` runs the same items at CPU sizes
(the tests run it with a short deadline).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STOP_GRACE_S = 15.0  # SIGTERM to SIGKILL: speedfix stops its run and removes its folders
MARGIN_S = 3.0  # writing the reports at the end
SEED_BAND_RUNS = 2
PROBE = ("import json, torch; cuda = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, "
         "'cuda': torch.version.cuda, 'device': torch.cuda.get_device_name(0) if cuda else 'cpu'}))")


def probe_device(env: dict) -> dict:
    """The device and torch the items run on, from a fresh process (this one never imports torch)."""
    probe_run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env)
    return json.loads(probe_run.stdout) if probe_run.returncode == 0 else {"device": "?", "torch": "?"}


@dataclass(frozen=True)
class Item:
    name: str
    kind: str  # suite | verify | pair | facts | overhead
    fixture: str  # the workload (suite, overhead) or the script's stem
    candidates: int  # variants measured against the original

    def runs(self, pairs: int) -> int:
        """Calibration of every variant, the pairs, the loss check's seed band (one run for
        ``facts``; a bare and a harness run for ``overhead``)."""
        if self.kind in ("facts", "overhead"):
            return 1 + self.candidates
        variants = 1 + self.candidates
        return variants + pairs * variants + SEED_BAND_RUNS


ITEMS = {item.name: item for item in (
    Item("verify-sd", "verify", "sd", 1),
    Item("suite-sd", "suite", "sd", 2),
    Item("suite-cnn_classifier", "suite", "cnn_classifier", 2),
    Item("pair-lightning_vae", "pair", "lightning_vae", 1),
    Item("pair-hf_causal_lm", "pair", "hf_causal_lm", 1),
    *(Item(f"facts-{stem}", "facts", stem, 0) for stem in
      ("sd", "cnn_classifier", "lightning_vae", "hf_causal_lm", "json_loader", "sd_speedfix",
       "cnn_classifier_speedfix", "lightning_vae_speedfix", "hf_causal_lm_speedfix")),
    Item("overhead-sd", "overhead", "sd", 1),
    Item("overhead-cnn_classifier", "overhead", "cnn_classifier", 1),
)}
DEFAULT_ITEMS = [name for name, item in ITEMS.items() if item.kind in ("verify", "suite", "pair")]

# facts-json_loader: the loader's settings come from a JSON file, which a scan does not read
JSON_LOADER = {
    "data.py": """\
import json

import torch
from torch.utils.data import DataLoader, Dataset


class Features(Dataset):
    def __len__(self):
        return 8192

    def __getitem__(self, i):
        x = torch.full((256,), float(i % 13) / 13)
        return x, x.mean(0, keepdim=True)


def make_loader(path):
    with open(path) as f:
        cfg = json.load(f)
    return DataLoader(Features(), shuffle=True, **cfg)
""",
    "train.py": """\
import torch

from data import make_loader

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
loader = make_loader("loader.json")
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for epoch in range(1000):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
""",
    "loader.json": '{"batch_size": 64, "num_workers": 0, "pin_memory": false}\n',
}
PROJECTS = {"json_loader": JSON_LOADER}


@dataclass
class Outcome:
    """One item's line in acceptance.json."""

    item: str
    status: str = "skipped"  # done | failed | stopped at the deadline | skipped
    note: str = ""
    command: list[str] = field(default_factory=list)
    planned_s: float | None = None
    wall_s: float | None = None
    exit_code: int | None = None
    figures: dict = field(default_factory=dict)


# ---------------------------------------------------------------- speedfix from a checkout
def import_path(scratch: Path) -> list[str]:
    """``sys.path`` entries under which ``speedfix.rules`` and ``speedfix.fixtures`` import: none
    where speedfix is installed (a wheel, or ``pip install -e``); else a folder whose ``speedfix/``
    links the checkout's package, with ``rules/`` and ``fixtures/`` inside it as the wheel puts them."""
    check = [sys.executable, "-c", "import speedfix.rules, speedfix.bench.suite as s; s.fixtures_dir()"]
    if subprocess.run(check, capture_output=True, cwd=scratch).returncode == 0:
        return []
    package = scratch / "importable" / "speedfix"
    package.mkdir(parents=True)
    for entry in (ROOT / "speedfix").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    (package / "rules").symlink_to(ROOT / "rules")
    (package / "fixtures").symlink_to(ROOT / "fixtures")
    return [str(package.parent)]


# ---------------------------------------------------------------- one item
def command(item: Item, work: Path, out_json: Path, opts: argparse.Namespace, budget_s: float,
            script_args: list[str]) -> list[str]:
    """The speedfix command line of one item."""
    pairs = ["--max-pairs", str(opts.pairs), "--min-pairs", str(opts.pairs)]
    speedfix = [sys.executable, "-m", "speedfix"]
    budget = ["--budget-s", f"{max(30.0, budget_s):.0f}"]
    timing = [*(["--warmup-s", str(opts.warmup_s)] if opts.warmup_s is not None else []),
              *(["--window-s", str(opts.window_s)] if opts.window_s is not None else [])]
    if item.kind == "suite":
        return [*speedfix, "bench", "--suite", "--workload", item.fixture, "--tiny" if opts.tiny else "--full",
                *pairs, *budget, *timing, "--timeout-s", str(opts.timeout_s), "--json", str(out_json)]
    if item.kind == "overhead":
        return [sys.executable, str(ROOT / "benchmarks" / "harness_overhead.py"), "--tiny" if opts.tiny else "--full",
                "--torch-logs", "--workload", item.fixture, "--variant", "speedfix", "--timeout", str(opts.timeout_s),
                "--json", str(out_json)]
    if item.kind == "facts":
        script = work / item.fixture / "train.py" if item.fixture in PROJECTS else work / f"{item.fixture}.py"
        return [*speedfix, "bench", str(script), *timing, "--timeout-s", str(opts.timeout_s), "--cwd",
                str(script.parent), "--json", str(out_json), "--", *script_args]
    script = work / f"{item.fixture}.py"
    if item.kind == "verify":
        return [*speedfix, "apply", str(script), "--verify", "--unsafe-fixes", "--max-pairs", str(opts.pairs),
                *budget, "--", *script_args]
    patched = work / f"{item.fixture}_speedfix.py"
    return [*speedfix, "bench", str(script), str(patched), *pairs, *budget, *timing, "--timeout-s",
            str(opts.timeout_s), "--json", str(out_json), "--", *script_args]


def run_command(cmd: list[str], *, cwd: Path, env: dict, log: Path, timeout_s: float) -> tuple[int | None, bool]:
    """Run one item; stop it at ``timeout_s``. Returns (exit code, stopped)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            return proc.wait(timeout=max(0.0, timeout_s)), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)  # speedfix stops its current run and cleans up
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return None, True


def figures(item: Item, data: dict, probe: dict) -> dict:
    """The row of one finished item, from its JSON (a suite result, a comparison or a verify report)."""
    from speedfix.bench.report import fmt_bytes, fmt_pct, fmt_rate, fmt_speedup
    from speedfix.bench.results import Comparison, SuiteResult, VerifyReport

    def text(check) -> str:
        return "-" if not check else ("ok: " if check.passed else "FAIL: ") + check.level

    row: dict = {"device": probe.get("device", "?"), "torch": probe.get("torch", "?")}
    if item.kind == "facts":
        return {**row, **run_facts(data)}
    if item.kind == "overhead":
        return {**row, **overhead(data)}
    if item.kind == "suite":
        (workload,) = SuiteResult.from_json(data).workloads or [None]
        if workload is None or workload.error:
            return {**row, "error": workload.error if workload else "no workload in the result"}
        speed = workload.speedup
        return {**row, "pairs": workload.pairs, "metric": workload.metric, "before": fmt_rate(workload.before), "after": fmt_rate(workload.after),
                "speedup": fmt_speedup(speed), "verdict": speed.verdict if speed else "-",
                "expert": fmt_speedup(workload.expert_speedup), "expert_share": fmt_pct(workload.captured),
                "loss_check": workload.loss_check,
                "peak_memory": f"{fmt_bytes(workload.peak_before)} -> {fmt_bytes(workload.peak_after)}"}
    if item.kind == "pair":
        outcome = Comparison.from_json(data)
        cand = outcome.candidates[0]
        metric = cand.metric or "samples_per_s"
        peak = cand.memory
        return {**row, "pairs": outcome.pairs, "metric": metric, "before": fmt_rate(outcome.original_runs.rate(metric)),
                "after": fmt_rate(cand.runs.rate(metric)), "speedup": fmt_speedup(cand.speedup),
                "verdict": cand.speedup.verdict if cand.speedup else f"- ({cand.status})",
                "loss_check": text(cand.numerics),
                "peak_memory": f"{fmt_bytes(peak.peak_a_bytes)} -> {fmt_bytes(peak.peak_b_bytes)}" if peak else "-"}
    report = VerifyReport.from_json(data)
    first = report.combinations[0] if report.combinations else None
    speed, peak = (first.speedup, first.memory) if first else (None, None)
    rates = sorted(run[first.metric] for run in data.get("comparison", {}).get("runs", [])
                   if first and first.metric and run.get("label") == first.label and run.get(first.metric))
    return {**row, "metric": first.metric if first else None,
            "before": fmt_rate(report.comparison.original_runs.rate(first.metric)) if first and first.metric else "-",
            "after": fmt_rate(statistics.median(rates)) if rates else "-",
            "speedup": fmt_speedup(speed), "verdict": speed.verdict if speed else "-",
            "loss_check": text(first.numerics) if first else "-",
            "peak_memory": f"{fmt_bytes(peak.peak_a_bytes)} -> {fmt_bytes(peak.peak_b_bytes)}" if peak else "-",
            "verify": report.summary, "sets_measured": [c.label for c in report.combinations]}


def run_facts(data: dict) -> dict:
    """One ``speedfix bench`` run: its rate, the run-time findings and the facts they come from."""
    from speedfix.bench.report import fmt_rate

    runtime = data.get("runtime") or {}
    rate = (data.get("data") or {}).get("samples_per_s")
    metric = "samples/s" if rate else "steps/s"
    rate = rate or (data.get("timing") or {}).get("steps_per_s")
    found = [f"{f['code']} {Path(f['file']).name if f.get('file') else '-'}"
             f"{':' + str(f['line']) if f.get('line') else ''} ({'confirmed' if f.get('static') else 'run time only'})"
             for f in runtime.get("findings") or []]
    facts = []
    for loader in runtime.get("loaders") or []:
        facts.append(f"DataLoader {Path(loader.get('file') or '-').name}:{loader.get('line')}"
                     f"{' (training)' if loader.get('trained_on') else ''} workers={loader.get('num_workers')} "
                     f"pin={loader.get('pin_memory')} persistent={loader.get('persistent_workers')} "
                     f"batch={loader.get('batch_size')}")
    for opt in runtime.get("optimizers") or []:
        facts.append(f"{opt.get('type', '?').rsplit('.', 1)[-1]} {Path(opt.get('file') or '-').name}:{opt.get('line')} "
                     f"fused={opt.get('fused')} foreach={opt.get('foreach')} on {opt.get('param_device')}")
    autocast = runtime.get("autocast") or {}
    facts.append("autocast " + ("not seen" if "autocast" in runtime and not autocast
                                else autocast.get("dtype") if autocast.get("enabled") else "off"))
    facts.append(f"compiled {len(runtime.get('compiled') or [])}")
    flags = runtime.get("flags") or {}
    if flags:
        facts.append(f"matmul {flags.get('float32_matmul_precision')}, cudnn.benchmark {flags.get('cudnn_benchmark')}")
    facts.extend(f"{name}: {', '.join(f'{k}={v}' for k, v in sorted(values.items()))}"
                 for name, values in sorted((runtime.get("frameworks") or {}).items()))
    return {"verdict": data.get("status"), "metric": metric, "after": fmt_rate(rate),
            "runtime": "; ".join(found) or "none", "facts": "; ".join(facts),
            "errors": "; ".join(runtime.get("errors") or []) or None}


def overhead(data: dict) -> dict:
    """harness_overhead.py's rows: step time under the harness against bare, graph breaks, recompiles."""
    rows = data.get("rows") or []
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    return {"verdict": ", ".join(r.get("status") or "-" for r in rows),
            "overhead": "; ".join(f"harness/bare throughput {r['ratio']:.3f}" if "ratio" in r else "no comparable steps"
                                  for r in rows) or "no run",
            **{key: "; ".join("bare {}, harness {}".format(*(r.get(key) or [None, None])) for r in rows)
               for key in ("graph_breaks", "recompiles")},
            "ratio": statistics.median(ratios) if ratios else None}


# ---------------------------------------------------------------- reports
COLUMNS = [("item", "item"), ("status", "status"), ("device", "device"), ("torch", "torch"),
           ("metric", "metric"), ("before", "before"), ("after", "after (speedfix)"),
           ("speedup", "speedup [95% CI]"), ("verdict", "verdict"), ("expert", "expert speedup"),
           ("expert_share", "share of the expert's gain"), ("loss_check", "loss check"),
           ("peak_memory", "peak memory"), ("verify", "verify decisions"), ("runtime", "found at run time"),
           ("facts", "run-time facts"), ("overhead", "harness overhead"), ("graph_breaks", "graph breaks"),
           ("recompiles", "recompiles"), ("wall", "wall time"), ("note", "note")]


def markdown(report: dict) -> str:
    from speedfix.bench.timeplan import fmt_duration

    head = [f"# GPU acceptance: {report['date']}", "",
            f"- device: {report['device'].get('device', '?')} (CUDA {report['device'].get('cuda')}), "
            f"torch {report['device'].get('torch', '?')}, python {report['python']}",
            f"- speedfix: {report['speedfix']}; sizes: {'--tiny' if report['tiny'] else '--full'}; "
            f"{report['pairs']} pairs per comparison",
            f"- deadline {fmt_duration(report['deadline_s'])}; took {fmt_duration(report['wall_s'])}", "",
            "| " + " | ".join(title for _, title in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for outcome in report["items"]:
        cells = {"item": outcome["item"], "status": outcome["status"], "note": outcome["note"],
                 "wall": fmt_duration(outcome["wall_s"]) if outcome["wall_s"] is not None else "-",
                 **outcome["figures"]}
        head.append("| " + " | ".join(str(cells.get(key) or "-").replace("|", "/") for key, _ in COLUMNS) + " |")
    return "\n".join(head) + "\n"


def write_reports(out: Path, report: dict) -> None:
    (out / "acceptance.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "acceptance.md").write_text(markdown(report))


def speedfix_version() -> str:
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    from speedfix import __version__

    return f"{__version__} ({commit})" if commit else __version__


# ---------------------------------------------------------------- main
def main(argv: list[str] | None = None, run=run_command, probe_with=probe_device) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for acceptance.json/.md and each item's files")
    parser.add_argument("--deadline-s", type=float, default=540.0, help="nothing runs past this (seconds)")
    parser.add_argument("--tiny", action="store_true", help="CPU sizes (a logic check on a machine without a GPU)")
    parser.add_argument("--items", default=",".join(DEFAULT_ITEMS),
                        help=f"comma-separated, in order (default: {', '.join(DEFAULT_ITEMS)}; also: "
                             f"{', '.join(name for name in ITEMS if name not in DEFAULT_ITEMS)})")
    parser.add_argument("--pairs", type=int, default=6, help="pairs per comparison (6: the fewest with a verdict)")
    parser.add_argument("--run-cost-s", type=float, default=None,
                        help="expected seconds per run before one was measured (default: 25, --tiny 6)")
    parser.add_argument("--timeout-s", type=float, default=180.0, help="per-run limit for the bench items")
    parser.add_argument("--warmup-s", type=float, default=None, help="bench items: --warmup-s (default: speedfix's)")
    parser.add_argument("--window-s", type=float, default=None, help="bench items: --window-s (default: speedfix's)")
    opts = parser.parse_args(argv)
    started = time.monotonic()
    deadline = started + opts.deadline_s
    names = [n.strip() for n in opts.items.split(",") if n.strip()]
    unknown = [n for n in names if n not in ITEMS]
    if unknown:
        parser.error(f"unknown item(s) {', '.join(unknown)}; known: {', '.join(ITEMS)}")
    out = opts.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="speedfix-acceptance-"))
    try:
        extra = import_path(scratch)
        sys.path[:0] = extra
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([*extra, *filter(None, [os.environ.get("PYTHONPATH")])])}
        from speedfix.bench.suite import fixtures_dir, load_suite, write_speedfix_variant
        from speedfix.bench.verify import load_fixer

        work = scratch / "fixtures"
        shutil.copytree(fixtures_dir(), work, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        suite_args = {w.name: (w.tiny_args if opts.tiny else w.gpu_args) for w in load_suite(work)}
        probe = probe_with(env)
        report = {"date": _dt.datetime.now().isoformat(timespec="seconds"), "device": probe,
                  "python": sys.version.split()[0], "speedfix": speedfix_version(), "tiny": opts.tiny,
                  "pairs": opts.pairs, "deadline_s": opts.deadline_s, "wall_s": 0.0, "items": []}
        cost = opts.run_cost_s if opts.run_cost_s is not None else (6.0 if opts.tiny else 25.0)
        fixer = None
        for name in names:
            item = ITEMS[name]
            outcome = Outcome(item.name)
            planned = item.runs(opts.pairs) * cost
            left = deadline - time.monotonic() - STOP_GRACE_S - MARGIN_S
            outcome.planned_s = round(planned, 1)
            if planned > left:
                outcome.note = (f"not started: planned {item.runs(opts.pairs)} runs x {cost:.1f} s = {planned:.0f} s, "
                                f"{max(0.0, left):.0f} s left before the deadline")
            else:
                base = item.fixture.removesuffix("_speedfix")
                script_args = [] if base in PROJECTS else list(suite_args.get(base) or (["--tiny"] if opts.tiny else []))
                if item.kind == "pair" or item.fixture != base:
                    fixer = fixer or load_fixer()
                    write_speedfix_variant(work / f"{base}.py", fixer)
                for name, text in PROJECTS.get(base, {}).items():
                    (work / base).mkdir(exist_ok=True)
                    (work / base / name).write_text(text)
                out_json = out / f"{item.name}.json"
                out_json.unlink(missing_ok=True)  # never a previous invocation's figures
                outcome.command = command(item, work, out_json, opts, left - 3 * cost, script_args)
                t0 = time.monotonic()
                code, stopped = run(outcome.command, cwd=work, env=env, log=out / f"{item.name}.log", timeout_s=left)
                outcome.wall_s = round(time.monotonic() - t0, 1)
                outcome.exit_code = code
                if item.kind == "verify":  # the report is written beside the script
                    for suffix in ("json", "md"):
                        made = work / f"{item.fixture}.speedfix-verify.{suffix}"
                        if made.exists():
                            shutil.copyfile(made, out / f"{item.name}.{suffix}")
                if stopped:
                    outcome.status = "stopped at the deadline"
                    outcome.note = f"stopped after {outcome.wall_s:.0f} s, planned {planned:.0f} s"
                elif code in (0, 1) and out_json.exists():
                    outcome.status = "done"
                    outcome.figures = figures(item, json.loads(out_json.read_text()), probe)
                    pairs = outcome.figures.get("pairs")
                    if pairs is not None and pairs < opts.pairs:  # the comparison's budget ended it in time
                        outcome.note = f"{pairs} of {opts.pairs} pairs: its budget ran out before a verdict"
                    cost = outcome.wall_s / item.runs(opts.pairs)  # what a run costs on this machine
                else:
                    outcome.status = "failed"
                    outcome.note = f"exit code {code}; see {item.name}.log"
            report["items"].append(asdict(outcome))
            report["wall_s"] = round(time.monotonic() - started, 1)
            write_reports(out, report)
        print((out / "acceptance.md").read_text())
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
