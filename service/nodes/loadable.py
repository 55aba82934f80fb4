"""Whether the engine can hold a snapshot, decided before anything is stored.

A snapshot that passes the model's validation can still be one the engine
cannot load (a node without GPUs breaks its subset tables). Stored, such a
row would fail every later start, so the report is refused at the edge
instead: the snapshot is read back from the JSON that would be stored and
added to a scratch ``ClusterState``, the same ``upsert`` the live state
runs. The scratch state keeps the topology classes it built, so reports of
machines already seen cost a lookup, not the class build (a third of a
second for 16 GPUs); it is started afresh once it holds ``_PROBE_CLASSES``
classes, which bounds its memory whatever wirings clients send.
"""

from __future__ import annotations

import threading

from pydantic import ValidationError

from placement import ClusterState, NodeSnapshot
from service.errors import ServiceError

_PROBE_CLASSES = 32


class InvalidSnapshot(ServiceError):
    """A snapshot the service cannot hold: 422, answered like any invalid field."""

    status = 422
    code = "invalid_request"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(
            f"{field}: {message}",
            {"field": field, "errors": [{"field": field, "message": message}]},
        )


class _Probe:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cluster: ClusterState | None = None

    def load(self, snapshot: NodeSnapshot, live: ClusterState) -> None:
        """Add the snapshot to the scratch state and take it out again; raises what
        the engine raises."""
        with self.lock:
            cluster = self.cluster
            if (
                cluster is None
                or cluster.bandwidth != live.bandwidth
                or cluster.block_labels != live.block_labels
                or cluster.mix != live.mix
                or cluster.class_count >= _PROBE_CLASSES
            ):
                # Built as the live state is (its size mix shapes the class tables the
                # upsert builds), so what loads here loads there.
                cluster = ClusterState.from_mix(live.mix, live.bandwidth, live.block_labels)
            self.cluster = None  # a failure midway leaves nothing half-changed behind
            cluster.upsert(snapshot)
            cluster.remove(snapshot.name)
            self.cluster = cluster


_probe = _Probe()


def check_loadable(snapshot: NodeSnapshot, live: ClusterState) -> str:
    """The JSON to store for ``snapshot``; raises InvalidSnapshot when the engine could
    not load it back, naming why."""
    if not snapshot.gpus:
        # Decided: a node without GPUs is not a node topoplace can place on (every
        # request asks for at least one GPU), so it is refused, not kept as a
        # CPU-only node that would only ever answer "does not fit".
        raise InvalidSnapshot(
            "snapshot.gpus",
            "a node must have at least one GPU; run the agent only on GPU nodes",
        )
    body = snapshot.model_dump_json()
    try:
        stored = NodeSnapshot.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(["snapshot", *(str(p) for p in first["loc"])])
        raise InvalidSnapshot(where, f"does not read back as stored: {first['msg']}") from None
    if stored != snapshot:
        raise InvalidSnapshot("snapshot", "does not read back as stored: the JSON loses a value")
    try:
        _probe.load(stored, live)
    except Exception as exc:  # whatever the engine raises, this snapshot cannot be loaded
        raise InvalidSnapshot(
            "snapshot", f"the engine cannot load it ({type(exc).__name__}: {exc})"
        ) from None
    return body
