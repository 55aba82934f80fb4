"""`topoplace node-key`: show, register (from a .pub file too), replace and delete a key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.signing import NodeKey
from service.app import create_app
from service.settings import Settings
from tests.live_server import live_server
from topoplace.cli import main


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'k.sqlite3'}"), background=False)
    with live_server(app) as url:
        yield url


def test_an_admin_registers_replaces_and_deletes_a_node_key(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["node-key", "h100-a", "--server", server]
    assert main(base) == 1  # no key yet: not found
    first, second = NodeKey.generate(), NodeKey.generate()
    pub = first.save(tmp_path / "node.key")
    capsys.readouterr()
    assert main([*base, "--register", f"@{pub}"]) == 0
    assert first.public_key in capsys.readouterr().out
    assert main([*base, "--register", second.public_key]) == 1  # a different key: conflict
    assert "replace=true" in capsys.readouterr().err
    assert main([*base, "--register", second.public_key, "--replace"]) == 0
    assert main([*base, "--json"]) == 0
    assert second.public_key in capsys.readouterr().out
    assert main([*base, "--delete"]) == 0
    assert main(base) == 1
    with pytest.raises(SystemExit) as usage:  # as argparse ends a usage error
        main([*base, "--register", f"@{tmp_path / 'missing.pub'}"])
    assert usage.value.code == 2
