"""YAML and JSON configuration files as trees of values that know where they are written.

A finding about a configuration value points at the line that sets it
(`configs/trainer/default.yaml:9:1`), so every value keeps its ``Location``. YAML is read with
PyYAML's *composer* and safe scalar construction only: no tag runs code, no object is built,
and an unknown tag (`!!python/object`) is just an unknown value (``UNKNOWN``). A file with
aliases that would expand to more than ``MAX_NODES`` values is refused. JSON is read with the
standard library (what DeepSpeed and the Hugging Face parsers do); its positions come from the
same composer, JSON being YAML.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from speedfix.model.project_files import Location, ProjectFiles

MAX_NODES = 100_000
UNKNOWN: Any = ...  # a value that cannot be known (an unknown tag, an interpolation)
_COLLECTION_TAGS = frozenset(f"tag:yaml.org,2002:{kind}" for kind in ("map", "seq", "omap", "pairs", "set"))
_INTERPOLATION = re.compile(r"\$\{[^}]*\}")


class ConfigError(Exception):
    """The file is not the YAML/JSON it claims to be; the message names the problem."""


class TooDeep(ConfigError):
    """Valid, but nested deeper than any configuration (a hostile file): left unread."""

    def __init__(self) -> None:
        super().__init__("nested too deeply to read")


# No configuration nests this deep; deeper trees would only be walked by recursion.
MAX_NESTING = 100


@dataclass
class Node:
    """A value (a scalar, or ``dict[str, Node]``/``list[Node]``), where it is written, and for a
    mapping entry where its key is written (the line a finding points at)."""

    value: Any
    where: Location
    key_where: Location | None = None
    lines: tuple[str, ...] = field(default=(), repr=False)  # the file's lines, for comments

    @property
    def at(self) -> Location:
        """The line to report: the key's (`precision: 16`), else the value's."""
        return self.key_where or self.where

    def get(self, *keys: str) -> Node | None:
        node: Node | None = self
        for key in keys:
            if node is None or not isinstance(node.value, dict):
                return None
            node = node.value.get(key)
        return node

    def plain(self) -> Any:
        """The value as plain Python (mappings and lists of plain values)."""
        if isinstance(self.value, dict):
            return {key: child.plain() for key, child in self.value.items()}
        if isinstance(self.value, list):
            return [child.plain() for child in self.value]
        return self.value

    def commented_key(self, key: str) -> Location | None:
        """A commented-out `# key: value` line inside this mapping's lines (`# precision: 16`)."""
        if not isinstance(self.value, dict) or not self.lines:
            return None
        pattern = re.compile(rf"^\s*#\s*{re.escape(key)}\s*:")
        first, last = self.where.line, max(self.where.end_line, self.where.line)
        for number in range(first, min(last, len(self.lines)) + 1):
            text = self.lines[number - 1]
            if pattern.match(text):
                column = len(text) - len(text.lstrip()) + 1
                return Location(self.where.path, number, column, number, len(text) + 1, text)
        return None


def load(files: ProjectFiles, path: Path) -> Node | None:
    """The tree of a project's YAML or JSON file; None when it is missing. A file that cannot be
    read as YAML/JSON raises ``ConfigError`` (the caller names the file in a note)."""
    text = files.text(path)
    if text is None:
        return None
    try:
        if path.suffix.lower() == ".json":
            return parse_json(text, path)
        return parse_yaml(text, path)
    except RecursionError:  # the script keeps its findings: only this file is left unread
        raise TooDeep() from None


def load_noted(files: ProjectFiles, path: Path) -> Node | None:
    """``load``, with a file that cannot be read named in a note (None then): the script and the
    project's other files keep their findings."""
    try:
        return load(files, path)
    except ConfigError as problem:
        files.note(path, f"not read: {problem}")
        return None


def load_mapping(files: ProjectFiles, path: Path) -> Node | None:
    """``load_noted`` of a file whose top level is a mapping; None for anything else."""
    tree = load_noted(files, path)
    return tree if tree is not None and isinstance(tree.value, dict) else None


def parse_yaml(text: str, path: Path) -> Node:
    import yaml  # only scripts with YAML configuration pay for the import

    try:
        roots = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML ({_first_line(exc)})") from None
    lines = tuple(text.splitlines())
    if not roots or roots == [None]:
        return Node({}, Location(path, 1, 1, 1, 1), lines=lines)
    builder = _Builder(path, lines)
    trees = [builder.node(root) for root in roots if root is not None]
    if len(trees) == 1:
        return _interpolated(trees[0])
    if not all(isinstance(tree.value, dict) for tree in trees):
        raise ConfigError("not valid YAML (several documents that are not all mappings)")
    merged: dict[str, Node] = {}  # `---`-separated sections of one config, read as one (`yaml.load_all`)
    for tree in trees:
        merged.update(tree.value)
    return _interpolated(Node(merged, trees[0].where, lines=lines))


_PLAIN_INTERPOLATION = re.compile(r"^\$\{([A-Za-z_][\w.]*)\}$")


def _interpolated(root: Node) -> Node:
    """OmegaConf's plain interpolations of a value of the same file (`device: ${device}` beside a
    top-level `device: cuda`) read as that value; others (`${now:...}`, `${oc.env:X}`, keys that
    another file of a composed config sets) stay as text."""
    todo = [root]
    while todo:
        node = todo.pop()
        children = node.value.values() if isinstance(node.value, dict) else node.value if isinstance(node.value, list) else ()
        for child in children:
            if isinstance(child.value, (dict, list)):
                todo.append(child)
            elif isinstance(child.value, str) and (match := _PLAIN_INTERPOLATION.match(child.value)):
                target = root.get(*match.group(1).split("."))
                if target is not None and not isinstance(target.value, (dict, list)) \
                        and not (isinstance(target.value, str) and target.value.startswith("${")):
                    child.value = target.value
    return root


def parse_json(text: str, path: Path) -> Node:
    try:
        values = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"not plain JSON ({exc})") from None
    if _nesting(values) > MAX_NESTING:
        raise TooDeep()
    try:
        tree = parse_yaml(text, path)
    except (ConfigError, RecursionError):
        tree = None
    lines = tuple(text.splitlines())  # where positions are unknown, values point at the first line
    first = Location(path, 1, 1, 1, 2, lines[0] if lines else "")
    return _overlay(tree, values, first, lines)


def _nesting(values: Any) -> int:
    """How deep lists and objects nest in ``values`` (counted without recursion)."""
    deepest, todo = 0, [(values, 0)]
    while todo:
        value, depth = todo.pop()
        deepest = max(deepest, depth)
        if isinstance(value, dict):
            todo.extend((child, depth + 1) for child in value.values())
        elif isinstance(value, list):
            todo.extend((child, depth + 1) for child in value)
    return deepest


def walk(node: Node, keys: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Node]]:
    """Every (key path, node) of the tree, mappings first."""
    yield keys, node
    if isinstance(node.value, dict):
        for key, child in node.value.items():
            yield from walk(child, (*keys, key))


def interpolated_keys(value: Any) -> tuple[str, ...] | None:
    """The keys of a plain interpolation (`${device}` -> ("device",)), else None."""
    match = _PLAIN_INTERPOLATION.match(value) if isinstance(value, str) else None
    return tuple(match.group(1).split(".")) if match is not None else None


def is_interpolation(value: Any) -> bool:
    """`${paths.output_dir}`, `${oc.env:X}`: OmegaConf fills it in at run time."""
    return isinstance(value, str) and bool(_INTERPOLATION.search(value))


class _Builder:
    def __init__(self, path: Path, lines: tuple[str, ...]) -> None:
        self.path = path
        self.lines = lines
        self.count = 0

    def location(self, start: Any, end: Any) -> Location:
        line = start.line + 1
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        return Location(self.path, line, start.column + 1, end.line + 1, end.column + 1, text)

    def node(self, raw: Any, depth: int = 0) -> Node:
        import yaml

        self.count += 1
        if self.count > MAX_NODES or depth > 100:
            raise ConfigError(f"more than {MAX_NODES:,} values (aliases that expand without end?)")
        where = self.location(raw.start_mark, raw.end_mark)
        if not isinstance(raw, yaml.ScalarNode) and raw.tag not in _COLLECTION_TAGS:
            return Node(UNKNOWN, where, lines=self.lines)  # `!!python/object/apply:...`: never built
        if isinstance(raw, yaml.MappingNode):
            values: dict[str, Node] = {}
            for key_node, value_node in raw.value:
                key = self.scalar(key_node) if isinstance(key_node, yaml.ScalarNode) else UNKNOWN
                if key == "<<" or key is UNKNOWN:
                    continue  # merge keys and complex keys: not configuration we read
                child = self.node(value_node, depth + 1)
                end = value_node.end_mark if isinstance(value_node, yaml.ScalarNode) else key_node.end_mark
                child.key_where = self.location(key_node.start_mark, end)
                values[str(key)] = child
            return Node(values, where, lines=self.lines)
        if isinstance(raw, yaml.SequenceNode):
            return Node([self.node(item, depth + 1) for item in raw.value], where, lines=self.lines)
        return Node(self.scalar(raw), where, lines=self.lines)

    @staticmethod
    def scalar(raw: Any) -> Any:
        import yaml

        try:
            return yaml.constructor.SafeConstructor().construct_object(raw, deep=True)
        except (yaml.YAMLError, ValueError, TypeError):
            return UNKNOWN  # an unknown tag: never constructed


def _overlay(tree: Node | None, value: Any, fallback: Location, lines: tuple[str, ...]) -> Node:
    """JSON's values on the composer's positions (YAML 1.1 reads `1e9` as a string, JSON as a
    number); a part whose shape differs keeps the values with the fallback position."""
    if tree is None:
        return _from_plain(value, fallback, lines)
    if isinstance(value, dict) and isinstance(tree.value, dict):
        children = {}
        for key, item in value.items():
            child = _overlay(tree.value.get(str(key)), item, tree.where, lines)
            child.key_where = child.key_where or tree.where
            children[str(key)] = child
        return Node(children, tree.where, tree.key_where, lines)
    if isinstance(value, list) and isinstance(tree.value, list) and len(value) == len(tree.value):
        return Node([_overlay(t, v, tree.where, lines) for t, v in zip(tree.value, value)], tree.where, tree.key_where, lines)
    if isinstance(value, (dict, list)):
        return _from_plain(value, tree.where, lines)
    return Node(value, tree.where, tree.key_where, lines)


def _from_plain(value: Any, where: Location, lines: tuple[str, ...]) -> Node:
    if isinstance(value, dict):
        return Node({str(k): _with_key(_from_plain(v, where, lines), where) for k, v in value.items()}, where, lines=lines)
    if isinstance(value, list):
        return Node([_from_plain(v, where, lines) for v in value], where, lines=lines)
    return Node(value, where, lines=lines)


def _with_key(node: Node, where: Location) -> Node:
    node.key_where = where
    return node


def _first_line(exc: Exception) -> str:
    """PyYAML's problem and where it is: `expected ',' or ']', but got '<stream end>', line 3`."""
    problem, mark = getattr(exc, "problem", None), getattr(exc, "problem_mark", None)
    if problem and mark is not None:
        return f"{problem}, line {mark.line + 1}"
    return " ".join(str(exc).split())[:200]
