"""The GPUs a project's launch files ask for, where they say so.

A SLURM job script names the GPU it runs on: `#SBATCH --gres=gpu:v100:4`, `#SBATCH
--gpus=a100:8`, `#SBATCH --constraint=v100`. When every command that runs a script (``launch``)
sits in a file that asks for GPUs older than Ampere (V100, T4, P100, ...), advice that needs an
Ampere GPU (TF32, bf16) does not apply to the project's runs. Anything less certain (no job
script, a GPU without a type, one command on an A100) leaves the GPU unknown.
"""

from __future__ import annotations

import re
from pathlib import Path

from speedfix.model import launch
from speedfix.model.context import FileContext
from speedfix.model.project_files import MAX_BYTES
from speedfix.syntax.source import SourceError, read_bytes

# GPUs without TF32 or fast bf16 (Volta, Turing, Pascal, Kepler), as job scripts name them.
PRE_AMPERE = frozenset({
    "v100", "v100s", "v100-sxm2", "v100-pcie", "t4", "p100", "p40", "p4", "k80", "k40", "m40", "m60",
    "titanv", "titanxp", "titanx", "gtx1080ti", "1080ti", "rtx2080ti", "2080ti", "quadro_rtx_8000",
})
_REQUEST = re.compile(
    r"^\s*#SBATCH\s+(?:--gres[= ]\s*gpu:|--gpus(?:-per-node|-per-task)?[= ]\s*|--constraint[= ]\s*|-C\s+)"
    r"['\"]?(?P<kind>[A-Za-z][\w.-]*)", re.MULTILINE)


def launch_gpus(ctx: FileContext) -> frozenset[str] | None:
    """The GPU types (lower case) the launch files of every command that runs the script ask
    for; None when a command's file names no type (or the project shows no command)."""
    project = ctx.project
    if project is None or not _some_file_asks(ctx):
        return None  # no command can sit in a file that names a GPU: no need to find them
    commands = launch.launches(ctx)
    if not commands:
        return None
    kinds: set[str] = set()
    for command in commands:
        found = {match.group("kind").lower() for match in _REQUEST.finditer(project.text(command.file) or "")}
        if not found:
            return None
        kinds |= found
    return frozenset(kinds)


def _some_file_asks(ctx: FileContext) -> bool:
    """Does a file that may hold a command of the script ask for a GPU type: one of its launch
    files, or the script itself when its docstring may hold commands?"""
    project = ctx.project
    assert project is not None
    if launch.has_docstring(ctx) and _mentions_sbatch(project.script):
        return True
    return any(_asks(project.text(path)) for path in launch.launch_files(project))


def _asks(text: str | None) -> bool:
    return text is not None and "#SBATCH" in text and _REQUEST.search(text) is not None


def _mentions_sbatch(script: Path) -> bool:
    """Does the script's own code hold `#SBATCH`? Read as bytes: the script is no project file
    to take notes about (a script too big or not UTF-8 has its own report)."""
    try:
        return b"#SBATCH" in read_bytes(script, MAX_BYTES)
    except SourceError:
        return False


def pre_ampere_only(ctx: FileContext) -> str | None:
    """The GPU the project's job scripts run the script on when all are older than Ampere
    (`v100`), else None."""
    kinds = launch_gpus(ctx)
    if not kinds or not kinds <= PRE_AMPERE:
        return None
    return ", ".join(sorted(kinds))
