"""Which top-level package may import which: the layering, held by a test.

Every import statement counts, inside functions and ``if TYPE_CHECKING:``
blocks too: an import moved into a function to dodge a cycle is still a
dependency. placement/'s own rule (it imports none of the others, nor any I/O
module) is tests/placement/test_purity.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package -> modules it must not import (a name covers its submodules).
FORBIDDEN: dict[str, tuple[str, ...]] = {
    # The node agent talks to the service over HTTP only, through topoplace_client.
    "agent": ("topoplace", "service"),
    # The command line reaches the service over HTTP too; `topoplace serve` and
    # `topoplace openapi` start it in-process, but nothing of its Slurm adapter.
    "topoplace": ("agent", "service.slurm"),
    # Shared by the two above, so it depends on neither (nor on the service).
    "topoplace_client": ("agent", "topoplace", "service", "slurm_formats"),
    # Pure text formats the service and the CLI both read and write.
    "slurm_formats": ("agent", "topoplace", "topoplace_client", "service"),
}


def imported_modules(path: Path, package_dir: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file of the package at package_dir."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = [package_dir.name, *path.relative_to(package_dir).parent.parts]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's own package
                base = ".".join(here[: len(here) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            # `from service import slurm` imports service.slurm.
            found.extend((node.lineno, f"{module}.{alias.name}") for alias in node.names)
    return sorted(found)


def _within(module: str, forbidden: str) -> bool:
    return module == forbidden or module.startswith(f"{forbidden}.")


def violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, module in imported_modules(path, ROOT / package):
            hit = next((f for f in forbidden if _within(module, f)), None)
            if hit is not None:
                out.append(f"{path.relative_to(ROOT)}:{line} imports {module} ({hit})")
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_stay_within_its_layer(package: str) -> None:
    assert (ROOT / package / "__init__.py").is_file()
    found = violations(package, FORBIDDEN[package])
    assert not found, f"{package}/ must not import {FORBIDDEN[package]}:\n" + "\n".join(found)


def test_every_kind_of_import_is_seen(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "sub" / "m.py").write_text(
        "import service.slurm.x\n"
        "from service import slurm\n"
        "def f():\n"
        "    from agent.cli import add_parser\n"
        "from . import sibling\n"
        "from service import settings\n"
    )
    modules = [m for _, m in imported_modules(package / "sub" / "m.py", package)]
    assert modules == [
        "service.slurm.x",
        "service.slurm",
        "agent.cli.add_parser",
        "pkg.sub.sibling",
        "service.settings",
    ]
    assert [m for m in modules if _within(m, "service.slurm")] == modules[:2]
