"""Report helpers: strict JSON, load warnings, formatting."""

from __future__ import annotations

import json

from speedfix.bench import report


def test_json_reports_are_strict_even_with_nan(tmp_path):
    path = tmp_path / "sub" / "r.json"
    report.write_json(path, {"a": float("nan"), "b": [1.5, float("inf")], "c": (1, 2)})
    data = json.loads(path.read_text(), parse_constant=_reject_constant)
    assert data == {"a": None, "b": [1.5, None], "c": [1, 2]}
    assert not list(path.parent.glob(".*.tmp"))  # written atomically, no debris


def _reject_constant(constant):
    raise AssertionError(f"non-standard JSON constant {constant}")


def test_busy_machine_gets_a_warning():
    assert report.load_note({"max_loadavg": 4.0, "cpus": 2}).startswith("warning: the machine was busy")
    assert report.load_note({"max_loadavg": 1.2, "cpus": 2}) is None
    assert report.load_note({"max_loadavg": None, "cpus": 2}) is None


def test_formatting():
    assert report.fmt_speedup({"median": 1.234, "ci95_median": [1.1, 1.4]}) == "1.23x [1.10, 1.40]"
    assert report.fmt_bytes(3 * 1024**3) == "3.0 GiB"
    assert report.fmt_rate(12345.6) == "12,346" and report.fmt_rate(7.04) == "7.04"
    line = report.sparkline([3.0, 2.0, None, 1.0])
    assert line == "█▄▁"
