"""Torch version targets: which torch the scanned script will run on.

Version-dependent advice (``set_to_none`` is the default since 2.0, ``torch.amp.GradScaler``
needs 2.3, ...) is judged against a *target* version: ``--torch-version``, else the
``torch-version`` config key, else the installed torch (read from package metadata, never
imported), else ``DEFAULT_TARGET``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache, total_ordering

DEFAULT_TARGET = "2.4"

_VERSION_RE = re.compile(r"^\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")
# A target a user writes: 2.4, 2.4.1, 2.5.0a0, 2.13.0+cpu; nothing else after the numbers.
_TARGET_RE = re.compile(r"^\s*v?\d+(?:\.\d+){0,2}(?:(?:a|b|rc|\.?dev|\.?post)\d*)*(?:\+[0-9A-Za-z.]+)?\s*$")
KNOWN_MAJORS = (1, 2)  # the torch releases there are


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


@lru_cache(maxsize=1)
def installed_torch_version() -> str | None:
    """The installed torch's version from its metadata (torch is not imported; read once)."""
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
