"""No import cycles between the modules of a package; no imports inside functions to hide one.

The graph is read from the source with ``ast``, not from what Python loaded:
every ``import`` statement counts wherever it stands (module level, inside a
function, under ``if TYPE_CHECKING:``), because an import moved into a
function still ties the two modules together; it only moves the failure to
run time. An import of ``pkg.a`` is an edge to ``pkg.a`` alone: the
package's ``__init__`` that Python runs first is not counted, or every module
would "import" the ``__init__`` that re-exports it.

A package joins the check by one line in ``PACKAGES``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Packages that must have no import cycle. "service" joins once its own cycle is gone.
PACKAGES = ["placement", "service", "agent", "topoplace", "topoplace_client", "slurm_formats"]

# Packages whose functions must not import the package's own modules.
NO_FUNCTION_IMPORTS = ["placement"]

Graph = dict[str, set[str]]


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package`` under ``root``."""
    out: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(
    tree: ast.AST, module: str, is_package: bool, modules: Mapping[str, Path]
) -> Iterator[tuple[ast.stmt, str]]:
    """(statement, module of the package it imports) for every import in the tree.

    ``from a import b`` imports the module ``a.b`` when there is one, else a name of
    ``a``; relative imports are resolved against ``module``.
    """
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    yield node, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                anchor = here[: len(here) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in modules:
                    yield node, target
                elif base in modules:
                    yield node, base


def import_graph(root: Path, package: str) -> Graph:
    """Module -> the modules of the same package it imports."""
    modules = module_names(root, package)
    graph: Graph = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for _, target in _imports(tree, name, path.name == "__init__.py", modules):
            if target != name:
                graph[name].add(target)
    return graph


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None; modules and edges visited in name order."""
    done: set[str] = set()
    path: list[str] = []
    on_path: dict[str, int] = {}

    def visit(node: str) -> list[str] | None:
        on_path[node] = len(path)
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in on_path:
                return [*path[on_path[nxt] :], nxt]
            if nxt not in done:
                found = visit(nxt)
                if found is not None:
                    return found
        path.pop()
        del on_path[node]
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            found = visit(start)
            if found is not None:
                return found
    return None


def function_imports(root: Path, package: str) -> list[str]:
    """'module:line imported' for every import of the package's own modules inside a function."""
    out: list[str] = []
    modules = module_names(root, package)
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for stmt, target in _imports(func, name, path.name == "__init__.py", modules):
                out.append(f"{name}:{stmt.lineno} {target}")
    return sorted(set(out))


@pytest.mark.parametrize("package", PACKAGES)
def test_package_has_no_import_cycle(package: str) -> None:
    graph = import_graph(ROOT, package)
    assert len(graph) > 1, f"no modules found for {package}"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


@pytest.mark.parametrize("package", NO_FUNCTION_IMPORTS)
def test_no_function_level_imports_of_own_modules(package: str) -> None:
    assert function_imports(ROOT, package) == []


def _write(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_check_finds_a_cycle_through_a_function_level_import(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.top import run\n",
            "pkg/top.py": "from pkg import low\n\ndef run() -> None:\n    low.go()\n",
            "pkg/low.py": "def go() -> None:\n    from pkg.top import run\n",
            "pkg/side.py": "import pkg.low\n",
        },
    )
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.side"] == {"pkg.low"}
    assert graph["pkg.top"] == {"pkg.low"}  # the module imported, not the package's __init__
    assert find_cycle(graph) == ["pkg.top", "pkg.low", "pkg.top"]
    assert function_imports(tmp_path, "pkg") == ["pkg.low:2 pkg.top"]


def test_the_check_follows_relative_and_type_checking_imports(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/sub/__init__.py": "from .a import A\n",
            "pkg/sub/a.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from ..b import B\nA = 1\n",
            "pkg/b.py": "from .sub import a\nB = 2\n",
            "pkg/c.py": "from . import b\nfrom .sub.a import A\n",
        },
    )
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.sub"] == {"pkg.sub.a"}
    assert graph["pkg.c"] == {"pkg.b", "pkg.sub.a"}
    assert find_cycle(graph) == ["pkg.b", "pkg.sub.a", "pkg.b"]


def test_an_acyclic_package_passes(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.top import run\n",
            "pkg/top.py": "from pkg.low import go\n\ndef run() -> None:\n    go()\n",
            "pkg/low.py": "import json\n\ndef go() -> None:\n    json.dumps(1)\n",
        },
    )
    assert find_cycle(import_graph(tmp_path, "pkg")) is None
    assert function_imports(tmp_path, "pkg") == []
