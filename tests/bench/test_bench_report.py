"""Report helpers: strict JSON, load warnings, formatting."""

from __future__ import annotations

import json

from speedfix.bench import report
from speedfix.bench.results import Load, RunResult, Speedup


def test_json_reports_are_strict_even_with_nan(tmp_path):
    path = tmp_path / "sub" / "r.json"
    report.write_json(path, {"a": float("nan"), "b": [1.5, float("inf")], "c": (1, 2)})
    data = json.loads(path.read_text(), parse_constant=_reject_constant)
    assert data == {"a": None, "b": [1.5, None], "c": [1, 2]}
    assert not list(path.parent.glob(".*.tmp"))  # written atomically, no debris


def _reject_constant(constant):
    raise AssertionError(f"non-standard JSON constant {constant}")


def test_busy_machine_gets_a_warning():
    assert report.load_note(Load(max_loadavg=4.0, cpus=2)).startswith("warning: the machine was busy")
    assert report.load_note(Load(max_loadavg=1.2, cpus=2)) is None
    assert report.load_note(Load(max_loadavg=None, cpus=2)) is None


def test_formatting():
    assert report.fmt_speedup(Speedup(median=1.234, ci95_median=(1.1, 1.4))) == "1.23x [1.10, 1.40]"
    assert report.fmt_bytes(3 * 1024**3) == "3.0 GiB"
    assert report.fmt_rate(12345.6) == "12,346" and report.fmt_rate(7.04) == "7.04"
    line = report.sparkline([3.0, 2.0, None, 1.0])
    assert line == "█▄▁"


def test_a_speedup_without_an_interval_says_so():
    # fewer than 6 pairs have no 95% distribution-free interval: never print [0.00, inf]
    speed = Speedup(median=1.39, ci95_median=(0.0, float("inf")), pairs=1)
    assert report.fmt_speedup(speed) == "1.39x (no interval: 1 pair)"
    # as read back from a JSON report, which writes inf as null
    assert report.fmt_speedup(Speedup.from_json({"median": 1.39, "ci95_median": [0.0, None], "per_pair": [1.39]})) \
        == "1.39x (no interval: 1 pair)"


def test_a_single_run_shows_its_clock_compile_time_harness_share_and_changed_real_files():
    from rich.console import Console

    result = RunResult.from_json({
        "status": "ok", "message": "measured", "script": "train.py", "clock": "backward",
        "compile": {"compilations": 2, "seconds": 24.8, "in_window": 0, "settled": True},
        "timing": {"steps_per_s": 10.0, "window_s": 2.0, "steps_timed": 20, "harness_share": 0.0031,
                   "step_time_s": {"median": 0.1, "p10": 0.09, "max": 0.2}},
        "runner": {"real_files_modified": ["/data/model.pt"]}})
    console = Console(record=True, width=200)
    report.render_run(result, console)
    text = console.export_text()
    assert "backward() calls: the script steps no torch.optim optimizer" in text
    assert "24.8 s in 2 compilation(s), paid once per run; none inside the window" in text
    assert "0.31% of the window spent in speedfix's own hooks" in text
    assert "changed 1 file(s) in your folder" in text and "/data/model.pt" in text
