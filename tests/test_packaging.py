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


def test_a_fresh_install_pulls_no_torch_its_help_and_scan_work_and_the_bench_runs_from_the_wheel(wheel, tmp_path):
    # One environment, in two stages (each venv and each install costs seconds):
    # 1. the wheel installed as a user installs it, with its core dependencies from the index: no
    #    torch and no top-level `rules` come with it, `speedfix --help` and a scan work;
    # 2. then torch (from the test environment, through a .pth file) is added: the bundled suite
    #    reads its fixtures from the installed wheel (no editable finder to fall back on the
    #    checkout's fixtures/), and a real run goes through the harness the wheel installed. (The
    #    suite on real runs: tests/bench/test_bench_results.py.)
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
    listing = subprocess.run(
        [str(python), "-c", "from speedfix.bench.suite import fixtures_dir, load_suite\n"
         "folder = fixtures_dir()\nprint(folder)\n"
         "for w in load_suite(folder): print(w.name, w.script, w.expert or '-')"],
        capture_output=True, text=True, check=True, cwd=tmp_path).stdout.splitlines()
    bundled = Path(listing[0])
    assert bundled == Path(site) / "speedfix" / "fixtures"  # the wheel's copy, not the checkout's
    workloads = [line.split() for line in listing[1:]]
    assert {"lstm_forecast", "sd"} <= {name for name, _, _ in workloads}
    assert all((bundled / script).is_file() and (expert == "-" or (bundled / expert).is_file())
               for _, script, expert in workloads)
    script = tmp_path / "train.py"
    script.write_text("import torch\nmodel = torch.nn.Linear(4, 1)\nx = torch.randn(8, 4)\nfor _ in range(10_000):\n"
                      "    loss = model(x).pow(2).mean()\n    model.zero_grad()\n    loss.backward()\n"
                      "    with torch.no_grad():\n        for p in model.parameters():\n            p -= 0.01 * p.grad\n")
    out = tmp_path / "run.json"
    result = subprocess.run(
        [str(env / "bin" / "speedfix"), "bench", str(script), "--warmup", "2", "--steps", "3", "--warmup-s", "0",
         "--window-s", "0", "--json", str(out)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(out.read_text())
    assert data["status"] == "ok" and data["timing"]["steps_timed"] == 3
