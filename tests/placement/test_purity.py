"""placement/ must stay pure: importing it pulls in no I/O or web stack."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

FORBIDDEN = (
    "fastapi",
    "starlette",
    "sqlalchemy",
    "psycopg",
    "grpc",
    "pynvml",
    "httpx",
    "uvicorn",
    "service",
    "agent",
    "topoplace",
    "topoplace_client",
    "slurm_formats",
)
# Never imported by placement's own source (pydantic may load socket itself).
FORBIDDEN_IN_SOURCE = (*FORBIDDEN, "os", "pathlib", "socket", "sqlite3", "subprocess", "time", "io")


def test_importing_placement_loads_no_io_packages() -> None:
    code = (
        "import sys, placement, placement.profiles, placement.topo_text;"
        "print('\\n'.join(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    loaded = {name.split(".")[0] for name in out}
    assert not loaded & set(FORBIDDEN), sorted(loaded & set(FORBIDDEN))


def test_no_module_in_placement_imports_outward() -> None:
    root = Path(__file__).resolve().parents[2] / "placement"
    for path in root.rglob("*.py"):
        for line in path.read_text().splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] in ("import", "from"):
                assert words[1].split(".")[0] not in FORBIDDEN_IN_SOURCE, f"{path}: {line}"
