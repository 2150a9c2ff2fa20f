"""Mistakes in pyproject.toml and .speedfix_cache: a clear error naming the file, or a cache
that is ignored and rebuilt, never a traceback and never a write outside the project (issue 13,
item 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest



@pytest.fixture
def cached_cli(run_cli, monkeypatch):
    monkeypatch.delenv("SPEEDFIX_NO_CACHE", raising=False)
    return run_cli


def cache_files(root):
    return sorted((root / ".speedfix_cache").glob("scan-*.json"))


@pytest.mark.parametrize(
    "content",
    ["[]", '"a string"', "{\"x.py\": 1}", '{"/abs/train.py": {"key": 1, "result": []}}', "null"],
    ids=["list", "string", "entry not an object", "entry of another shape", "null"],
)
def test_cache_of_the_wrong_shape_is_ignored_and_rebuilt(good_script, cached_cli, write, tmp_path, content):
    write("good.py", good_script)
    first = cached_cli("scan", ".", "--no-summary", cwd=tmp_path)
    assert first.exit_code == 1
    (cache,) = cache_files(tmp_path)
    cache.write_text(content)
    for _ in range(2):  # the damaged cache, then the rebuilt one
        again = cached_cli("scan", ".", "--no-summary", cwd=tmp_path)
        assert (again.exit_code, again.stdout, again.stderr) == (1, first.stdout, "")
    assert isinstance(json.loads(cache.read_text()), dict)


def test_cached_record_of_the_wrong_shape_is_analysed_again(good_script, cached_cli, write, tmp_path):
    write("good.py", good_script)
    first = cached_cli("scan", ".", "--no-summary", cwd=tmp_path)
    (cache,) = cache_files(tmp_path)
    data = json.loads(cache.read_text())
    for entry in data.values():
        entry["result"] = {"findings": [{"code": "SF999", "line": "not a number"}], "error": None}
    cache.write_text(json.dumps(data))
    again = cached_cli("scan", ".", "--no-summary", cwd=tmp_path)
    assert (again.exit_code, again.stdout) == (1, first.stdout)


@pytest.mark.parametrize("what", ["folder", "file"])
def test_symlinked_cache_is_never_written_through(good_script, cached_cli, write, tmp_path, what):
    project, outside = tmp_path / "project", tmp_path / "outside"
    outside.mkdir()
    write("project/good.py", good_script)
    if what == "folder":
        (project / ".speedfix_cache").symlink_to(outside, target_is_directory=True)
    else:
        cached_cli("scan", ".", cwd=project)  # creates the folder and the cache file's name
        (cache,) = cache_files(project)
        cache.unlink()
        cache.symlink_to(outside / "stolen.json")
    result = cached_cli("scan", ".", "--no-summary", cwd=project)
    assert result.exit_code == 1 and "good.py:4:10: SF102" in result.stdout
    assert "is a symbolic link" in result.stderr and "neither read nor written" in result.stderr
    assert os.listdir(outside) == []


def test_pyproject_whose_tool_is_not_a_table_is_a_clear_error(good_script, run_cli, write, tmp_path):
    write("pyproject.toml", 'tool = "speedfix"\n')
    write("good.py", good_script)
    result = run_cli("scan", tmp_path / "good.py")
    assert result.exit_code == 2
    assert f"{tmp_path / 'pyproject.toml'}: `tool` must be a table" in result.stderr
    assert "Traceback" not in result.stderr


def test_pyproject_with_a_toml_syntax_error_is_an_error_with_its_path(good_script, run_cli, write, tmp_path):
    write("pyproject.toml", '[tool.speedfix]\nignore = ["SF102"\n')  # unclosed array
    write("good.py", good_script)
    result = run_cli("scan", tmp_path / "good.py")
    assert result.exit_code == 2
    assert f"{tmp_path / 'pyproject.toml'}: invalid TOML" in result.stderr
    assert "SF102" not in result.stdout  # never a scan without the user's settings
    assert run_cli("scan", tmp_path / "good.py", "--isolated").exit_code == 1


@pytest.mark.parametrize(
    "line, message",
    [
        ("max-file-size-mb = -1", "`max-file-size-mb` must be a number >= 0"),
        ('file-time-limit = "fast"', "`file-time-limit` must be a number >= 0"),
        ("max-file-size-mb = nan", "`max-file-size-mb` must be a number >= 0"),
        ("file-time-limit = nan", "`file-time-limit` must be a number >= 0"),
    ],
)
def test_limits_in_the_configuration_are_checked(good_script, run_cli, write, tmp_path, line, message):
    write("pyproject.toml", f"[tool.speedfix]\n{line}\n")
    write("good.py", good_script)
    result = run_cli("scan", tmp_path / "good.py")
    assert result.exit_code == 2 and message in result.stderr


@pytest.mark.parametrize("value", ["inf", "1e308"])
def test_limits_too_big_to_count_mean_no_limit(good_script, run_cli, write, tmp_path, value):
    # An OverflowError before (a number of bytes cannot be infinite).
    write("pyproject.toml", f"[tool.speedfix]\nmax-file-size-mb = {value}\nfile-time-limit = {value}\n")
    write("good.py", good_script)
    result = run_cli("scan", tmp_path / "good.py", "--no-summary")
    assert (result.exit_code, result.stderr) == (1, "") and "SF102" in result.stdout
    result = run_cli("scan", tmp_path / "good.py", "--no-summary", "--max-file-size-mb", value, "--file-time-limit", value)
    assert (result.exit_code, result.stderr) == (1, "")


def test_a_configuration_that_is_no_file_is_refused_at_once(good_script, write, tmp_path):
    # /dev/zero was read until memory ran out (MemoryError); a FIFO waited for a writer forever.
    write("good.py", good_script)
    os.mkfifo(tmp_path / "fifo.toml")
    for config, kind in (("/dev/zero", "a character device"), (tmp_path / "fifo.toml", "a named pipe")):
        result = subprocess.run([sys.executable, "-m", "speedfix", "scan", "--config", str(config), "good.py"],
                                cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and f"{config}: cannot read: not a regular file ({kind}" in result.stderr, result


def test_a_deeply_nested_configuration_is_a_clear_error(good_script, run_cli, write, tmp_path):
    write("pyproject.toml", "[tool.speedfix]\nselect = " + "[" * 50_000 + "]" * 50_000 + "\n")
    write("good.py", good_script)
    result = run_cli("scan", tmp_path / "good.py")
    assert result.exit_code == 2 and "pyproject.toml: invalid TOML: nested too deeply" in result.stderr


def test_a_deeply_nested_cache_is_ignored_and_rebuilt(good_script, cached_cli, write, tmp_path):
    # A RecursionError on this and every later scan before: the cache was never rewritten.
    write("good.py", good_script)
    first = cached_cli("scan", ".", "--no-summary", cwd=tmp_path)
    (cache,) = cache_files(tmp_path)
    cache.write_text('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    for _ in range(2):
        again = cached_cli("scan", ".", "--no-summary", cwd=tmp_path)
        assert (again.exit_code, again.stdout, again.stderr) == (1, first.stdout, "")
    assert "[[[" not in cache.read_text()


@pytest.mark.parametrize(
    "forge",
    [
        {"code": "SF999"},  # no such rule
        {"name": "blocking-transfer"},  # the name of another rule
        {"line": -3},
        {"cell": "1"},
    ],
    ids=["unknown code", "wrong name", "negative line", "cell not a number"],
)
def test_a_forged_cache_entry_is_analysed_again(good_script, cached_cli, write, tmp_path, forge):
    write("good.py", good_script)
    first = cached_cli("scan", ".", "--output-format", "json", cwd=tmp_path)
    (cache,) = cache_files(tmp_path)
    data = json.loads(cache.read_text())
    for entry in data.values():
        if "result" in entry:
            entry["result"]["findings"][0].update(forge)
    cache.write_text(json.dumps(data))
    again = cached_cli("scan", ".", "--output-format", "json", cwd=tmp_path)
    assert (again.exit_code, again.stdout) == (first.exit_code, first.stdout)


def test_control_characters_from_the_cache_are_escaped(good_script, cached_cli, write, tmp_path):
    write("good.py", good_script)
    cached_cli("scan", ".", cwd=tmp_path)
    (cache,) = cache_files(tmp_path)
    data = json.loads(cache.read_text())
    for entry in data.values():
        if "result" in entry:
            entry["result"]["findings"][0]["message"] = "\x1b[2J\x1b[31mforged\nevil.py:1:1: SF102 forged"
    cache.write_text(json.dumps(data))
    again = cached_cli("scan", ".", "--no-summary", cwd=tmp_path)
    assert "\x1b" not in again.stdout and not any(line.startswith("evil.py") for line in again.stdout.splitlines())
    assert "\\x1b[2J\\x1b[31mforged\\nevil.py:1:1: SF102 forged" in again.stdout
