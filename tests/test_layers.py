"""The package's import graph is layered: every subpackage imports only the layers below it.

Every import counts, module level, inside functions and under ``TYPE_CHECKING`` alike: an import
hidden in a function still ties the two packages together. ``LAYERS`` is the declared order,
bottom first; a unit not listed fails the test, so a new subpackage must be placed.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

import racer_rs

#: Bottom first. A unit is a subpackage of racer_rs or one of its top-level modules.
LAYERS: list[set[str]] = [
    {"errors", "_native"},
    {"_validate", "_io", "optional_deps"},
    {"target", "tts"},
    {"drafters", "loading"},
    {"autosize", "selfdraft"},
    {"engine"},
    {"bench", "integrations"},
    {"cli"},
    {"__init__", "__main__"},
]

PACKAGE = Path(racer_rs.__file__).parent


def unit_of(package: Path, path: Path) -> str:
    """The unit a source file belongs to: its top-level folder, or its module name."""
    first = path.relative_to(package).parts[0]
    return first.removesuffix(".py")


def units(package: Path) -> set[str]:
    """Subpackages and top-level modules (the extension counts by its stub, ``_native.pyi``)."""
    return {
        p.name.split(".")[0] for p in package.iterdir() if p.suffix in (".py", ".pyi") or (p / "__init__.py").exists()
    }


def root_reexports(package: Path) -> dict[str, str]:
    """Names the package's ``__init__`` imports at module level, mapped to the unit they come from."""
    tree = ast.parse((package / "__init__.py").read_text(encoding="utf-8"))
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(f"{package.name}."):
            for alias in node.names:
                names[alias.asname or alias.name] = node.module.split(".")[1]
    return names


def import_edges(package: Path) -> dict[tuple[str, str], list[str]]:
    """``(importer unit, imported unit) -> ["file:line", ...]`` over every import in the package."""
    name = package.name
    known = units(package)
    reexports = root_reexports(package)
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(package.rglob("*.py")):
        source = unit_of(package, path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [
                    a.name.split(".")[1] if "." in a.name else "__init__"
                    for a in node.names
                    if a.name.split(".")[0] == name
                ]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                parts = node.module.split(".")
                if parts[0] != name:
                    continue
                if len(parts) > 1:
                    targets = [parts[1]]
                else:  # from racer_rs import X: a unit, a re-exported name, or the facade itself
                    targets = [a.name if a.name in known else reexports.get(a.name, "__init__") for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level > 0:
                raise AssertionError(f"{path}:{node.lineno}: relative import; the layer check reads absolute ones")
            for target in targets:
                if target != source:
                    edges[(source, target)].append(f"{path.relative_to(package)}:{node.lineno}")
    return dict(edges)


def cycles(edges: dict[tuple[str, str], list[str]]) -> list[list[str]]:
    """The strongly connected components with more than one unit (Tarjan)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def upward_edges(edges: dict[tuple[str, str], list[str]], layers: list[set[str]]) -> list[str]:
    """Every import that does not go to a strictly lower layer, with where it is."""
    level = {unit: i for i, layer in enumerate(layers) for unit in layer}
    bad = []
    for (a, b), where in sorted(edges.items()):
        if a not in level or b not in level:
            bad.append(f"{a} -> {b}: {(a if a not in level else b)!r} is in no layer ({where[0]})")
        elif level[b] >= level[a]:
            bad.append(f"{a} -> {b} goes up or sideways ({', '.join(where)})")
    return bad


def test_the_package_import_graph_has_no_cycle() -> None:
    assert cycles(import_edges(PACKAGE)) == []


def test_every_import_goes_down_the_declared_layers() -> None:
    assert upward_edges(import_edges(PACKAGE), LAYERS) == []


def test_every_unit_is_placed_in_one_layer() -> None:
    placed = [unit for layer in LAYERS for unit in layer]
    assert len(placed) == len(set(placed))
    assert units(PACKAGE) == set(placed)


def _fake_package(root: Path, files: dict[str, str]) -> Path:
    package = root / "racer_rs"
    for rel, text in {"__init__.py": "", **files}.items():
        path = package / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return package


def test_a_cycle_hidden_inside_a_function_is_found(tmp_path: Path) -> None:
    package = _fake_package(
        tmp_path,
        {
            "low/__init__.py": "",
            "low/a.py": "def f():\n    from racer_rs.high import b\n    return b\n",
            "high/__init__.py": "",
            "high/b.py": "from racer_rs.low import a\n",
        },
    )
    edges = import_edges(package)
    assert edges[("low", "high")] == ["low/a.py:2"]
    assert cycles(edges) == [["high", "low"]]
    assert upward_edges(edges, [{"low"}, {"high"}]) == ["low -> high goes up or sideways (low/a.py:2)"]


def test_a_type_checking_import_and_a_facade_import_count(tmp_path: Path) -> None:
    package = _fake_package(
        tmp_path,
        {
            "__init__.py": "from racer_rs._core import Thing\n",
            "_core.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from racer_rs import api\n",
            "api.py": "from racer_rs import Thing\nimport racer_rs\n",
        },
    )
    edges = import_edges(package)
    assert ("_core", "api") in edges and ("api", "_core") in edges and ("api", "__init__") in edges
    assert cycles(edges) == [["__init__", "_core", "api"]]


@pytest.mark.parametrize("layers", [[{"low", "high"}], [{"high"}, {"low"}]])
def test_a_sideways_or_upward_import_breaks_the_layers(tmp_path: Path, layers: list[set[str]]) -> None:
    package = _fake_package(tmp_path, {"low.py": "", "high.py": "import racer_rs.low\n"})
    assert upward_edges(import_edges(package), layers) == ["high -> low goes up or sideways (high.py:1)"]
