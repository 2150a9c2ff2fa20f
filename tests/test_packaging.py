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


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(out)], check=True
    )
    (found,) = out.glob("speedfix-*.whl")
    return found


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


def test_fresh_venv_install_and_help(wheel, tmp_path):
    env = tmp_path / "env"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)], check=True)
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


def test_the_suite_runs_from_an_installed_wheel(wheel, tmp_path):
    # Installed as a user installs it: no editable finder to fall back on the checkout's fixtures/.
    # torch, libcst, typer and rich come from the test environment (a .pth file), not the registry.
    env = tmp_path / "env"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = subprocess.run([str(python), "-c", "import speedfix; print(speedfix.__file__)"], capture_output=True,
                           text=True, check=True, cwd=tmp_path).stdout
    assert where.startswith(str(env))  # the wheel's copy, not the checkout
    out = tmp_path / "suite.json"
    result = subprocess.run(
        [str(env / "bin" / "speedfix"), "bench", "--suite", "--workload", "lstm_forecast", "--tiny", "--warmup", "2",
         "--steps", "3", "--max-pairs", "1", "--min-pairs", "1", "--json", str(out)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 1: a check failed, not a usage error
    (row,) = json.loads(out.read_text())["workloads"]
    assert row["name"] == "lstm_forecast" and not row.get("error")
    assert row["before"] > 0 and row["after"] > 0 and row["pairs"] == 1
