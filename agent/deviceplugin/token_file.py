"""The plugin's token, from the agent's token file, read again when the service refuses it.

A token is rotated by deploying the new one to the file and then revoking the
old one (docs/security.md); a plugin that kept sending the revoked one would
answer every admission without reservations, and report nothing, until
restarted.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path

from agent.config import TokenSink

log = logging.getLogger("topoplace.deviceplugin")


def read_token(path: Path) -> str | None:
    """The file's token (its first line, stripped); OSError when it cannot be read."""
    with path.open(encoding="utf-8") as handle:
        return handle.readline().strip() or None


class TokenFile:
    """``path``'s token, kept in every one of ``clients``."""

    def __init__(self, path: Path, clients: Sequence[TokenSink], current: str | None) -> None:
        self.path = path
        self.clients = clients
        self.current = current
        self._lock = threading.Lock()  # the admission and report threads may both be refused

    def reload(self) -> bool:
        """Read the file again; whether the token changed (the clients then send the new
        one). A file unreadable right now (mid-rotation) keeps the token in use."""
        with self._lock:
            try:
                token = read_token(self.path)
            except OSError as exc:
                log.warning("cannot read %s (%s); keeping the token in use", self.path, exc)
                return False
            if token == self.current:
                return False
            for client in self.clients:
                client.set_token(token)
            self.current = token
            log.warning("the service refused the token; %s holds another, now in use", self.path)
            return True
