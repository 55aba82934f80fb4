"""One device, one node: a GPU or MIG UUID that another node's snapshot lists, or that a
live allocation still holds on another node, is refused.

Checked against the database, so that replicas agree, inside the report's
transaction and after its first write (see snapshot_report.py for why that
order makes two racing claims check one after the other).
"""

from __future__ import annotations

import json

import sqlalchemy as sa

from placement import NodeSnapshot
from service import schema
from service.errors import Conflict
from service.nodes import repository
from service.state import ServiceState


def device_uuids(snap: NodeSnapshot) -> set[str]:
    return set(snap.device_uuids)


class MemoryDevices:
    """What this process's memory says of some devices: each node's seq and reported_at
    (together they name its snapshot), and which other nodes hold which of the devices.
    Read before the transaction, so that the state lock is never awaited while the
    database is locked."""

    def __init__(self, seqs: dict[str, repository.Stored], owners: dict[str, str]) -> None:
        self.seqs = seqs
        self.owners = owners


def devices_in_memory(state: ServiceState, name: str, devices: set[str]) -> MemoryDevices:
    """Read without holding the state lock but for a copy of the entry list: at 10,000
    nodes the walk takes tens of milliseconds, which /place must not wait for. Each
    entry's snapshot is read once, so its seq and devices always belong together."""
    with state.lock:
        entries = list(state.cluster.nodes())
        reported = dict(state.reported)
    seqs: dict[str, repository.Stored] = {}
    owners: dict[str, str] = {}
    for entry in entries:
        snap = entry.snapshot
        seqs[snap.name] = (snap.seq, reported.get(snap.name))
        if snap.name == name:
            continue
        if not devices.isdisjoint(snap.device_uuids):
            for uuid in devices & snap.device_uuids:
                owners.setdefault(uuid, snap.name)
    return MemoryDevices(seqs, owners)


def device_owners(
    conn: sa.Connection, name: str, devices: set[str], memory: MemoryDevices
) -> dict[str, str]:
    """{device: other node} as the database has it.

    A seq and reported_at name one content, so a stored node whose pair memory
    has is checked from memory; only the others (reported on another replica and
    not synced here yet, or never loadable) are read and parsed. That keeps
    the check to one narrow scan at 10,000 nodes, where searching every
    stored snapshot's text took 0.4-1.6 s per report.
    """
    stored = repository.stored_seqs(conn)
    owners = {
        uuid: node for uuid, node in memory.owners.items() if stored.get(node) == memory.seqs[node]
    }
    unknown = sorted(
        node for node, seq in stored.items() if node != name and memory.seqs.get(node) != seq
    )
    for node, text in repository.snapshot_bodies(conn, unknown):
        for uuid in devices & _listed_uuids(text):
            owners.setdefault(uuid, node)
    return owners


def _listed_uuids(text: str) -> set[str]:
    """The device UUIDs a stored snapshot lists; none for a row that is not a snapshot's
    JSON (no replica serves it, and its agent's next report replaces it)."""
    try:
        data = json.loads(text)
    except ValueError:
        return set()
    if not isinstance(data, dict):
        return set()
    listed = [*_list(data.get("gpus")), *_list(data.get("mig_instances"))]
    return {str(d["uuid"]) for d in listed if isinstance(d, dict) and "uuid" in d}


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def held_elsewhere(conn: sa.Connection, name: str, devices: set[str]) -> dict[str, str]:
    """{device: other node} for the devices a live allocation holds on another node.

    A node that stops reporting a held GPU degrades the allocation, which keeps the
    hold: the job may still run on that GPU. Holds are keyed by (node, device), so
    nothing else would stop another node from reporting the GPU and having it placed
    a second time while the first job runs on it.
    """
    holds = schema.holdings()
    query = (
        sa.select(holds.c.device, holds.c.node)
        .where(holds.c.device.in_(sorted(devices)), holds.c.node != name, holds.c.kind != "cpu")
        .order_by(holds.c.device, holds.c.node)
    )
    held: dict[str, str] = {}
    for device, node in conn.execute(query):
        held.setdefault(str(device), str(node))
    return held


def refuse_claimed(name: str, owners: dict[str, str], held: dict[str, str]) -> None:
    if owners:
        uuid = min(owners)
        other = owners[uuid]
        raise Conflict(
            f"device {uuid} already belongs to node {other!r}; a GPU is reported by one node"
            f" only (if it moved, delete node {other!r} or report it without the device first)",
            {"field": "snapshot.gpus", "uuid": uuid, "node": other, "devices": len(owners)},
        )
    if held:
        uuid = min(held)
        other = held[uuid]
        raise Conflict(
            f"device {uuid} is still held on node {other!r} by a live allocation; a GPU is in"
            f" one node's allocations only (release the allocations holding it on {other!r}"
            " first)",
            {"field": "snapshot.gpus", "uuid": uuid, "node": other, "devices": len(held)},
        )
