"""The package's imports go one way: down the layers of docs/architecture.md, with no cycle.

Every import statement counts, wherever it stands: at module level, inside a function (a lazy
import for start-up speed is fine, as long as it points down) and under ``if TYPE_CHECKING:``.
The modules are read with ``ast``, nothing is imported. A module that no layer names fails too,
so that a new package or top-level module gets its place in the order on purpose.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Top first. A module may import its own layer entry and every layer below its own. Entries that
# share a row are independent: neither imports the other. An entry is a package (with all its
# modules) or a single module.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("speedfix.__main__",),
    ("speedfix.cli",),  # the command line
    ("speedfix.server",),  # the editor's language server
    ("speedfix.jsonrpc",),  # its messages, framed on standard input
    ("speedfix.output",),  # report formats
    ("speedfix.commands",),  # scan and apply over a tree of files
    ("speedfix.workspace", "speedfix.bench"),  # the user's project on disk | the benchmark
    ("speedfix.rules", "speedfix.testing"),  # the catalog | rule examples as tests
    ("speedfix.fixes",),  # the edits rules build, applied to a fixed point
    ("speedfix.engine",),  # rule base, catalog lookup, one file's analysis, findings
    ("speedfix.model",),  # the semantic model of a training script
    ("speedfix.project", "speedfix.syntax"),  # facts other files tell | code as bytes and trees
    ("speedfix",),  # the version
)


def module_files(root: Path) -> dict[str, Path]:
    """Module name -> file, for the package (`speedfix/`) and the catalog (`rules/`, installed
    as `speedfix.rules`)."""
    found: dict[str, Path] = {}
    for folder, package in ((root / "speedfix", "speedfix"), (root / "rules", "speedfix.rules")):
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """Module -> {imported module of the package: line of the first such import}."""
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:  # `import speedfix.a.b` of a name inside a module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def layer_of(module: str) -> tuple[int, str] | None:
    """(row in LAYERS, entry) of the most specific entry holding ``module``."""
    best: tuple[int, str] | None = None
    for row, entries in enumerate(LAYERS):
        for entry in entries:
            holds = module == entry or (entry != "speedfix" and module.startswith(entry + "."))
            if holds and (best is None or len(entry) > len(best[1])):
                best = (row, entry)
    return best


def layer_violations(graph: dict[str, dict[str, int]], modules: dict[str, Path]) -> list[str]:
    problems = [f"{module} is in no layer: give it a place in LAYERS" for module in graph if layer_of(module) is None]
    for module, edges in sorted(graph.items()):
        here = layer_of(module)
        for target, line in sorted(edges.items()):
            there = layer_of(target)
            if here is None or there is None or there[1] == here[1]:
                continue
            if there[0] <= here[0]:
                where = modules[module].relative_to(ROOT) if modules[module].is_relative_to(ROOT) else modules[module]
                problems.append(f"{where}:{line}: {module} ({here[1]}) imports {target} ({there[1]}), "
                                f"which is {'beside' if there[0] == here[0] else 'above'} it")
    return problems


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def package() -> tuple[dict[str, Path], dict[str, dict[str, int]]]:
    modules = module_files(ROOT)
    return modules, import_graph(modules)


def test_imports_point_down_the_layers(package):
    modules, graph = package
    assert layer_violations(graph, modules) == []


def test_no_import_cycle(package):
    _, graph = package
    assert cycles(graph) == []


def test_every_layer_exists(package):
    """A layer renamed or removed must leave LAYERS too."""
    modules, _ = package
    assert [entry for row in LAYERS for entry in row if not any(layer_of(m) == (LAYERS.index(row), entry) for m in modules)] == []


def test_a_function_level_import_up_the_layers_is_caught(tmp_path):
    """The check itself: an import inside a function, from the syntax layer up to the model,
    is reported, and with the import back the other way it is a cycle."""
    for path, code in {
        "speedfix/__init__.py": "",
        "speedfix/syntax/__init__.py": "",
        "speedfix/syntax/walk.py": "def f():\n    from speedfix.model import index\n",
        "speedfix/model/__init__.py": "",
        "speedfix/model/index.py": "from ..syntax.walk import f\n",
        "rules/__init__.py": "",
    }.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(code)
    modules = module_files(tmp_path)
    graph = import_graph(modules)
    assert graph["speedfix.syntax.walk"] == {"speedfix.model.index": 2}
    problems = layer_violations(graph, modules)
    assert len(problems) == 1 and "speedfix.syntax.walk (speedfix.syntax) imports speedfix.model.index" in problems[0]
    assert cycles(graph) == [["speedfix.model.index", "speedfix.syntax.walk"]]
