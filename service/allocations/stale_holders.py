"""The allocations a scheduler's truth finds holding the devices its job runs on: which
of them end whole and which give up only those devices, and whether a node's own
report may end them at all.

A scheduler that runs a job on a device says the job that held it has ended: that
holder is released whole. Two exceptions, both about Kubernetes:

- a gang's reservation (each task a pod of its own, its owner starting with a
  ``by_task`` prefix) that holds other devices besides gives up only those and stays
  live: the kubelet gave them to another pod, so no member runs on them, while its
  other tasks hold the GPUs its running members use (ended whole, those looked free
  under them);
- a node's own report (``confined``: its agent token's) may change what that node
  holds and no other node's: a holder that would end whole and holds devices of
  another node too is not ended for it (``beyond``). Before, a node's token reporting
  a pod on a GPU of a two-node allocation freed that allocation's GPUs on the other
  node under its running task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.engine import Connection

from service.allocations import repository


@dataclass
class Split:
    """``whole``: the ids to end; ``partial``: id -> the (node, device) holds it gives up."""

    whole: list[str] = field(default_factory=list)
    partial: dict[str, list[tuple[str, str]]] = field(default_factory=dict)


def split(conn: Connection, stale: Mapping[str, list[str]], by_task: tuple[str, ...]) -> Split:
    """``stale``: id -> the devices (``node/device``) it holds of those a truth takes."""
    if not by_task or not stale:
        return Split(sorted(stale))
    found = Split()
    rows = {str(r["id"]): r for r in repository.by_ids(conn, sorted(stale))}
    for allocation_id in sorted(stale):
        row = rows.get(allocation_id)
        taken_names = set(stale[allocation_id])
        if row is not None and str(row["owner"] or "").startswith(by_task):
            holds = repository.holds_with_kind(conn, allocation_id)
            taken = [(n, d) for n, d, _ in holds if f"{n}/{d}" in taken_names]
            # Every device named is a hold of its own (not a share), and some are left.
            if len(taken) == len(taken_names) and len(taken) < len(holds):
                found.partial[allocation_id] = taken
                continue
        found.whole.append(allocation_id)
    return found


def beyond(conn: Connection, found: Split, nodes: Sequence[str]) -> list[str]:
    """The holders ``found`` ends whole that hold, or share, a device on a node not in
    ``nodes``: a node's own report may not end them."""
    return repository.beyond(conn, found.whole, nodes)


def end(
    conn: Connection, found: Split, now: datetime
) -> tuple[list[str], list[repository.FreedHold]]:
    """End ``found``: the ids ended and the holds freed."""
    superseded, freed = repository.end(conn, found.whole, "release", now)
    for allocation_id, devices in found.partial.items():
        freed += repository.drop_devices(conn, allocation_id, devices)
        repository.keep_anchor(conn, allocation_id)
    return superseded, freed
