"""What runs on the event loop, and the one way off it.

The rule, for every adapter (the REST routes, the direct routes, the
Kubernetes extender, the Slurm filter, gRPC):

* **On the loop**: in-memory work whose cost the request bounds, well
  under a millisecond for a few hundred nodes: a decision under the state
  lock (``/place``, the Slurm filter, the extender's filter and
  prioritize), a ``/score`` of up to ``SCORE_ON_LOOP_NODES`` named nodes
  (service/allocations/endpoints.py), parsing and encoding, publishing an
  event; and awaiting.
* **Off the loop**: anything that reads or writes the database, calls the
  Kubernetes API, runs a subprocess (but Slurm's JSON commands, awaited on
  the loop as asyncio subprocesses so that a shutdown kills them:
  service/slurm/json_command.py), or costs more than that: through
  :func:`off_loop` (a worker thread), or, for a reservation's commit,
  through the group committer (``commit_async``: the loop awaits, the
  committer's thread writes). A flow written as a generator of blocking
  steps (service/flows.py) yields each such step, and its asyncio driver
  hands the step to :func:`off_loop`. A pushed squeue answer (megabytes) is
  decoded off it too, a job per call, since json.loads holds the GIL for a
  whole document even on a worker thread (service/slurm/json_command.py).
* **The one exception**: on SQLite, the Slurm filter's reservation is
  written on the loop (``commit_async(..., at_once=True)``), through a
  connection kept for it that never waits for a lock (another writer: it
  goes to the committer's queue instead). slurmctld calls the filter one
  job at a time, so there is no batch to share, and the hand-over to the
  committer's thread and back cost more than the local write (0.2-0.3 ms).

A plain ``def`` FastAPI route is off the loop already (FastAPI runs it in
its thread pool), and so is every gRPC method's body (the servicer runs it
on the gRPC loop's own pool of worker threads). Taking the state lock on
the loop is allowed, because everything that holds it is short: a sync from
the database holds it while reading the nodes it names (a few hundred at
most), and a full resync reads without it (service/state.py).

Why: the loop serves every request of the process, so a 5 ms database read
on it delays every request in flight by 5 ms, and an API server that does
not answer would stall them all until its timeout. Handing every request to
a worker thread and back cost more CPU than the decision itself
(docs/service.md, "Where the time goes"), so what is short stays on the
loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

Params = ParamSpec("Params")
Result = TypeVar("Result")


async def off_loop(
    blocking: Callable[Params, Result], /, *args: Params.args, **kwargs: Params.kwargs
) -> Result:
    """Run ``blocking(*args, **kwargs)`` on a worker thread of the running loop's
    executor and await its result (its exception is raised here)."""
    return await asyncio.to_thread(blocking, *args, **kwargs)


def run_here(blocking: Callable[[], Result]) -> Result:
    """The blocking driver's step, for a caller already off the loop: it runs the step
    itself (``flows.drive(flow, run_here)``, where ``flows.drive_async(flow, off_loop)``
    awaits it on a worker thread)."""
    return blocking()
