"""``[tool.speedfix]`` in pyproject.toml, merged with the command line (the command line wins).

The configuration is the nearest ``pyproject.toml`` with a ``[tool.speedfix]`` table, found by
walking up from the scanned paths' common folder (or given with ``--config``). Its folder is the
root that ``exclude`` and ``per-file-ignores`` patterns are relative to.
"""

from __future__ import annotations

import fnmatch
import math
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from speedfix.engine.catalog import known_selector, matches, selected_codes
from speedfix.engine.findings import Impact
from speedfix.model.versions import TorchVersion, resolve_target
from speedfix.syntax import deadline
from speedfix.syntax.source import DEFAULT_MAX_FILE_SIZE, FileTooLarge, SourceError, read_bytes, size_limit_text

if TYPE_CHECKING:
    from speedfix.engine.rule import Rule

_LIST_KEYS = {"select", "ignore", "extend-select", "exclude", "extend-exclude"}
_KNOWN_KEYS = _LIST_KEYS | {
    "unsafe-fixes", "per-file-ignores", "torch-version", "output-format", "respect-gitignore", "cache",
    "force-exclude", "max-file-size-mb", "file-time-limit", "min-impact",
}


class ConfigError(Exception):
    """An invalid configuration; the message names the file and the key."""


@dataclass(frozen=True)
class Settings:
    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    unsafe_fixes: bool = False
    exclude: tuple[str, ...] = ()
    per_file_ignores: dict[str, tuple[str, ...]] = field(default_factory=dict)
    torch_version: str | None = None
    output_format: str = "text"
    respect_gitignore: bool = True
    cache: bool = True
    force_exclude: bool = False
    max_file_size: int | None = DEFAULT_MAX_FILE_SIZE  # bytes; a bigger file is skipped (None: no cap)
    file_time_limit: float | None = deadline.DEFAULT_SECONDS  # seconds of analysis per file (None: none)
    min_impact: Impact = Impact.LOW  # findings of a lower impact are left out (scan) and not fixed (apply)
    root: Path = field(default_factory=Path.cwd)
    config_file: Path | None = None

    @property
    def target(self) -> TorchVersion:
        return resolve_target(None, self.torch_version)

    def codes(self) -> tuple[str, ...]:
        """The codes of the enabled rules (no rule is imported)."""
        return _selected(self.select, self.ignore, self.extend_select)

    def codes_for(self, path: Path) -> tuple[str, ...]:
        """The enabled codes minus the file's ``per-file-ignores``."""
        ignored = self.ignored_for(path)
        codes = self.codes()
        if not ignored:
            return codes
        return tuple(code for code in codes if not any(matches(code, s) for s in ignored))

    def rules(self) -> tuple[type[Rule], ...]:
        """The enabled rules' classes (imported on first use: a scan of cached files needs none)."""
        from speedfix.engine.registry import all_rules

        codes = set(self.codes())
        return tuple(rule for rule in all_rules() if rule.code in codes)

    def rules_for(self, path: Path) -> tuple[type[Rule], ...]:
        """The enabled rules minus the file's ``per-file-ignores``."""
        codes = set(self.codes_for(path))
        return tuple(rule for rule in self.rules() if rule.code in codes)

    def ignored_for(self, path: Path) -> list[str]:
        if not self.per_file_ignores:
            return []
        relative = _relative(path, self.root)
        ignored: list[str] = []
        for pattern, codes in self.per_file_ignores.items():
            if fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(path.name, pattern):
                ignored.extend(codes)
        return ignored

    def fingerprint(self) -> str:
        """Everything that changes results, for the scan cache key."""
        return repr(
            (
                sorted(self.codes()),
                sorted((k, tuple(v)) for k, v in self.per_file_ignores.items()),
                str(self.target),
            )
        )


@lru_cache(maxsize=32)
def _selected(select: tuple[str, ...] | None, ignore: tuple[str, ...], extend_select: tuple[str, ...]) -> tuple[str, ...]:
    """Rule selection, computed once per distinct selection (it is asked for every file)."""
    return selected_codes(select, ignore, extend_select)


def _relative(path: Path, root: Path) -> str:
    try:
        return Path(os.path.relpath(real_path(path), real_path(root))).as_posix()
    except ValueError:  # another drive on Windows
        return path.as_posix()


def find_config(start: Path) -> Path | None:
    """The nearest pyproject.toml with a [tool.speedfix] table at or above ``start``."""
    start = real_path(start)
    folder = start if start.is_dir() else start.parent
    for candidate in (folder, *folder.parents):
        pyproject = candidate / "pyproject.toml"
        # A pyproject.toml that cannot be read is an error, not a file to skip: it may hold the
        # user's select/ignore/exclude, and scanning without them would be silently wrong.
        if pyproject.is_file() and "speedfix" in _tool_table(_read_toml(pyproject), pyproject):
            return pyproject
    return None


# A configuration file bigger than this is not one.
MAX_CONFIG_BYTES = 10 * 1024 * 1024


def _read_toml(pyproject: Path) -> dict[str, Any]:
    try:  # a regular file of sane size: `--config /dev/zero` or a FIFO must not hang the run
        return tomllib.loads(read_bytes(pyproject, MAX_CONFIG_BYTES).decode("utf-8"))
    except FileTooLarge:
        raise ConfigError(f"{pyproject}: cannot read: larger than {size_limit_text(MAX_CONFIG_BYTES)}") from None
    except SourceError as exc:
        raise ConfigError(f"{pyproject}: cannot read: {str(exc).removeprefix('skipped: ')}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{pyproject}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"{pyproject}: invalid TOML: {exc} (fix it, or pass --config FILE or --isolated)"
        ) from None
    except RecursionError:
        raise ConfigError(f"{pyproject}: invalid TOML: nested too deeply (fix it, or pass --config FILE or --isolated)") from None



def _tool_table(data: dict[str, Any], pyproject: Path) -> dict[str, Any]:
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        raise ConfigError(f"{pyproject}: `tool` must be a table (`[tool.speedfix]`), not {_toml_type(tool)}")
    return tool


def _toml_type(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array"}
    return names.get(type(value), f"a {type(value).__name__}")


def real_path(path: Path) -> Path:
    """``path`` with symbolic links resolved as far as they go; a link loop is left as it is
    (``Path.resolve`` raises on one before Python 3.13, and a loop must not stop a scan).
    Within ``real_paths_kept``, once per path."""
    if _REAL is None:
        return Path(os.path.realpath(path))
    found = _REAL.get(path)
    if found is None:
        found = _REAL[path] = Path(os.path.realpath(path))
    return found


# Within one scan, a path's links are resolved once: every step of a scan (discovery, the cache,
# the links between files) asks for the same paths, and each answer costs a system call per part.
_REAL: dict[Path, Path] | None = None


@contextmanager
def real_paths_kept() -> Iterator[None]:
    """Keep the paths ``real_path`` resolves until the block ends (one scan: its files' links are
    taken as they are when it starts)."""
    global _REAL
    outer = _REAL
    if outer is None:
        _REAL = {}
    try:
        yield
    finally:
        _REAL = outer


def load_config(pyproject: Path, output_formats: Sequence[str] | None = None) -> Settings:
    data = _read_toml(pyproject)
    table = _tool_table(data, pyproject).get("speedfix", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{pyproject}: [tool.speedfix] must be a table")
    return settings_from_table(table, source=str(pyproject), root=pyproject.parent, config_file=pyproject,
                               output_formats=output_formats)


def settings_from_table(table: dict[str, Any], *, source: str, root: Path, config_file: Path | None,
                        output_formats: Sequence[str] | None = None) -> Settings:
    """Settings from a ``[tool.speedfix]`` table; ``output_formats``: the names `output-format`
    may take (the output layer knows them; None: not checked)."""
    unknown = sorted(set(table) - _KNOWN_KEYS)
    if unknown:
        raise ConfigError(
            f"{source}: unknown key(s) in [tool.speedfix]: {', '.join(unknown)} "
            f"(known: {', '.join(sorted(_KNOWN_KEYS))})"
        )
    values: dict[str, Any] = {"root": root, "config_file": config_file}
    for key in _LIST_KEYS & set(table):
        items = table[key]
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            raise ConfigError(f"{source}: `{key}` must be a list of strings")
        values[key.replace("-", "_")] = tuple(items)
    if "extend_exclude" in values:
        values["exclude"] = values.get("exclude", ()) + values.pop("extend_exclude")
    for key in ("unsafe-fixes", "respect-gitignore", "cache", "force-exclude"):
        if key in table:
            if not isinstance(table[key], bool):
                raise ConfigError(f"{source}: `{key}` must be true or false")
            values[key.replace("-", "_")] = table[key]
    if "torch-version" in table:
        version = str(table["torch-version"])
        try:
            TorchVersion.parse_target(version)
        except ValueError as exc:
            raise ConfigError(f"{source}: `torch-version`: {exc}") from None
        values["torch_version"] = version
    if "output-format" in table:
        if output_formats is not None and table["output-format"] not in output_formats:
            raise ConfigError(f"{source}: `output-format` must be one of {', '.join(output_formats)}")
        values["output_format"] = table["output-format"]
    if "per-file-ignores" in table:
        mapping = table["per-file-ignores"]
        if not isinstance(mapping, dict) or not all(
            isinstance(codes, list) and all(isinstance(c, str) for c in codes) for codes in mapping.values()
        ):
            raise ConfigError(f"{source}: `per-file-ignores` must map glob patterns to lists of codes")
        values["per_file_ignores"] = {pattern: tuple(codes) for pattern, codes in mapping.items()}
    if "min-impact" in table:
        values["min_impact"] = _impact(table["min-impact"], f"{source}: `min-impact`")
    if "max-file-size-mb" in table:
        values["max_file_size"] = max_file_size(_non_negative(table["max-file-size-mb"], f"{source}: `max-file-size-mb`"))
    if "file-time-limit" in table:
        values["file_time_limit"] = time_limit(_non_negative(table["file-time-limit"], f"{source}: `file-time-limit`"))
    settings = Settings(**values)
    check_selectors(settings, source)
    return settings


def _non_negative(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:  # nan too
        raise ConfigError(f"{what} must be a number >= 0 (0: no limit)")
    return float(value)


def _impact(value: object, what: str) -> Impact:
    try:
        return Impact.parse(value) if isinstance(value, str) else Impact.parse(repr(value))
    except ValueError as exc:
        raise ConfigError(f"{what} {exc}") from None


def max_file_size(megabytes: float) -> int | None:
    """Bytes from a `max-file-size-mb` value; 0 (and inf, or so much it overflows) means no cap."""
    size = megabytes * 1024 * 1024
    return round(size) if 0 < size < math.inf else None


def time_limit(seconds: float) -> float | None:
    """A `file-time-limit` value; 0 (and inf) means no limit."""
    return seconds if 0 < seconds < math.inf else None


def check_selectors(settings: Settings, source: str) -> None:
    selectors: list[str] = list(settings.select or ()) + list(settings.ignore) + list(settings.extend_select)
    for codes in settings.per_file_ignores.values():
        selectors.extend(codes)
    for selector in selectors:
        if not known_selector(selector):
            raise ConfigError(f"{source}: unknown rule selector `{selector}` (see `speedfix rules`)")


def split_codes(values: Iterable[str] | None) -> tuple[str, ...] | None:
    """``--select SF101,SF102 --select SF3`` -> ("SF101", "SF102", "SF3")."""
    if values is None:
        return None
    return tuple(code.strip().upper() for value in values for code in value.split(",") if code.strip())


def resolve_settings(
    paths: list[Path],
    *,
    config: Path | None = None,
    select: list[str] | None = None,
    ignore: list[str] | None = None,
    extend_select: list[str] | None = None,
    torch_version: str | None = None,
    unsafe_fixes: bool | None = None,
    output_format: str | None = None,
    isolated: bool = False,
    force_exclude: bool | None = None,
    max_file_size_mb: float | None = None,
    file_time_limit: float | None = None,
    min_impact: str | None = None,
    output_formats: Sequence[str] | None = None,
) -> Settings:
    """Settings for a run: the config file found for ``paths``, then the command line on top
    (``output_formats``: the names the config's `output-format` may take; None: not checked)."""
    if config is not None:
        settings = load_config(config, output_formats)
    elif isolated:
        settings = Settings()
    else:
        base = _common_folder(paths)
        found = find_config(base)
        settings = load_config(found, output_formats) if found else Settings(root=base if base.is_dir() else base.parent)
    overrides: dict[str, Any] = {}
    if (codes := split_codes(select)) is not None:
        overrides["select"] = codes
    if (codes := split_codes(ignore)) is not None:
        overrides["ignore"] = settings.ignore + codes
    if (codes := split_codes(extend_select)) is not None:
        overrides["extend_select"] = settings.extend_select + codes
    if torch_version is not None:
        try:
            TorchVersion.parse_target(torch_version)
        except ValueError as exc:
            raise ConfigError(f"--torch-version: {exc}") from None
        overrides["torch_version"] = torch_version
    if unsafe_fixes is not None:
        overrides["unsafe_fixes"] = unsafe_fixes
    if output_format is not None:
        overrides["output_format"] = output_format
    if force_exclude:
        overrides["force_exclude"] = True
    if max_file_size_mb is not None:
        overrides["max_file_size"] = max_file_size(_non_negative(max_file_size_mb, "--max-file-size-mb"))
    if file_time_limit is not None:
        overrides["file_time_limit"] = time_limit(_non_negative(file_time_limit, "--file-time-limit"))
    if min_impact is not None:
        overrides["min_impact"] = _impact(min_impact, "--min-impact")
    settings = replace(settings, **overrides)
    check_selectors(settings, "command line")
    return settings


def _common_folder(paths: list[Path]) -> Path:
    if not paths:
        return Path.cwd()
    resolved = [real_path(p) for p in paths]
    try:
        common = Path(os.path.commonpath([str(p) for p in resolved]))
    except ValueError:
        common = resolved[0]
    return common
