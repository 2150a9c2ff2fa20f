"""The pre-commit hooks, run by the real `pre-commit` tool in a throw-away git repository.

The hook environment is built from a snapshot of this checkout's working tree (tracked files
with their local edits plus untracked, not-ignored ones), committed in a temporary repository:
`pre-commit try-repo` on the checkout itself only carries tracked and staged changes, so new
files would be missing. Building the environment needs the package index (pip installs
speedfix with its core dependencies); the module builds it once, in a shared PRE_COMMIT_HOME,
and `pre-commit run` reuses it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRE_COMMIT = [sys.executable, "-m", "pre_commit"]

SLOW_SCRIPT = textwrap.dedent(
    """\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset


    def main():
        device = torch.device("cuda")
        data = TensorDataset(torch.randn(4096, 128), torch.randint(0, 10, (4096,)))
        loader = DataLoader(data, batch_size=64, shuffle=True)
        model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.cuda.amp.GradScaler()
        for epoch in range(3):
            for x, y in loader:
                x = x.to(device)
                y = y.to(device)
                optimizer.zero_grad()
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = nn.functional.cross_entropy(model(x), y)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()


    if __name__ == "__main__":
        main()
    """
)
CLEAN_FILE = textwrap.dedent(
    """\
    import json


    def load(path):
        with open(path) as f:
            return json.load(f)
    """
)
NOTEBOOK_CELLS = [
    ("markdown", "# Training"),
    ("code", "import torch\nfrom torch.utils.data import DataLoader"),
    ("code", "%matplotlib inline\nloader = DataLoader(dataset, batch_size=32, shuffle=True)\n"
             "for x, y in loader:\n    x = x.to('cuda')\n    loss = model(x).sum()\n"
             "    loss.backward()\n    optimizer.step()"),
]
SAFE_FIXES = ('pin_memory=True', "x = x.to(device, non_blocking=True)", "y = y.to(device, non_blocking=True)",
              'torch.amp.GradScaler("cuda")')


def _notebook() -> str:
    cells = []
    for kind, source in NOTEBOOK_CELLS:
        cell = {"cell_type": kind, "metadata": {}, "source": source.splitlines(keepends=True)}
        if kind == "code":
            cell.update(execution_count=None, outputs=[])
        cells.append(cell)
    return json.dumps({"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
                       "nbformat": 4, "nbformat_minor": 5}, indent=1) + "\n"


def _env(home: Path) -> dict[str, str]:
    # No GIT_* variables from an enclosing git hook (GIT_INDEX_FILE would point at the wrong repo).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "PRE_COMMIT"))}
    env.update(PRE_COMMIT_HOME=str(home), PRE_COMMIT_COLOR="never", NO_COLOR="1", GIT_CONFIG_NOSYSTEM="1")
    # On Python 3.11 and older, whose virtualenvs come with setuptools, pip builds the wheel with
    # that one instead of installing setuptools into a throw-away build environment first (pip's
    # PIP_NO_* variables read "0" as "no"): the same packages in the hook environment, 5 s sooner.
    if sys.version_info < (3, 12):
        env["PIP_NO_BUILD_ISOLATION"] = "0"
    return env


def _git(cwd: Path, *args: str, env: dict[str, str]) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def _init_repo(path: Path, env: dict[str, str]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q", env=env)
    _git(path, "config", "user.name", "speedfix tests", env=env)
    _git(path, "config", "user.email", "tests@speedfix.invalid", env=env)
    _git(path, "config", "commit.gpgsign", "false", env=env)


def _snapshot(dest: Path, env: dict[str, str]) -> str:
    """Commit the checkout's working tree (as `git status` sees it) into `dest`; its revision."""
    listed = _git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard", env=env)
    _init_repo(dest, env)
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # skips files deleted in the working tree
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    _git(dest, "add", "-A", env=env)
    _git(dest, "commit", "-q", "-m", "snapshot of the working tree", env=env)
    return _git(dest, "rev-parse", "HEAD", env=env).strip()


class Project:
    """A throw-away git repository using both hooks from the snapshot."""

    def __init__(self, path: Path, hooks_repo: Path, rev: str, env: dict[str, str]) -> None:
        self.path, self.env = path, env
        _init_repo(path, env)
        (path / ".pre-commit-config.yaml").write_text(
            f"repos:\n-   repo: {hooks_repo.as_posix()}\n    rev: {rev}\n    hooks:\n"
            "    -   id: speedfix\n    -   id: speedfix-apply\n",
            encoding="utf-8",
        )
        self.stage(".pre-commit-config.yaml")

    def write(self, name: str, text: str) -> Path:
        target = self.path / name
        target.write_text(text, encoding="utf-8")
        self.stage(name)
        return target

    def stage(self, *names: str) -> None:
        _git(self.path, "add", "--", *names, env=self.env)

    def pre_commit(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*PRE_COMMIT, *args, "--color", "never"], cwd=self.path, env=self.env,
                              capture_output=True, text=True, timeout=900)

    def hook(self, hook_id: str, *files: str) -> subprocess.CompletedProcess[str]:
        return self.pre_commit("run", hook_id, "--files", *files)


@pytest.fixture(scope="module")
def hooks(built_once):
    """(snapshot repository, revision, env with the shared PRE_COMMIT_HOME), hooks installed once
    for the whole run."""

    def build(base: Path) -> list[str]:
        env = _env(base / "pre-commit-home")
        repo = base / "speedfix-snapshot"
        rev = _snapshot(repo, env)
        installed = Project(base / "install", repo, rev, env).pre_commit("install-hooks")
        assert installed.returncode == 0, installed.stdout + installed.stderr
        return [str(repo), rev, str(base / "pre-commit-home")]

    repo, rev, home = built_once("precommit", build)
    return Path(repo), rev, _env(Path(home))


@pytest.fixture
def project(hooks, tmp_path) -> Project:
    repo, rev, env = hooks
    return Project(tmp_path / "project", repo, rev, env)


def _output(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout + proc.stderr


def test_manifest_defines_both_hooks():
    from pre_commit.clientlib import load_manifest

    hooks = {hook["id"]: hook for hook in load_manifest(str(ROOT / ".pre-commit-hooks.yaml"))}
    assert set(hooks) == {"speedfix", "speedfix-apply"}
    assert hooks["speedfix"]["entry"] == "speedfix scan --force-exclude"
    assert hooks["speedfix-apply"]["entry"] == "speedfix apply --force-exclude"
    for hook in hooks.values():
        assert hook["language"] == "python"
        assert hook["types_or"] == ["python", "jupyter"]
        assert hook["name"] and hook["description"]
        assert hook["require_serial"] is True  # one process: speedfix parallelises and caches itself
        command = " ".join([hook["entry"], *hook["args"]])
        assert "bench" not in command and "--verify" not in command and "--unsafe-fixes" not in hook["args"]


def test_scan_hook_fails_on_findings_and_prints_them(project):
    project.write("train.py", SLOW_SCRIPT)
    proc = project.hook("speedfix", "train.py")
    out = _output(proc)
    assert proc.returncode == 1, out
    assert "speedfix" in out and "Failed" in out and "exit code: 1" in out
    for code in ("SF102", "SF104", "SF203"):
        assert f": {code} [*] " in out, out
    assert "train.py:9:14: SF102 [*] `DataLoader` without `pin_memory=True`" in out
    assert project.path.joinpath("train.py").read_text(encoding="utf-8") == SLOW_SCRIPT  # scanning never writes
    # The results cache ignores itself: nothing untracked for `git status`.
    status = _git(project.path, "status", "--porcelain", "--untracked-files=all", env=project.env)
    assert "??" not in status, status


def test_scan_hook_passes_a_clean_file(project):
    project.write("util.py", CLEAN_FILE)
    proc = project.hook("speedfix", "util.py")
    assert proc.returncode == 0, _output(proc)
    assert "Passed" in proc.stdout


def test_hooks_skip_files_that_are_not_python(project):
    project.write("notes.txt", "DataLoader(x)\n")
    proc = project.pre_commit("run", "--files", "notes.txt")
    assert proc.returncode == 0, _output(proc)
    assert "(no files to check)Skipped" in proc.stdout


def test_apply_hook_writes_safe_fixes_then_passes(project):
    script = project.write("train.py", SLOW_SCRIPT)
    project.write("util.py", CLEAN_FILE)
    first = project.hook("speedfix-apply", "train.py", "util.py")
    out = _output(first)
    assert first.returncode != 0, out
    assert "Failed" in out and "files were modified by this hook" in out
    fixed = script.read_text(encoding="utf-8")
    for text in SAFE_FIXES:
        assert text in fixed, fixed
    # Unsafe fixes (num_workers, torch.compile) stay out of a commit hook.
    assert "num_workers" not in fixed and "compile" not in fixed
    assert project.path.joinpath("util.py").read_text(encoding="utf-8") == CLEAN_FILE
    compile(fixed, "train.py", "exec")

    project.stage("train.py")
    second = project.hook("speedfix-apply", "train.py", "util.py")
    assert second.returncode == 0, _output(second)
    assert "Passed" in second.stdout
    assert script.read_text(encoding="utf-8") == fixed


def test_notebooks_are_passed_to_the_hooks(project):
    project.write("train.ipynb", _notebook())
    proc = project.hook("speedfix", "train.ipynb")
    out = _output(proc)
    assert "no files to check" not in out  # types_or: jupyter
    assert proc.returncode == 1, out
    assert "train.ipynb:cell 3:2:10: SF102 [*] " in out, out

    fixer = project.hook("speedfix-apply", "train.ipynb")
    assert fixer.returncode != 0, _output(fixer)
    notebook = json.loads(project.path.joinpath("train.ipynb").read_text(encoding="utf-8"))
    source = "".join(notebook["cells"][2]["source"])
    assert "pin_memory=True" in source and "x.to('cuda', non_blocking=True)" in source
    assert source.startswith("%matplotlib inline\n")  # magics are left alone
    assert notebook["metadata"]["kernelspec"]["name"] == "python3"


def test_hook_environment_has_no_torch(hooks):
    repo, rev, env = hooks
    home = Path(env["PRE_COMMIT_HOME"])
    pythons = sorted(home.glob("repo*/py_env-*/bin/python")) + sorted(home.glob("repo*/py_env-*/Scripts/python.exe"))
    assert len(pythons) == 1, pythons
    probe = (
        "import importlib.metadata as m, importlib.util as u, speedfix.cli\n"
        "names = sorted(d.metadata['Name'].lower() for d in m.distributions())\n"
        "print(names)\n"
        "assert 'speedfix' in names and 'libcst' in names, names\n"
        "assert u.find_spec('torch') is None and 'torch' not in names, 'torch is installed'\n"
        "assert not [n for n in names if n.startswith('nvidia')], names\n"
    )
    proc = subprocess.run([str(pythons[0]), "-c", probe], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    imported = subprocess.run([str(pythons[0]), "-c", "import torch"], env=env, capture_output=True, text=True)
    assert imported.returncode != 0 and "No module named 'torch'" in imported.stderr


# ------------------------------------------------------------------ the README's local recipe
def _readme_local_config() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## pre-commit\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert "repo: local" in block and "rev:" not in block
    return block


def test_readme_local_hooks_work_and_a_baseline_lets_old_code_pass(tmp_path):
    """The README's `repo: local` snippet, as it stands, with the speedfix of this environment:
    it fails on an old script's findings until `speedfix scan --add-noqa` makes a baseline."""
    env = _env(tmp_path / "home")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    repo = tmp_path / "project"
    _init_repo(repo, env)
    (repo / ".pre-commit-config.yaml").write_text(_readme_local_config(), encoding="utf-8")
    (repo / "train.py").write_text(SLOW_SCRIPT, encoding="utf-8")
    _git(repo, "add", "-A", env=env)

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run([*PRE_COMMIT, "run", "--all-files", "--color", "never"], cwd=repo, env=env,
                              capture_output=True, text=True, timeout=300)

    first = run()
    assert first.returncode == 1, first.stdout + first.stderr
    assert "files were modified by this hook" in first.stdout and ": SF501 " in first.stdout
    _git(repo, "checkout", "--", "train.py", env=env)  # drop the fixes: adopt the hook on the code as it is
    baseline = subprocess.run(["speedfix", "scan", ".", "--add-noqa"], cwd=repo, env=env, capture_output=True, text=True)
    assert baseline.returncode == 0 and baseline.stdout.startswith("Added "), baseline.stdout + baseline.stderr
    _git(repo, "add", "-A", env=env)
    second = run()
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.stdout.count("Passed") == 2
