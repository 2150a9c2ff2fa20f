"""Run-time facts: what a measured script configured, and the findings `speedfix bench` makes of them."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from speedfix.bench import advice
from speedfix.bench.results import RunResult, RuntimeFinding
from speedfix.bench.runner import RunSpec, run_once

from .test_bench_results import NO_STEPS, same_json

# The loader's settings come from a JSON file: a scan sees only `DataLoader(..., **cfg)`.
DATA_PY = """\
import json
import torch
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        x = torch.full((8,), float(i % 7))
        return x, x.sum(0, keepdim=True)


def make_loader(path):
    with open(path) as f:
        cfg = json.load(f)
    return DataLoader(Squares(), shuffle=True, **cfg)
"""
LOADER_LINE = 18

# epochs over `loader` (both scripts below train a Linear(8, 1) with `opt`)
LOADER_LOOP = """\
for epoch in range(1000):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

TRAIN_PY = """\
import torch
from data import make_loader

loader = make_loader("loader.json")
model = torch.nn.Linear(8, 1)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
""" + LOADER_LOOP


def _json_config_project(write_script, tmp_path):
    project = tmp_path / "project"
    write_script("data.py", DATA_PY, project)
    (project / "loader.json").write_text(json.dumps({"batch_size": 16, "num_workers": 0, "pin_memory": False}))
    return write_script("train.py", TRAIN_PY, project)


def test_bench_reports_a_loader_configured_in_json_its_line_and_sf101(write_script, tmp_path):
    from speedfix.bench.cli import CONTEXT_SETTINGS, bench
    import typer

    script = _json_config_project(write_script, tmp_path)
    app = typer.Typer()
    app.command("bench", context_settings=CONTEXT_SETTINGS)(bench)
    app.callback()(lambda: None)
    out = tmp_path / "result.json"
    cli = CliRunner().invoke(app, ["bench", str(script), "--warmup", "3", "--steps", "10", "--timeout-s", "60",
                                   "--cwd", str(script.parent), "--json", str(out)], obj={"script_args": []})
    assert cli.exit_code == 0, cli.output
    data = json.loads(out.read_text())
    loader = data["runtime"]["loaders"][0]
    assert loader["file"] == str(script.parent / "data.py") and loader["line"] == LOADER_LINE
    assert (loader["num_workers"], loader["pin_memory"], loader["batch_size"], loader["trained_on"]) == (0, False, 16, True)
    [finding] = [f for f in data["runtime"]["findings"] if f["code"] == "SF101"]
    assert (finding["file"], finding["line"], finding["device"]) == (loader["file"], LOADER_LINE, "cpu")
    assert finding["static"] is False  # a scan of data.py cannot know the JSON's num_workers
    assert f"made at data.py:{LOADER_LINE} runs with 0 workers" in finding["message"]
    assert json.dumps(RunResult.from_json(data).to_json()) == json.dumps(data)  # the public format reads back
    text = " ".join(cli.output.split())
    assert "found at run time" in text and f"SF101 dataloader-no-workers data.py:{LOADER_LINE}" in text
    assert f"data.py:{LOADER_LINE} (training): num_workers=0, pin_memory=False" in text


FACTS_SCRIPT = """\
import torch

torch.set_float32_matmul_precision("high")
torch.backends.cudnn.benchmark = True
model = torch.nn.Sequential(torch.nn.Conv1d(4, 4, 3), torch.nn.Flatten(), torch.nn.Linear(24, 1))
compiled = torch.compile(model, backend="eager")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
x, y = torch.randn(16, 4, 8), torch.randn(16, 1)
for step in range(100_000):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = compiled(x)
    loss = torch.nn.functional.mse_loss(out.float(), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_optimizer_autocast_flags_and_compile_are_recorded(write_script, quick_config):
    script = write_script("facts.py", FACTS_SCRIPT)
    result = run_once(RunSpec(script, [], script.parent), quick_config(timeout_s=120.0, result_grace_s=20.0))
    assert result.status == "ok", result.message
    facts = result.runtime
    [opt] = facts.optimizers
    assert (opt.type, opt.fused, opt.foreach, opt.line) == ("torch.optim.adamw.AdamW", None, False, 7)
    assert opt.file == str(script) and opt.param_device == "cpu"
    assert facts.autocast.enabled and (facts.autocast.device_type, facts.autocast.dtype) == ("cpu", "bfloat16")
    assert facts.flags.float32_matmul_precision == "high" and facts.flags.cudnn_benchmark is True
    [call] = facts.compiled
    assert (call.target, call.backend, call.line) == ("torch.nn.modules.container.Sequential", "eager", 6)
    assert facts.model.compiled and facts.model.conv and facts.model.parameters == 4 * 4 * 3 + 4 + 24 + 1
    assert facts.errors == [] and facts.loaders == []
    assert advice.judge(result) == []  # nothing slow on this CPU: the GPU-only advice does not apply here


# A framework's Trainer, as the harness sees it: an object of a `transformers` class whose method runs the step.
FAKE_TRAINER = """\
import torch

class Args:
    bf16 = False
    fp16 = False
    dataloader_num_workers = 0
    optim = "adamw_torch"

class Trainer:
    def __init__(self, model):
        self.model, self.args = model, Args()

    def train(self):
        opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        for _ in range(100_000):
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

Trainer.__module__ = "transformers.trainer"
Trainer(torch.nn.Linear(4, 1)).train()
"""


def test_a_framework_trainer_around_the_step_is_read_without_importing_it(write_script, quick_config):
    script = write_script("hf.py", FAKE_TRAINER)
    result = run_once(RunSpec(script, [], script.parent), quick_config())
    assert result.status == "ok", result.message
    hf = result.runtime.frameworks["transformers"]
    assert (hf["bf16"], hf["fp16"], hf["dataloader_num_workers"], hf["optim"]) == (False, False, 0, "adamw_torch")
    assert hf["tf32"] is None  # not an attribute of this Args: left unknown


LITERAL_LOADER = """\
import torch
from torch.utils.data import DataLoader, Dataset


class Noise(Dataset):
    def __len__(self):
        return 128

    def __getitem__(self, i):
        return torch.randn(8), torch.randn(1)


loader = DataLoader(Noise(), batch_size=8)
device = "cuda" if torch.cuda.is_available() else "cpu"  # a GPU script (a CPU-only one gets no SF101)
model = torch.nn.Linear(8, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
""" + LOADER_LOOP.replace("model(x), y)", "model(x.to(device)), y.to(device))")


def test_a_finding_a_scan_reports_too_is_one_finding_confirmed_at_run_time(write_script, quick_config):
    script = write_script("literal.py", LITERAL_LOADER)
    result = advice.with_findings(run_once(RunSpec(script, [], script.parent), quick_config()))
    [finding] = result.runtime.findings
    assert (finding.code, finding.line, finding.static) == ("SF101", 13, True)


def test_confirm_matches_code_file_and_line_span(tmp_path):
    path = str(tmp_path / "t.py")
    at_line = RuntimeFinding(code="SF101", file=path, line=7)
    no_line = RuntimeFinding(code="SF201", file=path, line=None)
    static = [("SF101", path, 5, 8), ("SF201", path, 30, 30), ("SF102", path, 7, 7)]
    assert [f.static for f in advice.confirm([at_line, no_line], static)] == [True, True]
    assert [f.static for f in advice.confirm([at_line], [("SF101", path, 8, 9), ("SF102", path, 7, 7)])] == [False]
    assert [f.static for f in advice.confirm([at_line], [("SF101", str(tmp_path / "u.py"), 7, 7)])] == [False]


def _run(device: str, runtime: dict, param_dtype: str = "float32", wait: float | None = 0.4) -> RunResult:
    return RunResult.from_json({**NO_STEPS, "status": "ok", "script": "/p/train.py",
                                "device": {"type": device, "param_dtype": param_dtype},
                                "data": {"data_wait_fraction": wait}, "runtime": runtime})


SLOW = {
    "loaders": [{"file": "/p/data.py", "line": 7, "type": "torch.utils.data.dataloader.DataLoader",
                 "dataset": "data.Images", "trained_on": True, "epochs": 3, "num_workers": 0, "pin_memory": False,
                 "persistent_workers": False, "batch_size": 32},
                {"file": "/p/data.py", "line": 9, "dataset": "data.Images", "trained_on": False, "num_workers": 0}],
    "optimizers": [{"file": "/p/train.py", "line": 12, "type": "torch.optim.adamw.AdamW", "fused": None,
                    "foreach": None, "differentiable": False, "param_device": "cuda"}],
    "model": {"type": "torch.nn.modules.container.Sequential", "inner_type": "torch.nn.modules.container.Sequential",
              "compiled": False, "conv": True, "parameters": 1000},
    "autocast": {"enabled": False},
    "flags": {"float32_matmul_precision": "highest", "cudnn_benchmark": False, "anomaly_detection": False,
              "deterministic_algorithms": False, "cudnn_deterministic": False, "gpu_capability": [9, 0]},
}


def test_slow_settings_become_findings_on_the_devices_the_advice_applies_to():
    on_gpu = {f.code: f for f in advice.judge(_run("cuda", SLOW))}
    assert sorted(on_gpu) == ["SF101", "SF102", "SF201", "SF202", "SF401", "SF501", "SF601"]
    assert (on_gpu["SF101"].file, on_gpu["SF101"].line) == ("/p/data.py", 7)  # the training loader only
    assert "40% of the step time" in on_gpu["SF101"].message
    assert (on_gpu["SF401"].line, on_gpu["SF202"].line, on_gpu["SF202"].file) == (12, None, "/p/train.py")
    on_cpu = [f.code for f in advice.judge(_run("cpu", SLOW))]
    assert on_cpu == ["SF101"]  # the rest is GPU advice (the rules' gpu_only)
    quick = {**SLOW, "flags": {**SLOW["flags"], "anomaly_detection": True}}
    assert "SF603" in [f.code for f in advice.judge(_run("cpu", quick))]


def test_the_measured_data_wait_decides_the_impact_of_the_run_time_loader_advice():
    def workers(device, wait):
        return next(f for f in advice.judge(_run(device, SLOW, wait=wait)) if f.code == "SF101")

    assert workers("cuda", 0.58).impact == "high"  # the loader holds the GPU up: it comes first
    assert workers("cuda", 0.10).impact == "medium"
    assert workers("cuda", 0.02).impact == "low"  # the GPU keeps busy: workers would not help
    assert workers("cpu", 0.02).impact == "high"  # a CPU's slow steps hide the wait: the rule's usual impact
    assert workers("cuda", None).impact == "high"
    pin = next(f for f in advice.judge(_run("cuda", SLOW, wait=0.02)) if f.code == "SF102")
    assert pin.impact == "medium"  # the data wait judges the loader's workers, not its pinning


def test_a_loader_over_tensors_in_memory_gets_no_worker_advice_at_run_time():
    tensors = {**SLOW, "loaders": [{**SLOW["loaders"][0], "dataset": "torch.utils.data.dataset.TensorDataset"}]}
    assert "SF101" not in [f.code for f in advice.judge(_run("cpu", tensors))]
    assert "SF101" in [f.code for f in advice.judge(_run("cpu", SLOW))]


def test_a_framework_that_owns_the_precision_gets_its_own_code():
    hf = {**SLOW, "frameworks": {"transformers": {"bf16": False, "fp16": False}}}
    codes = [f.code for f in advice.judge(_run("cuda", hf))]
    assert "SF902" in codes and "SF202" not in codes
    # fp32 and TF32 off are one SF902 finding, as the scan reports them on `TrainingArguments`
    (fp32,) = [f for f in advice.judge(_run("cuda", hf)) if "fp32" in f.message]
    assert fp32.code == "SF902" and "precision" in fp32.message and "TF32" in fp32.message
    bf16 = {**SLOW, "frameworks": {"transformers": {"bf16": True}}}
    found = advice.judge(_run("cuda", bf16))
    assert "SF202" not in [f.code for f in found]  # the framework owns the precision
    assert not any("fp32 precision" in f.message for f in found)  # TF32 and compile are its to say (below)


def _lightning_fp32() -> dict:
    return {**SLOW, "model": {**SLOW["model"], "conv": False},
            "frameworks": {"lightning": {"precision": "32-true"}}}


def test_tf32_and_compile_advice_under_a_framework_carry_its_code_as_the_scan_does():
    # on an H100 the Lightning VAE read SF201 and SF501 "found at run time" where the scan says the
    # same under SF901: now three SF901 findings (fp32, TF32, compile before trainer.fit), all confirmed
    fixture = str(Path(__file__).resolve().parents[2] / "fixtures" / "lightning_vae.py")
    run = RunResult.from_json({**NO_STEPS, "status": "ok", "script": fixture,
                               "device": {"type": "cuda", "param_dtype": "float32"}, "runtime": _lightning_fp32()})
    found = [f for f in advice.judge(run) if f.code.startswith(("SF2", "SF5", "SF9"))]
    assert [f.code for f in found] == ["SF901"] * 3
    assert any("TF32" in f.message for f in found) and any("`trainer.fit`" in f.message for f in found)
    confirmed = advice.confirm(found, advice.scan_findings([fixture], {"SF901"}, None))
    assert all(f.static for f in confirmed)
    deepspeed = {**_lightning_fp32(), "frameworks": {"deepspeed": {"bfloat16_enabled": True}}}
    codes = {f.code: f.message for f in advice.judge(_run("cuda", deepspeed))}
    assert "SF201" in codes and "engine.compile()" in codes["SF905"]  # SF905 speaks of compile, not of TF32
    accelerate = {**_lightning_fp32(), "frameworks": {"accelerate": {"mixed_precision": "no"}}}
    codes = {f.code: f.message for f in advice.judge(_run("cuda", accelerate))}
    assert {"SF904", "SF201"} <= set(codes) and "dynamo_backend" in codes["SF501"]


def test_no_tf32_advice_while_the_autocast_of_training_is_unknown():
    # a compiled model's training calls are not seen (on an H100, sd.py's apply output, compiled and
    # in fp16 autocast, read SF201): unknown means silence
    unknown = {**SLOW, "autocast": None}
    assert "SF201" not in [f.code for f in advice.judge(_run("cuda", unknown))]
    assert "SF201" in [f.code for f in advice.judge(_run("cuda", SLOW))]


def test_runtime_facts_read_and_write_back_unchanged():
    data = {**NO_STEPS, "runtime": {**SLOW, "loaders": SLOW["loaders"][:1]}}
    written = RunResult.from_json(data).to_json()["runtime"]
    again = RunResult.from_json({**NO_STEPS, "runtime": written}).to_json()["runtime"]
    assert same_json(again, written)
    assert written["loaders"][0]["num_workers"] == 0 and written["findings"] == []
    assert "runtime" not in RunResult.from_json(NO_STEPS).to_json()  # older results have none
