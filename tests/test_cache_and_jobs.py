"""Parallel scans give the serial result; the content-hash cache is used and invalidated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import speedfix.commands.scan as scan_module
import speedfix.engine.analysis as analysis_module


@pytest.fixture
def tree(tmp_path, write, train_script):
    for index in range(12):
        write(f"pkg/train_{index:02d}.py", train_script.replace("batch_size=32", f"batch_size={32 + index}"))
    write("pkg/broken.py", "import torch\ndef f(:\n")  # a finding (SF000), cached like the others
    (tmp_path / "pkg" / "blob.py").write_bytes(b"\x00torch")  # an error: never cached
    return tmp_path


@pytest.fixture
def cached_cli(run_cli, monkeypatch):
    monkeypatch.delenv("SPEEDFIX_NO_CACHE", raising=False)
    return run_cli


@pytest.fixture
def analyses(monkeypatch):
    """Counts the files that were really analysed (not served from the cache)."""
    calls: list[str] = []
    original = analysis_module.analyze

    def counting(source, path, *args, **kwargs):
        calls.append(path)
        return original(source, path, *args, **kwargs)

    monkeypatch.setattr(analysis_module, "analyze", counting)  # the scan imports it when it analyses
    return calls


def test_parallel_results_equal_serial_results(run_cli, tmp_path, write, train_script):
    from speedfix.commands.workers import PARALLEL_FROM

    # `tree`'s kinds of files, as few as take the worker pool (the JSON's fix previews cost the most)
    for index in range(PARALLEL_FROM - 2):
        write(f"pkg/train_{index:02d}.py", train_script.replace("batch_size=32", f"batch_size={32 + index}"))
    write("pkg/broken.py", "import torch\ndef f(:\n")
    (tmp_path / "pkg" / "blob.py").write_bytes(b"\x00torch")
    tree = tmp_path
    serial = run_cli("scan", ".", "--jobs", "1", "--format", "json", cwd=tree)
    parallel = run_cli("scan", ".", "--jobs", "2", "--format", "json", cwd=tree)
    assert serial.exit_code == parallel.exit_code == 2  # the binary file
    assert '"code": "SF000"' in serial.stdout
    assert serial.stdout == parallel.stdout and serial.stderr == parallel.stderr
    text_serial = run_cli("scan", ".", "--jobs", "1", cwd=tree)
    text_parallel = run_cli("scan", ".", "--jobs", "2", cwd=tree)
    assert text_serial.stdout == text_parallel.stdout


def test_the_engine_loads_while_workers_read_the_project_facts(tmp_path, write, train_script):
    """The facts of the files that import each other are read by workers forked before the
    engine is loaded, which this process loads meanwhile on a core of its own; the files are
    then analysed by workers forked after it, which share it, with what the other files tell them."""
    import multiprocessing.pool

    from speedfix.workspace.config import resolve_settings

    for index in range(6):
        write(f"pkg/helpers_{index}.py", "import torch\n\n\ndef to_device(batch):\n    return batch.cuda()\n")
        write(f"pkg/train_{index}.py", f"from helpers_{index} import to_device\n" + train_script)
    events: list[str] = []
    original = multiprocessing.pool.Pool.__init__
    loading = scan_module._analysers_loaded

    def counting(self, processes=None, *args, **kwargs):
        events.append(f"pool of {processes}")
        original(self, processes, *args, **kwargs)

    def loaded(settings):
        events.append("engine loaded")
        return loading(settings)

    settings = resolve_settings([tmp_path / "pkg"])
    serial = scan_module.scan_paths([tmp_path / "pkg"], settings, jobs=1, use_cache=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(multiprocessing.pool.Pool, "__init__", counting)
        patch.setattr(scan_module, "_analysers_loaded", loaded)
        parallel = scan_module.scan_paths([tmp_path / "pkg"], settings, jobs=2, use_cache=False)
    # this process loads on the second core, then analyses files beside the one worker forked after it
    assert events == ["pool of 1", "engine loaded", "pool of 1"]
    assert [(f.path, f.line, f.code) for f in parallel.findings] == [(f.path, f.line, f.code) for f in serial.findings]
    assert len(serial.findings) >= 6


def test_files_that_need_no_links_are_analysed_while_the_facts_are_read(tmp_path, write, train_script):
    """Scripts that import no other scanned file need no project facts: their analysis starts on
    a worker as soon as the engine is loaded, before the facts of the others are all read."""
    import multiprocessing.pool

    from speedfix.workspace.config import resolve_settings

    for index in range(8):
        write(f"pkg/helpers_{index}.py", "import torch\n\n\ndef to_device(batch):\n    return batch.cuda()\n")
        write(f"pkg/train_{index}.py", f"from helpers_{index} import to_device\n" + train_script)
        write(f"alone/train_{index}.py", train_script)
    events: list[str] = []
    original = multiprocessing.pool.Pool.__init__
    facts = scan_module.ProjectReading.facts

    def counting(self, processes=None, *args, **kwargs):
        events.append(f"pool of {processes}")
        original(self, processes, *args, **kwargs)

    def reading(self, *args, **kwargs):
        found = facts(self, *args, **kwargs)
        events.append("facts read")
        return found

    settings = resolve_settings([tmp_path])
    serial = scan_module.scan_paths([tmp_path], settings, jobs=1, use_cache=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(multiprocessing.pool.Pool, "__init__", counting)
        patch.setattr(scan_module.ProjectReading, "facts", reading)
        parallel = scan_module.scan_paths([tmp_path], settings, jobs=2, use_cache=False)
    assert events == ["pool of 1", "pool of 1", "facts read"]  # the facts' worker, then the analysis's
    assert [(f.path, f.line, f.code) for f in parallel.findings] == [(f.path, f.line, f.code) for f in serial.findings]
    assert len({f.path for f in serial.findings}) >= 16


def _wait_for(path: Path) -> None:
    for _ in range(3000):  # at most 30 s: a broken pool fails the test instead of hanging it
        if path.exists():
            return
        time.sleep(0.01)
    raise AssertionError(f"{path.name} never appeared")


def _claimed(folder: Path, parent: int, item: int) -> int:
    """An item of the facts step: the worker's first item waits until this process has done one
    of its own, so that both are seen taking items from the shared counter."""
    (folder / f"{item}-{os.getpid()}").touch()
    if os.getpid() != parent and item == 0:
        (folder / "worker started").touch()
        _wait_for(folder / "parent done")
    elif os.getpid() == parent:
        (folder / "parent done").touch()
    return item * item


def test_this_process_reads_the_facts_left_once_the_engine_is_loaded(tmp_path):
    """When the load ends before the facts do, this process takes the items still unclaimed:
    every item once, by one process or the other, and the results in the items' order."""
    import functools

    from speedfix.commands.workers import Workers

    parent = os.getpid()
    function = functools.partial(_claimed, tmp_path, parent)
    with Workers(2, load=lambda: _wait_for(tmp_path / "worker started")) as workers:
        results = list(workers.map(function, list(range(20))))
    assert results == [item * item for item in range(20)]
    claims = [name.split("-") for name in os.listdir(tmp_path) if "-" in name]
    assert sorted(int(item) for item, _ in claims) == list(range(20))  # each item once
    by = {int(item): int(pid) for item, pid in claims}
    assert by[0] != parent and by[1] == parent  # the worker took the first, this process the next


def _analysed(folder: Path, item: int) -> int:
    (folder / f"{item}-{os.getpid()}").touch()
    return -item


def test_the_workers_start_on_the_first_items_while_this_process_lists_the_others(tmp_path):
    """The files that need no project links are analysed while this process links the others:
    ``meanwhile`` is called once a worker has started, its items are done by the processes, this one
    too, and every result comes back once, in order, with the progress counted up to all."""
    import functools

    from speedfix.commands.workers import PARALLEL_FROM, Workers

    parent = os.getpid()
    first = list(range(PARALLEL_FROM))
    later = list(range(PARALLEL_FROM, 4 * PARALLEL_FROM))
    counted: list[int] = []

    def more() -> list[int]:
        _wait_for_any(tmp_path, "0-")  # a worker has analysed the first item meanwhile
        return later

    with Workers(2) as workers:
        results = workers.map(functools.partial(_analysed, tmp_path), first, loaded=True, meanwhile=more, done=counted.append)
    assert results == [-item for item in first + later]
    claims = [name.split("-") for name in os.listdir(tmp_path)]
    assert sorted(int(item) for item, _ in claims) == first + later  # each item once
    assert {int(pid) for item, pid in claims if int(item) >= PARALLEL_FROM} >= {parent}  # this process took its share
    assert counted == sorted(counted) and counted[-1] <= len(first + later)


def test_where_processes_cannot_be_forked_a_pool_maps_every_item_in_order(tmp_path, monkeypatch):
    """macOS and Windows start workers afresh (no fork): a plain pool takes the items and the
    ``more`` items, in order, with the progress counted."""
    import functools
    import multiprocessing

    from speedfix.commands.workers import PARALLEL_FROM, Workers

    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    counted: list[int] = []
    with Workers(2) as workers:
        results = workers.map(functools.partial(_analysed, tmp_path), list(range(PARALLEL_FROM)), loaded=True,
                              meanwhile=lambda: [PARALLEL_FROM], done=counted.append)
    assert results == [-item for item in range(PARALLEL_FROM + 1)]
    assert counted == list(range(1, PARALLEL_FROM + 2))


def _wait_for_any(folder: Path, prefix: str) -> None:
    for _ in range(3000):
        if any(name.startswith(prefix) for name in os.listdir(folder)):
            return
        time.sleep(0.01)
    raise AssertionError(f"no {prefix} file appeared")


def test_a_scan_leaves_the_garbage_collector_as_it_found_it(tree):
    import gc

    from speedfix.workspace.config import resolve_settings

    frozen_during: list[int] = []
    original = scan_module.scan_file

    def spying(*args, **kwargs):
        frozen_during.append(gc.get_freeze_count())
        return original(*args, **kwargs)

    before = gc.get_freeze_count()
    settings = resolve_settings([tree])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scan_module, "scan_file", spying)
        result = scan_module.scan_paths([tree], settings, jobs=1, use_cache=False)
    assert result.files == 14 and frozen_during
    assert all(count > before for count in frozen_during)  # the loaded code is out of the collector's walks
    assert gc.get_freeze_count() == before and gc.isenabled()


def test_second_scan_is_served_from_the_cache(cached_cli, tree, analyses):
    first = cached_cli("scan", ".", "--jobs", "1", cwd=tree)
    assert len(analyses) == 13  # the binary file is refused before analysis
    assert (tree / ".speedfix_cache" / ".gitignore").read_text().strip().endswith("*")
    (cache_file,) = (tree / ".speedfix_cache").glob("scan-*.json")
    cached = {Path(path).name for path in json.loads(cache_file.read_text())}
    assert "broken.py" in cached and "blob.py" not in cached  # a syntax error is a finding; errors are never cached
    analyses.clear()
    second = cached_cli("scan", ".", "--jobs", "1", cwd=tree)
    assert second.stdout == first.stdout and second.exit_code == first.exit_code == 2
    assert "pkg/broken.py:2:7: SF000 " in second.stdout and "blob.py: error: binary file" in second.stderr
    assert analyses == []


def test_cache_is_invalidated_by_edits_config_and_selection(cached_cli, tree, analyses, write):
    cached_cli("scan", ".", "--jobs", "1", cwd=tree)
    analyses.clear()
    (tree / "pkg" / "train_03.py").write_text("import torch\n")
    cached_cli("scan", ".", "--jobs", "1", cwd=tree)
    assert analyses == ["pkg/train_03.py"]
    analyses.clear()
    cached_cli("scan", ".", "--jobs", "1", "--select", "SF1", cwd=tree)
    assert len(analyses) == 13
    analyses.clear()
    write("pyproject.toml", '[tool.speedfix]\nignore = ["SF301"]\n')
    result = cached_cli("scan", ".", "--jobs", "1", cwd=tree)
    assert len(analyses) == 13 and "SF301" not in result.stdout


def test_the_notes_on_a_pinned_torch_come_from_the_cache_while_its_files_are_unchanged(
        cached_cli, tmp_path, write, train_script, monkeypatch):
    """A warm scan does not look for the project's torch pins again: the notes are kept in the
    cache with every file looked at (the requirement files, the folders listed) and worked out
    again when one of them changes."""
    write("pkg/train.py", train_script)
    tree = tmp_path
    counted: list[int] = []
    original = scan_module.pinned_torch_notes

    def counting(*args, **kwargs):
        counted.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(scan_module, "pinned_torch_notes", counting)
    (tree / "pkg" / "requirements.txt").write_text("torch==1.13.1\n")
    first = cached_cli("scan", ".", "--jobs", "1", "--output-format", "json", cwd=tree)
    second = cached_cli("scan", ".", "--jobs", "1", "--output-format", "json", cwd=tree)
    assert "the project pins `torch==1.13.1` here" in first.stderr and second.stderr == first.stderr
    assert len(counted) == 1
    (tree / "pkg" / "requirements.txt").write_text("torch>=2.4\n")
    third = cached_cli("scan", ".", "--jobs", "1", "--output-format", "json", cwd=tree)
    assert "pins" not in third.stderr and len(counted) == 2
    (tree / "pkg" / "requirements.txt").unlink()
    (tree / "pkg" / "environment.yml").write_text("dependencies:\n  - pytorch=1.12.1\n")
    fourth = cached_cli("scan", ".", "--jobs", "1", "--output-format", "json", cwd=tree)
    assert "the project pins" in fourth.stderr and len(counted) == 3


def test_another_build_of_the_same_version_does_not_reuse_the_cache(cached_cli, tree, analyses, monkeypatch):
    """`pip install .` of an updated clone keeps the version number: the cache is keyed by the
    build too (the size and time of each of speedfix's modules), so its results are not reused."""
    from speedfix.workspace import cache

    cached_cli("scan", ".", "--jobs", "1", cwd=tree)
    analyses.clear()
    cached_cli("scan", ".", "--jobs", "1", cwd=tree)
    assert analyses == []
    monkeypatch.setattr(cache, "_build", lambda: "another build")
    cached_cli("scan", ".", "--jobs", "1", cwd=tree)
    assert len(analyses) == 13 and len(list((tree / ".speedfix_cache").glob("scan-*.json"))) == 2


def test_the_build_is_every_module_of_speedfix(tmp_path, monkeypatch):
    """The build digest changes with any module's size or time, the rules' included."""
    import os

    import speedfix
    from speedfix.workspace import cache

    package = tmp_path / "speedfix"
    (package / "rules").mkdir(parents=True)
    (package / "cli.py").write_text("x = 1\n")
    (package / "rules" / "sf101_x.py").write_text("y = 1\n")
    monkeypatch.setattr(speedfix, "__path__", [str(package)])

    def build() -> str:
        cache._build.cache_clear()
        return cache._build()

    first = build()
    os.utime(package / "rules" / "sf101_x.py", ns=(1, 1))
    second = build()
    (package / "cli.py").write_text("x = 10\n")
    third = build()
    assert len({first, second, third}) == 3 and build() == third
    cache._build.cache_clear()


def test_no_cache_writes_nothing_and_a_damaged_cache_is_ignored(cached_cli, tree, analyses):
    cached_cli("scan", ".", "--no-cache", cwd=tree)
    assert not (tree / ".speedfix_cache").exists()
    first = cached_cli("scan", ".", cwd=tree)
    for cache_file in (tree / ".speedfix_cache").glob("scan-*.json"):
        cache_file.write_text("{not json")
    analyses.clear()
    again = cached_cli("scan", ".", "--jobs", "1", cwd=tree)
    assert again.stdout == first.stdout and len(analyses) == 13


def test_cached_results_follow_the_current_folder(cached_cli, tree):
    cached_cli("scan", "pkg", cwd=tree)
    inside = cached_cli("scan", ".", "--no-summary", cwd=tree / "pkg")
    assert inside.stdout.startswith("broken.py:2:7: SF000 ")
    assert "\ntrain_00.py:" in inside.stdout and "pkg/" not in inside.stdout


def test_progress_bar_only_on_a_terminal(monkeypatch, tmp_path, write, good_script):
    import io

    from rich.console import Console

    import speedfix.cli as cli

    for index in range(60):
        write(f"many/t{index}.py", good_script)
    piped = io.StringIO()
    monkeypatch.setattr(cli, "_stderr", lambda: Console(file=piped, force_terminal=False))
    with cli.scan_progress() as progress:
        assert progress is None
    terminal = io.StringIO()
    monkeypatch.setattr(cli, "_stderr", lambda: Console(file=terminal, force_terminal=True, width=80))
    monkeypatch.setattr(cli, "surely_not_a_terminal", lambda stream: False)  # standard error is captured here
    with cli.scan_progress() as progress:
        assert progress is not None
        scan_module.scan_paths([tmp_path / "many"], _settings(tmp_path), use_cache=False, jobs=1, progress=progress)
    assert "scanning" in terminal.getvalue() and "60/60" in terminal.getvalue()


def _settings(root):
    from speedfix.workspace.config import Settings

    return Settings(root=root)



def test_a_scan_of_cached_files_imports_no_rule_and_no_libcst(tmp_path, train_script):
    """What a warm scan starts is what it pays for: with every file cached, the engine, the
    rules and libcst stay unloaded, summary table and the note on the project's torch pin
    included (the first scan, which analyses the file, loads them)."""
    (tmp_path / "train.py").write_text(train_script)
    (tmp_path / "requirements.txt").write_text("torch==1.9.0\n")  # switches off SF203, SF401, SF501...
    code = (
        "import sys\nfrom speedfix.cli import main\n"
        "try:\n    main(['scan', 'train.py'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m in ('libcst', 'speedfix.model.context', 'speedfix.rules.sf101_dataloader_no_workers')))\n"
    )
    env = {name: value for name, value in os.environ.items() if name != "SPEEDFIX_NO_CACHE"}

    def loaded() -> str:
        run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
        assert "the project pins `torch==1.9.0` here" in " ".join(run.stdout.split()), run.stdout
        return run.stdout.splitlines()[-1]

    assert loaded() == "['libcst', 'speedfix.model.context', 'speedfix.rules.sf101_dataloader_no_workers']"
    assert loaded() == "[]"


def test_an_internal_error_fails_one_file_and_the_others_are_scanned(run_cli, tree, monkeypatch):
    """A bug of speedfix's on one file is that file's error (exit 2, with the exception and where
    it was raised), not a crash of the whole scan; nothing about it is cached."""
    original = analysis_module.analyze

    def failing(source, path, *args, **kwargs):
        if path.endswith("train_05.py"):
            raise AttributeError("module 'libcst' has no attribute 'YieldFrom'")
        return original(source, path, *args, **kwargs)

    monkeypatch.setattr(analysis_module, "analyze", failing)
    result = run_cli("scan", ".", "--jobs", "1", cwd=tree)
    assert result.exit_code == 2
    assert ("pkg/train_05.py: error: internal error: speedfix could not analyse this file (AttributeError at "
            "test_cache_and_jobs.py:") in result.stderr
    assert "the other files were scanned" in result.stderr
    assert "pkg/train_04.py:" in result.stdout and "pkg/train_06.py:" in result.stdout
