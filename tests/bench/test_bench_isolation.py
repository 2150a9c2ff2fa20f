"""`speedfix bench` changes no file of the user's folder or of the script's folder (unless
--real-cwd): the script runs from a scratch mirror of both, and the write guard refuses what would
still reach a real file (large files and crowded folders are links; absolute paths)."""

from __future__ import annotations

import json

from speedfix.bench.runner import RunSpec, run_once


def snapshot(folder) -> dict:
    """Every entry under the folder: bytes of files, targets of links, folders."""
    out = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if path.is_symlink():
            out[key] = ("link", str(path.readlink()))
        elif path.is_file():
            out[key] = path.read_bytes()
        else:
            out[key] = "<dir>"
    return out


# Every case of the issue in one run (each run costs a python start and `import torch`): each
# attempt is recorded, with the error the guard raised where it refused.
HOSTILE = """
import json, os, shutil, sys
from pathlib import Path
import torch

here = Path(__file__).parent
seen = {"file": __file__, "cwd": os.getcwd()}

def attempt(name, action):
    try:
        action()
        seen[name] = "done"
    except OSError as err:
        seen[name] = f"{type(err).__name__}: {err}"

def save_next_to_the_script():
    torch.save({"w": torch.ones(2)}, os.path.join(os.path.dirname(__file__), "ckpt.pt"))

def runs_folder():
    (here / "runs").mkdir(exist_ok=True)
    (here / "runs" / "events.log").write_text("event")

def hidden_folders():
    (here / ".state" / "state.json").write_text("{}")
    os.remove(here / ".hydra" / "config.yaml")
    shutil.rmtree(here / ".cache")

def large_linked_file():
    with open(here / "data.bin", "r+b") as f:
        f.write(b"overwritten")

def save_over_the_large_linked_file():  # torch.save writes from C++: no audit event of its own
    torch.save({"w": torch.ones(2)}, here / "data.bin")

def absolute_path_into(folder):
    return lambda: open(os.path.join(folder, "out.txt"), "w").write("x")

def remove_the_script():
    os.remove(__file__)

attempt("save", save_next_to_the_script)
attempt("runs", runs_folder)
attempt("hidden", hidden_folders)
attempt("large", large_linked_file)
attempt("save_linked", save_over_the_large_linked_file)
for i, folder in enumerate(sys.argv[2:]):  # the script's folder, the working directory
    attempt(f"absolute{i}", absolute_path_into(folder))
attempt("remove", remove_the_script)
with open(sys.argv[1], "w") as f:  # outside the user's folder
    json.dump(seen, f)

# What a normal exit does for a script stopped after its window: a file left open is flushed, an
# exit handler runs, a non-daemon thread is waited for (it waits for the main thread to end).
import atexit, threading, time
left_open = open(sys.argv[1] + ".open", "w")
left_open.write("flushed")
atexit.register(lambda: Path(sys.argv[1] + ".atexit").write_text("ran"))

def after_the_main_thread():
    while threading.main_thread().is_alive():
        time.sleep(0.01)
    Path(sys.argv[1] + ".thread").write_text("waited for")

threading.Thread(target=after_the_main_thread).start()

model = torch.nn.Linear(4, 1)
for step in range(100_000):  # backward() is the clock (torch.optim would import Dynamo: seconds a run)
    model(torch.randn(8, 4)).sum().backward()
"""


def user_project(tmp_path, monkeypatch):
    from speedfix.bench import runner

    monkeypatch.setattr(runner, "COPY_FILE_LIMIT", 1000)  # data.bin is linked, not copied
    project = tmp_path / "project"
    for folder in (".state", ".hydra", ".cache"):
        (project / folder).mkdir(parents=True)
    (project / ".state" / "state.json").write_text('{"step": 7}')
    (project / ".hydra" / "config.yaml").write_text("lr: 0.1\n")
    (project / ".cache" / "features.npy").write_bytes(b"cached")
    (project / "data.bin").write_bytes(b"d" * 5000)
    (project / "train.py").write_text(HOSTILE)
    return project


def test_the_cases_of_the_issue_leave_the_users_folder_and_a_working_directory_apart_from_it_byte_identical(
        tmp_path, monkeypatch, quick_config):
    # The script's folder and the working directory are two folders here: both are mirrored.
    project = user_project(tmp_path, monkeypatch)
    cwd = tmp_path / "work"
    cwd.mkdir()
    (cwd / "notes.txt").write_text("the user's notes")
    before_project, before_cwd = snapshot(project), snapshot(cwd)
    seen_path = tmp_path / "seen.json"

    result = run_once(RunSpec(project / "train.py", [str(seen_path), str(project), str(cwd)], cwd), quick_config())

    assert result.status == "ok", result.message
    assert snapshot(project) == before_project and snapshot(cwd) == before_cwd
    seen = json.loads(seen_path.read_text())
    assert seen["file"] != str(project / "train.py") and seen["file"].endswith(str(project / "train.py"))
    assert seen["cwd"] == result.runner.scratch_cwd and seen["cwd"].endswith(str(cwd))
    # what lands in the scratch copies simply works there
    assert seen["save"] == seen["runs"] == seen["hidden"] == seen["remove"] == "done"
    # what would reach a real file is refused, and the run's report names it
    assert seen["large"].startswith("PermissionError: [Errno 13] speedfix bench keeps your files unchanged")
    assert seen["save_linked"].startswith("PermissionError")
    assert seen["absolute0"].startswith("PermissionError")
    assert seen["absolute1"].startswith("PermissionError")  # the working directory is protected as well
    assert {(r.event, r.path) for r in result.guard.refused} == {("open", str(project / "data.bin")),
                                                                  ("open", str(project / "out.txt")),
                                                                  ("open", str(cwd / "out.txt"))}
    assert result.script == str(project / "train.py")  # reported as the user's script


def test_real_cwd_runs_in_the_real_folders(tmp_path, monkeypatch, quick_config):
    project = user_project(tmp_path, monkeypatch)
    seen_path = tmp_path / "seen.json"

    result = run_once(RunSpec(project / "train.py", [str(seen_path), str(project)], project, real_cwd=True),
                      quick_config())

    assert result.status == "ok", result.message
    seen = json.loads(seen_path.read_text())
    assert seen["file"] == str(project / "train.py") and seen["large"] == "done"
    assert not (project / "train.py").exists() and (project / "ckpt.pt").exists()  # the user asked for it
    assert result.guard.active is False and result.guard.refusals == 0
    ends = {end: (tmp_path / f"seen.json.{end}").read_text() for end in ("open", "atexit", "thread")}
    assert ends == {"open": "flushed", "atexit": "ran", "thread": "waited for"}
