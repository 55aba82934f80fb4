"""The background loop's reader of Slurm's node states (service/slurm/node_states.py).

A module of its own: ``ServiceState`` holds the states (node_states.py), and this
reader needs the state to write them to.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from service.slurm.node_states import STALE_AFTER_S, read_sinfo
from service.slurm.settings import SlurmSettings

if TYPE_CHECKING:
    from service.state import ServiceState

log = logging.getLogger("topoplace.slurm")


class NodeStatesWatcher:
    """The background loop's step: read sinfo every ``nodes_interval_s``."""

    def __init__(self, state: ServiceState, settings: SlurmSettings | None = None) -> None:
        self.state = state
        self.settings = settings or SlurmSettings()
        self._command = self.settings.sinfo()
        self._next = 0.0
        self._last_error = ""

    async def tick(self) -> None:
        command = self._command
        now = time.monotonic()
        if not command or now < self._next:
            return
        self._next = now + self.settings.nodes_interval_s
        try:
            unavailable = await read_sinfo(command, self.settings.sinfo_timeout_s)
        except RuntimeError as exc:
            if str(exc) != self._last_error:  # once per kind of failure, not every second
                log.warning(
                    "Slurm node states not read (last read kept %.0f s): %s", STALE_AFTER_S, exc
                )
                self._last_error = str(exc)
            return
        self._last_error = ""
        before = self.state.slurm_nodes.unavailable()
        self.state.slurm_nodes.update(unavailable)
        if set(unavailable) != set(before):
            log.info(
                "Slurm starts no job on %s",
                ", ".join(f"{n} ({why})" for n, why in sorted(unavailable.items())) or "no node",
            )
