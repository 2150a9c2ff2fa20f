"""Torch version targets: which torch the scanned script will run on.

Version-dependent advice (``set_to_none`` is the default since 2.0, ``torch.amp.GradScaler``
needs 2.3, ...) is judged against a *target* version: ``--torch-version``, else the
``torch-version`` config key, else the installed torch (read from package metadata, never
imported), else ``DEFAULT_TARGET``; without an explicit version, a project that pins torch
(`torch<2` in its requirements) moves that target into the range it pins (``project_target``).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from functools import lru_cache, total_ordering
from pathlib import Path

from speedfix.model.project_files import ProjectFiles

DEFAULT_TARGET = "2.4"

_VERSION_RE = re.compile(r"^\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")
# A target a user writes: 2.4, 2.4.1, 2.5.0a0, 2.13.0+cpu; nothing else after the numbers.
_TARGET_RE = re.compile(r"^\s*v?\d+(?:\.\d+){0,2}(?:(?:a|b|rc|\.?dev|\.?post)\d*)*(?:\+[0-9A-Za-z.]+)?\s*$")
KNOWN_MAJORS = (0, 1, 2)  # the torch releases there are


@total_ordering
@dataclass(frozen=True)
class TorchVersion:
    major: int
    minor: int = 0
    patch: int = 0

    @classmethod
    def parse(cls, text: str) -> TorchVersion:
        """Parse ``2.4``, ``2.13.0+cpu``, ``1.13.1`` (local and pre-release tags are ignored)."""
        match = _VERSION_RE.match(text)
        if not match:
            raise ValueError(f"not a torch version: {text!r} (expected e.g. 2.4 or 2.13.0)")
        major, minor, patch = (int(part) if part else 0 for part in match.groups())
        return cls(major, minor, patch)

    @classmethod
    def parse_target(cls, text: str) -> TorchVersion:
        """A target version as a user writes it: ``parse``, but the whole text must be a version
        (``1.x`` is not) of a torch that exists (``99`` is not). Raises ValueError."""
        if not _TARGET_RE.match(text):
            raise ValueError(f"not a torch version: {text!r} (expected e.g. 2.4 or 2.13.0)")
        version = cls.parse(text)
        if version.major not in KNOWN_MAJORS:
            known = " or ".join(f"{major}.x" for major in KNOWN_MAJORS)
            raise ValueError(f"no torch {text.strip()} exists (expected a {known} version, e.g. 2.4)")
        return version

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, TorchVersion):
            return NotImplemented
        return (self.major, self.minor, self.patch) < (other.major, other.minor, other.patch)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}" if self.patch == 0 else f"{self.major}.{self.minor}.{self.patch}"


@dataclass(frozen=True)
class TorchRange:
    """The torch versions a rule's advice applies to: from ``min_torch`` on, before ``max_torch``.
    Below ``min_torch``, a rule with ``upgrade_for`` (what is worth upgrading torch for) still runs
    and advises the upgrade."""

    min_torch: TorchVersion | None = None
    max_torch: TorchVersion | None = None
    upgrade_for: str | None = None

    def applies_to(self, version: TorchVersion) -> bool:
        if self.min_torch is not None and version < self.min_torch:
            return False
        return self.max_torch is None or version < self.max_torch

    def advises_upgrade(self, version: TorchVersion) -> bool:
        return self.upgrade_for is not None and self.min_torch is not None and version < self.min_torch


@lru_cache(maxsize=1)
def installed_torch_version() -> str | None:
    """The installed torch's version from its metadata, as ``importlib.metadata`` finds it (torch
    is not imported): the first folder of the import path with torch's `.dist-info` or
    `.egg-info`. The folders are read here: importing ``importlib.metadata`` would cost more
    than the search (a twentieth of loading the engine). An archive on the path (a zip, an egg)
    is left to ``importlib.metadata``."""
    for entry in sys.path:
        folder = entry or "."
        try:
            names = os.listdir(folder)
        except NotADirectoryError:
            return _metadata_version()
        except OSError:
            continue
        for name in names:
            stem, dot, suffix = name.rpartition(".")
            if suffix in ("dist-info", "egg-info") and dot and _normalized(stem.split("-")[0]) == "torch":
                version = _version_field(os.path.join(folder, name))
                if version is not None:
                    return version
    return None


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _version_field(path: str) -> str | None:
    """The `Version:` header of a `.dist-info`'s METADATA or an `.egg-info`'s PKG-INFO (which is
    the `.egg-info` itself when it is a file)."""
    candidates = [path] if os.path.isfile(path) else [os.path.join(path, "METADATA"), os.path.join(path, "PKG-INFO")]
    for candidate in candidates:
        try:
            with open(candidate, encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    if not line.strip():
                        break  # the headers end at the first empty line
                    if line.startswith("Version:"):
                        return line[len("Version:"):].strip()
        except OSError:
            continue
    return None


def _metadata_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def resolve_target(cli_value: str | None, config_value: str | None) -> TorchVersion:
    for candidate in (cli_value, config_value):
        if candidate:
            return TorchVersion.parse(candidate)
    return TorchVersion.parse(installed_torch_version() or DEFAULT_TARGET)


def v(text: str) -> TorchVersion:
    """Shorthand for rule tables: ``v("2.3")``."""
    return TorchVersion.parse(text)


# ---------------------------------------------------------------- the torch a project pins
# `torch==1.13.1`, `torch>=1.10,<2`, `"torch~=2.1.0"`: a requirement on torch itself (not
# torchvision, not pytorch-lightning), in requirements*.txt, pyproject.toml, setup.py or setup.cfg;
# also under conda's name, `pytorch==1.3.1`, as environment exports write it into requirements.txt.
def _requirement(*names: str) -> re.Pattern[str]:
    return re.compile(
        r"(?<![\w.-])(?P<name>" + "|".join(map(re.escape, names)) + r")(?![\w.-])\s*(?:\[[^\]\n]*\])?\s*"
        r"(?P<spec>(?:===|==|!=|~=|<=|>=|<|>)\s*[\w.*+!]+(?:\s*,\s*(?:===|==|!=|~=|<=|>=|<|>)\s*[\w.*+!]+)*)"
    )


_REQUIREMENT = _requirement("torch", "pytorch")
_CLAUSE = re.compile(r"(===|==|!=|~=|<=|>=|<|>)\s*([\w.*+!]+)")
_PIN_FILES = ("pyproject.toml", "setup.py", "setup.cfg", "environment.yml", "environment.yaml", "conda.yml", "conda.yaml",
              "env.yml", "env.yaml")
_CONDA_FILES = frozenset(_PIN_FILES[3:])
# A conda environment's `- pytorch=1.11.0` (or `=1.11.0=py3.8_cuda11.3_0`): one `=` is conda's "this version".
_CONDA_PIN = re.compile(r"^\s*-\s*(?:[\w-]+::)?(?P<name>pytorch|torch)\s*=\s*(?P<version>\d+(?:\.\d+)*)(?![\w.])")
# The last minor release of each major version, for "the newest torch below 2.0".
_LAST_MINOR = {0: 4, 1: 13}


@dataclass(frozen=True)
class TorchPin:
    """A project's requirement on torch: the file it was read from and its clauses."""

    path: Path
    clauses: tuple[tuple[str, str], ...]
    name: str = "torch"  # `pytorch` where the file says so
    via: str = ""  # the requirement that implies it, where no file names torch (`pytorch-lightning==1.7.7`)

    @property
    def spec(self) -> str:
        """As written, less spaces: `torch==0.4.1`, `torch>=1.10,<2`."""
        return self.name + ",".join(op + text for op, text in self.clauses)

    @property
    def shown(self) -> str:
        """For a message: `` `torch==0.4.1` ``; an implied pin says what implies it."""
        return f"`{self.via}` (so `{self.spec}`)" if self.via else f"`{self.spec}`"


def torch_pin(project: ProjectFiles) -> TorchPin | None:
    """The project's torch requirement, read from the nearest folder, going up from the script
    to the project's top, whose requirement files name torch (None: no pin); once per folder in
    a scan."""
    return project.recorded(("torch pin", project.folder), lambda: _torch_pin(project))


def _torch_pin(project: ProjectFiles) -> TorchPin | None:
    """The requirement files of the nearest folder that name torch (a Poetry table's `torch =
    "..."` too); else an install command of a README (`pip install torch==1.11.0`); else a
    Lightning pin that implies an old torch."""
    folders = project.folders_up()
    # Each folder's own answer is read once per scan: the scripts of a project share the folders above them.
    for read in (_requirement_pin, _readme_pin, _implied_pin):
        for folder in folders:
            pin = project.recorded((read.__name__, folder), lambda: read(project, folder))
            if pin is not None:
                return pin
    return None


def _requirement_pin(project: ProjectFiles, folder: Path) -> TorchPin | None:
    """The torch that the requirement files of ``folder`` itself name."""
    found = [(path, _torch_clauses(project.text(path) or "", path)) for path in _pin_files(project, folder)]
    clauses = tuple(dict.fromkeys(c for _, pinned in found for c in pinned))  # requirements.txt and pyproject.toml may agree
    if not clauses:
        return None
    path = next(path for path, pinned in found if pinned)
    named = _REQUIREMENT.search(project.text(path) or "")
    return TorchPin(path, clauses, named.group("name") if named else "torch")


def _readme_pin(project: ProjectFiles, folder: Path) -> TorchPin | None:
    """The torch that an install command of a README of ``folder`` names, or the row of a table
    of the versions it was run with (`| PyTorch | 1.12.1 |`)."""
    for path in project.listing(folder, (".md", ".rst", ".txt")):
        if path.name.lower().startswith("readme"):
            clauses, name = _install_clauses(project.text(path) or "")
            if clauses:
                return TorchPin(path, clauses, name)
    return None


# `pip install torch==1.11.0 --extra-index-url ...`, `conda install pytorch==1.12.1 -c pytorch`: the
# torch a README tells its users to install, on a line that runs an installer.
_INSTALL_LINE = re.compile(r"\b(?:pip3?|conda|mamba|uv pip)\s+install\b")


def _install_clauses(text: str) -> tuple[tuple[tuple[str, str], ...], str]:
    for line in text.splitlines():
        if _INSTALL_LINE.search(line):
            match = _REQUIREMENT.search(line)
            if match:
                return tuple(_CLAUSE.findall(match.group("spec"))), match.group("name")
    table = _TABLE_PIN.search(text)  # a table of the versions the authors used: `| PyTorch | 1.12.1 |`
    if table:
        return (("==", table.group("version")),), "torch"
    return (), "torch"


_TABLE_PIN = re.compile(r"^\s*\|\s*(?:py)?torch\s*\|\s*v?(?P<version>\d+\.\d+(?:\.\d+)?)\s*\|", re.IGNORECASE | re.MULTILINE)


# Lightning releases before 1.9 do not run on torch 2 (1.9 was the first to admit it, 2.0 the
# first built for it): a project that pins such a Lightning pins a torch below 2 with it.
_LIGHTNING = _requirement("pytorch-lightning", "pytorch_lightning", "lightning")
_LIGHTNING_FOR_TORCH_2 = TorchVersion(1, 9)


def _implied_pin(project: ProjectFiles, folder: Path) -> TorchPin | None:
    """The torch below 2 that a Lightning 1.x pinned in the requirement files of ``folder`` implies."""
    for path in _pin_files(project, folder):
        text = project.text(path) or ""
        clauses = _torch_clauses(text, path, _LIGHTNING)
        named = _LIGHTNING.search(text)
        if clauses and named is not None and _only_below(clauses, _LIGHTNING_FOR_TORCH_2):
            via = named.group("name") + ",".join(op + version for op, version in clauses)
            return TorchPin(path, (("<", "2"),), via=via)
    return None


def project_target(project: ProjectFiles, current: TorchVersion) -> TorchVersion:
    """The torch a project's pinned requirement allows, as close to ``current`` (the installed
    torch, else the default) as it allows: a pin that admits ``current`` changes nothing; one
    that excludes it (`torch<2`, `torch==1.13.1`) moves the target to the newest version it
    allows below ``current`` (or the oldest above it). The pin is ``torch_pin``'s."""
    pin = torch_pin(project)
    return current if pin is None else _clamp(current, list(pin.clauses))


def _pin_files(project: ProjectFiles, folder: Path) -> list[Path]:
    found = [p for p in project.listing(folder, (".txt",)) if p.name.startswith("requirements")]
    found.extend(folder / name for name in _PIN_FILES if project.is_file(folder / name))
    return found


def required(project: ProjectFiles, pattern: re.Pattern[str]) -> str | None:
    """The first name ``pattern`` finds in the requirement files of the script's folder and the
    folders above it, up to the project's top (the files the torch pin is read from)."""
    for folder in project.folders_up():
        found = project.recorded(("required", pattern.pattern, folder), lambda: _required_in(project, folder, pattern))
        if found is not None:
            return found
    return None


def _required_in(project: ProjectFiles, folder: Path, pattern: re.Pattern[str]) -> str | None:
    """What ``pattern`` finds first in the requirement files of ``folder`` itself (once per folder
    in a scan, as the torch pin)."""
    for path in _pin_files(project, folder):
        found = pattern.search(project.text(path) or "")
        if found:
            return found.group(0)
    return None


def pinned_below(project: ProjectFiles, package: str, version: TorchVersion) -> bool:
    """Does the project pin ``package`` (`transformers==4.7.0`) to versions older than ``version``
    only? Read like the torch pin: the nearest folder whose requirement files name it."""
    pattern = _requirement(package)
    for folder in project.folders_up():
        clauses = [c for path in _pin_files(project, folder)
                   for c in _torch_clauses(project.text(path) or "", path, pattern)]
        if clauses:
            return _only_below(clauses, version)
    return False


def _only_below(clauses: list[tuple[str, str]], version: TorchVersion) -> bool:
    """Do the clauses (`==1.7.7`, `<2`) admit versions older than ``version`` only?"""
    try:
        bounds = [(op, TorchVersion.parse(text)) for op, text in clauses if "*" not in text]
    except ValueError:
        return False
    return any((op in ("==", "===", "<=") and bound < version) or (op == "<" and bound <= version)
               for op, bound in bounds)


def lightning_before_2(project: ProjectFiles | None) -> bool:
    """Does the project pin a Lightning 1.x (`pytorch-lightning==1.7.7`), whose bf16 precision is
    `"bf16"` (`"bf16-mixed"` came with 2.0)?"""
    return _lightning_below(project, TorchVersion(2))


def lightning_before_bf16(project: ProjectFiles | None) -> bool:
    """Does the project pin a Lightning older than 1.5 (`pytorch_lightning==1.1.6`), which has no
    bf16 precision (16 is its mixed precision)?"""
    return _lightning_below(project, TorchVersion(1, 5))


def _lightning_below(project: ProjectFiles | None, version: TorchVersion) -> bool:
    return project is not None and any(pinned_below(project, name, version) for name in
                                       ("pytorch-lightning", "pytorch_lightning", "lightning"))


def _torch_clauses(text: str, path: Path, pattern: re.Pattern[str] = _REQUIREMENT) -> list[tuple[str, str]]:
    clauses: list[tuple[str, str]] = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        for match in pattern.finditer(line.split(" #")[0]):
            clauses.extend(_CLAUSE.findall(match.group("spec")))
        if pattern is _REQUIREMENT and (wheel := _WHEEL.search(line.split(" #")[0])):
            clauses.append(("==", wheel.group("version")))  # `torch @ https://.../torch-1.12.1%2Bcu113-...whl`
        if pattern is _REQUIREMENT and path.name == "pyproject.toml":
            clauses.extend(_poetry_clauses(line))
        if pattern is _REQUIREMENT and path.name in _CONDA_FILES and (conda := _CONDA_PIN.match(line)):
            clauses.append(("==", conda.group("version")))
    return list(dict.fromkeys(clauses))  # requirements per Python version may repeat one


# A requirement on a wheel's URL, as `pip freeze` and Poetry write it: `torch @ https://.../torch-
# 1.12.1%2Bcu113-cp39-cp39-linux_x86_64.whl`, `torch = { url = "https://.../torch-1.12.1+cu113-...whl" }`.
_WHEEL = re.compile(r"^\s*(?:torch|pytorch)\s*(?:@|=\s*\{[^}]*\burl\s*=)\s*[\"']?\S*?/torch-(?P<version>\d+(?:\.\d+){1,2})"
                    r"(?:%2[Bb]|\+|-)")

# Poetry's table: `torch = ">=1.10.1, < 1.13.0"`, `torch = "^1.12"`, `torch = {version = "~1.13", ...}`.
_POETRY = re.compile(r"""^\s*(?:torch|pytorch)\s*=\s*(?:\{[^}]*?\bversion\s*=\s*)?["']([^"']+)["']""")


def _poetry_clauses(line: str) -> list[tuple[str, str]]:
    match = _POETRY.match(line)
    if match is None:
        return []
    clauses: list[tuple[str, str]] = []
    for part in match.group(1).split(","):
        part = part.strip()
        if part[:1] in ("^", "~") and part[1:2] != "=":
            try:
                low = TorchVersion.parse(part[1:])
            except ValueError:
                continue
            dots = part.count(".")
            if part[0] == "^":  # ^1.12 -> >=1.12,<2; ^0.4 -> >=0.4,<0.5
                high = TorchVersion(low.major + 1) if low.major else TorchVersion(0, low.minor + 1)
            else:  # ~1.12 -> >=1.12,<1.13; ~1 -> >=1,<2
                high = TorchVersion(low.major, low.minor + 1) if dots else TorchVersion(low.major + 1)
            clauses += [(">=", part[1:]), ("<", str(high))]
        else:
            clauses.extend(_CLAUSE.findall(part))
    return clauses


def _clamp(current: TorchVersion, clauses: list[tuple[str, str]]) -> TorchVersion:
    parsed: list[tuple[str, TorchVersion, bool]] = []
    for op, text in clauses:
        try:
            version = TorchVersion.parse(text)
        except ValueError:
            return current  # a version we cannot read: keep the target as it is
        if op == "~=":  # `~=2.1.0` is >=2.1.0,<2.2; `~=1.12` is >=1.12,<2
            parts = len(text.split("."))
            end = TorchVersion(version.major, version.minor + 1) if parts >= 3 else TorchVersion(version.major + 1)
            parsed.extend([(">=", version, False), ("<", end, False)])
        else:
            parsed.append((op, version, text.endswith("*")))
    if _allows(parsed, current):
        return current
    exact = [version for op, version, wild in parsed if op in ("==", "===") and not wild]
    if exact:
        return exact[0]
    below = [candidate for candidate in _upper_candidates(parsed) if candidate < current and _allows(parsed, candidate)]
    if below:
        return max(below)
    above = [version for op, version, _ in parsed if op in (">=", "==") and _allows(parsed, version)]
    return min(above) if above else current


def _allows(clauses: list[tuple[str, TorchVersion, bool]], version: TorchVersion) -> bool:
    for op, bound, wild in clauses:
        if wild:
            if _same_prefix(version, bound) == (op == "!="):
                return False
            continue
        ok = {
            "==": version == bound, "===": version == bound, "!=": version != bound, "<": version < bound,
            "<=": version <= bound, ">": version > bound, ">=": version >= bound,
        }[op]
        if not ok:
            return False
    return True


def _same_prefix(version: TorchVersion, bound: TorchVersion) -> bool:
    """`==1.13.*`: the same major and minor (a patch wildcard is rare enough to read this way)."""
    return (version.major, version.minor) == (bound.major, bound.minor)


def _upper_candidates(clauses: list[tuple[str, TorchVersion, bool]]) -> list[TorchVersion]:
    found = []
    for op, bound, wild in clauses:
        if op == "<=" or (op in ("==", "===") and wild):
            found.append(bound)
        elif op == "<":
            found.append(_previous(bound))
    return found


def _previous(version: TorchVersion) -> TorchVersion:
    """The newest release before ``version`` (`<2.1` -> 2.0, `<2` -> 1.13)."""
    if version.patch:
        return TorchVersion(version.major, version.minor, version.patch - 1)
    if version.minor:
        return TorchVersion(version.major, version.minor - 1)
    return TorchVersion(version.major - 1, _LAST_MINOR.get(version.major - 1, 0))
