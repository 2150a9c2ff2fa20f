"""The package as users install it: `rules/` becomes `speedfix.rules`, fixtures ship for the
benchmark suite, the core install pulls no torch, and `speedfix --help` works."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _build_isolation_needed() -> bool:
    """pip builds the wheel in an isolated environment, installing setuptools and wheel from the
    index (7 s of the suite's time): not needed where the test environment has them already
    (pyproject's build-system requires setuptools>=69 and wheel; setuptools 70.1 builds wheels itself)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        setuptools = tuple(int(part) for part in version("setuptools").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return True
    try:
        version("wheel")
        has_wheel = True
    except PackageNotFoundError:
        has_wheel = False
    return not (setuptools >= (70, 1) or (setuptools >= (69, 0) and has_wheel))


@pytest.fixture(scope="module")
def wheel(built_once) -> Path:
    def build(out: Path) -> str:
        isolation = [] if _build_isolation_needed() else ["--no-build-isolation"]
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", *isolation, "-q", "-w", str(out)],
            check=True,
        )
        (found,) = out.glob("speedfix-*.whl")
        return str(found)

    return Path(built_once("wheel", build))


def test_wheel_maps_rules_into_the_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "speedfix/rules/sf101_dataloader_no_workers.py" in names
    assert "speedfix/fixtures/sd.py" in names and "speedfix/fixtures/suite.toml" in names
    assert not [n for n in names if n.split("/")[0] in ("rules", "fixtures", "tests")]
    # every layer of the package ships (pyproject lists each subpackage by name)
    packages = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "speedfix").rglob("__init__.py")}
    assert len(packages) > 5 and {f"{package}/__init__.py" for package in packages} <= set(names)
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    core = [line for line in requires if "extra ==" not in line]
    assert not any("torch" in line for line in core)
    # a range, so that `pip install 'speedfix[bench]'` keeps a user's CUDA torch
    bench_torch = [line for line in requires if line.startswith("Requires-Dist: torch") and 'extra == "bench"' in line]
    assert bench_torch and "torch>=" in bench_torch[0] and "torch==" not in bench_torch[0]


def test_a_fresh_install_pulls_no_torch_its_help_and_scan_work_and_the_suite_runs_from_the_wheel(wheel, tmp_path):
    # One environment, in two stages (each venv and each install costs seconds):
    # 1. the wheel installed as a user installs it, with its core dependencies from the index: no
    #    torch and no top-level `rules` come with it, `speedfix --help` and a scan work;
    # 2. then torch (from the test environment, through a .pth file) is added, and the bundled suite
    #    runs from the installed wheel: no editable finder to fall back on the checkout's fixtures/.
    env = tmp_path / "env"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", str(wheel)], check=True)
    help_text = subprocess.run([str(env / "bin" / "speedfix"), "--help"], capture_output=True, text=True, check=True)
    assert "scan" in help_text.stdout and "apply" in help_text.stdout
    probe = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('rules'), u.find_spec('torch'))"],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    )
    assert probe.stdout.split() == ["None", "None"]
    scan = subprocess.run(
        [str(env / "bin" / "speedfix"), "scan", str(ROOT / "fixtures" / "sd.py"), "--no-cache"],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert scan.returncode == 1 and "SF102" in scan.stdout

    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = subprocess.run([str(python), "-c", "import speedfix; print(speedfix.__file__)"], capture_output=True,
                           text=True, check=True, cwd=tmp_path).stdout
    assert where.startswith(str(env))  # the wheel's copy, not the checkout
    # The suite's whole path on real runs: the original, speedfix's fixes and the expert's version
    # (one pair each), its JSON and Markdown, and the bundled fixtures left as they were.
    bundled = Path(site) / "speedfix" / "fixtures"
    fixtures_before = {p.name: p.read_bytes() for p in bundled.iterdir() if p.is_file()}
    out, md = tmp_path / "suite.json", tmp_path / "suite.md"
    result = subprocess.run(
        [str(env / "bin" / "speedfix"), "bench", "--suite", "--workload", "lstm_forecast", "--tiny", "--warmup", "2",
         "--steps", "3", "--max-pairs", "1", "--min-pairs", "1", "--json", str(out), "--markdown", str(md)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 1: a check failed, not a usage error
    data = json.loads(out.read_text())
    assert data["size"] == "tiny"
    (row,) = data["workloads"]
    assert row["name"] == "lstm_forecast" and not row.get("error") and row["args"] == ["--tiny"]
    assert row["before"] > 0 and row["after"] > 0 and row["expert"] > 0 and row["pairs"] == 1
    assert row["speedup"]["pairs"] == 1 and row["expert_speedup"]["pairs"] == 1
    assert row["captured"] is None  # 1 pair is too few to call the expert faster
    assert row["fixes"] and all(code.startswith("SF") for code in row["fixes"])
    assert row["loss_check"].startswith("ok")
    assert f"| lstm_forecast | {', '.join(row['fixes'])} |" in md.read_text()
    assert {p.name: p.read_bytes() for p in bundled.iterdir() if p.is_file()} == fixtures_before
