"""The Slurm reads of the background loop, each in a task of its own.

squeue (reconcile.py) may take up to its timeout (20 s by default) on a busy
slurmctld, and sinfo (node_states.py) up to its own: read one after the other,
a slow squeue held up the node states, and a node Slurm had drained kept being
chosen until squeue answered. Each reader here awaits its own read before its
next tick, so one command is never read twice at once, and neither reader
(nor the expiry sweep) waits for the other. ``stop`` cancels them, which kills
a command under way (json_command.py): the service's stop does not wait for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("topoplace.service")
# A tick that is not due returns at once; this often, a reconcile due early (a fresh
# reservation's grace period over, fresh.py) is at most this late.
POLL_S = 0.1


async def keep_ticking(tick: Callable[[], Awaitable[None]], what: str) -> None:
    """Call ``tick`` every ``POLL_S`` for good, one call at a time."""
    while True:
        await asyncio.sleep(POLL_S)
        try:
            await tick()
        except Exception:  # the reader must outlive a database hiccup
            log.exception("%s failed; retrying", what)


def start(ticks: dict[str, Callable[[], Awaitable[None]]]) -> list[asyncio.Task[None]]:
    """One task per reader, named for what it reads (keep the list: the loop holds
    tasks only weakly)."""
    return [
        asyncio.create_task(keep_ticking(tick, what), name=what) for what, tick in ticks.items()
    ]


async def stop(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
