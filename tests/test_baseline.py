"""`speedfix scan --add-noqa`: a baseline for an old codebase, as ruff's `--add-noqa`. Every
line with findings gets `# noqa: CODES`; nothing else of the file changes."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

LOADER = "loader = DataLoader(train_set, batch_size=32, shuffle=True)"


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


def test_add_noqa_then_the_scan_is_clean(run_cli, write, train_script, tmp_path):
    path = write("train.py", train_script)
    before = path.read_bytes()
    result = run_cli("scan", ".", "--add-noqa", cwd=tmp_path)
    assert result.exit_code == 0 and result.stdout == "Added 5 noqa directives to 1 file.\n", result
    after = path.read_bytes()
    changed = [(old, new) for old, new in zip(_lines(before), _lines(after)) if old != new]
    assert len(_lines(before)) == len(_lines(after)) and len(changed) == 5
    for old, new in changed:  # the line as it was, then the directive
        assert new.startswith(old.rstrip(b"\n")) and b"  # noqa: SF" in new and new.endswith(b"\n")
    assert f"    {LOADER}  # noqa: SF101, SF102\n".encode() in after
    assert run_cli("scan", ".", cwd=tmp_path).exit_code == 0
    again = run_cli("scan", ".", "--add-noqa", cwd=tmp_path)
    assert again.stdout == "Added 0 noqa directives to 0 files.\n" and path.read_bytes() == after


def test_existing_comments_line_endings_and_encoding_are_kept(run_cli, tmp_path):
    code = (
        "# -*- coding: latin-1 -*-\r\n"
        "import torch\r\n"
        "from torch.utils.data import DataLoader\r\n"
        "# donn\xe9es\r\n"
        f"{LOADER}  # tuned by hand\r\n"
        f"extra = DataLoader(extra_set, batch_size=32)  # noqa: E501\r\n"
        "for x, y in loader:\r\n"
        "    x = x.to('cuda')\r\n"
        "    model(x).sum().backward()\r\n"
        "    optimizer.step()\r\n"
        "for x, y in extra:\r\n"  # a loader is reported where the training iterates it
        "    model(x).sum().backward()\r\n"
        "    optimizer.step()\r\n"
    )
    path = tmp_path / "train.py"
    path.write_bytes(code.encode("latin-1"))
    result = run_cli("scan", "train.py", "--add-noqa", "--select", "SF1", cwd=tmp_path)
    assert result.exit_code == 0, result
    after = path.read_bytes().decode("latin-1")
    assert f"{LOADER}  # tuned by hand  # noqa: SF101, SF102\r\n" in after
    assert "extra = DataLoader(extra_set, batch_size=32)  # noqa: E501, SF101, SF102\r\n" in after  # one list
    assert "    x = x.to('cuda')  # noqa: SF104\r\n" in after
    assert "# donn\xe9es\r\n" in after and after.count("\r\n") == code.count("\r\n") and "\n" not in after.replace("\r\n", "")
    assert run_cli("scan", "train.py", "--select", "SF1", cwd=tmp_path).exit_code == 0


def test_a_bom_stays(run_cli, tmp_path):
    path = tmp_path / "train.py"
    path.write_bytes(b"\xef\xbb\xbfimport torch\nfrom torch.utils.data import DataLoader\n" + LOADER.encode() + b"\n")
    assert run_cli("scan", "train.py", "--add-noqa", "--select", "SF101", cwd=tmp_path).exit_code == 0
    assert path.read_bytes() == (b"\xef\xbb\xbfimport torch\nfrom torch.utils.data import DataLoader\n"
                                 + LOADER.encode() + b"  # noqa: SF101\n")


def test_a_line_that_cannot_take_a_comment_is_left_and_said(run_cli, tmp_path):
    code = (
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "loader = DataLoader(train_set, batch_size=32) if fast else \\\n"
        "    None\n"
        'other = DataLoader(train_set, collate_fn=make("""\n'
        'text"""))\n'
    )
    path = tmp_path / "train.py"
    path.write_text(code, encoding="utf-8")
    result = run_cli("scan", "train.py", "--add-noqa", "--select", "SF101", cwd=tmp_path)
    assert result.exit_code == 0 and path.read_text(encoding="utf-8") == code
    assert "Added 0 noqa directives to 0 files." in result.stdout
    assert "train.py: note: line 3 ends inside a string or after a backslash: no `# noqa` added there" in result.stderr
    assert "line 5 ends inside a string" in result.stderr


def test_notebook_cells_get_the_directive(run_cli, tmp_path):
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": ["# Training"]},
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
         "source": ["import torch\n", "from torch.utils.data import DataLoader"]},
        {"cell_type": "code", "metadata": {}, "execution_count": 3, "outputs": [{"output_type": "stream", "name": "stdout", "text": ["ok\n"]}],
         "source": ["%matplotlib inline\n", f"{LOADER}\n", "for x, y in loader:\n", "    loss = model(x.to('cuda')).sum()\n",
                    "    loss.backward()\n", "    optimizer.step()"]},
    ]
    notebook = {"cells": cells, "metadata": {"kernelspec": {"name": "python3"}}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "train.ipynb"
    path.write_text(json.dumps(notebook, indent=1) + "\n", encoding="utf-8")
    result = run_cli("scan", "train.ipynb", "--add-noqa", "--select", "SF1", cwd=tmp_path)
    assert result.exit_code == 0 and "Added 2 noqa directives to 1 file." in result.stdout
    saved = json.loads(path.read_text(encoding="utf-8"))
    source = saved["cells"][2]["source"]
    assert source[0] == "%matplotlib inline\n" and source[1] == f"{LOADER}  # noqa: SF101, SF102\n"
    assert source[3] == "    loss = model(x.to('cuda')).sum()  # noqa: SF104\n"
    assert saved["cells"][2]["outputs"] == cells[2]["outputs"] and saved["metadata"] == notebook["metadata"]
    assert run_cli("scan", "train.ipynb", "--select", "SF1", cwd=tmp_path).exit_code == 0


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")
def test_a_read_only_file_is_refused_and_the_others_written(run_cli, write, train_script, tmp_path):
    locked = write("locked.py", train_script)
    other = write("other.py", train_script)
    os.chmod(locked, 0o444)
    try:
        result = run_cli("scan", ".", "--add-noqa", cwd=tmp_path)
    finally:
        os.chmod(locked, 0o644)
    assert result.exit_code == 2 and "locked.py" in result.stderr
    assert locked.read_text(encoding="utf-8") == train_script and "# noqa: SF" in other.read_text(encoding="utf-8")


def test_add_noqa_is_not_combined_with_fixing(run_cli, write, train_script, tmp_path):
    path = write("train.py", train_script)
    for flag in ("--fix", "--diff"):
        result = run_cli("scan", ".", "--add-noqa", flag, cwd=tmp_path)
        assert result.exit_code == 2 and "--add-noqa cannot be combined with --fix or --diff" in result.stderr
    assert path.read_text(encoding="utf-8") == train_script


def test_findings_in_configuration_files_are_named_not_dropped(run_cli, tmp_path):
    project = tmp_path / "project"
    shutil.copytree(ROOT / "fixtures" / "projects" / "hf_deepspeed_lora", project)
    result = run_cli("scan", ".", "--add-noqa", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert ("SF906 at configs/ds_offload.json:7 is in a configuration file: no `# noqa` added there" in result.stderr)
    assert json.loads((project / "configs" / "ds_offload.json").read_text(encoding="utf-8"))  # still JSON
