"""Snapshots in: an agent's report checked, stored and applied.

Everything is checked before anything is kept: its signature against the
node's registered key (403, signatures.py), a snapshot the engine could not
load (422, loadable.py), a seq older than the stored one or an equal seq
with other content (409; for a node with a key, any seq not newer is a
replay: 409 ``replayed_snapshot``), a device another node reports or a live
allocation holds on another node (409, device_owners.py). The seq rule is
also the condition of the write, so of racing reports the newest wins
whatever their order, and a first report racing another first one is
retried as a later one. A snapshot that differs
from the stored one only in seq and timestamp is stored (its seq counts) but
is no change: no history row, no event.
"""

from __future__ import annotations

import functools
import json
import logging
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from placement import Health, NodeSnapshot
from placement.snapshot import MAX_SEQ
from service import schema
from service.admin_actions import INTERNAL, Caller
from service.audit import records
from service.audit import store as audit
from service.db import retry_transient
from service.edge import revoked_meanwhile
from service.errors import BadRequest, Conflict, ReplayedSnapshot, ServiceError
from service.lost_commit import following
from service.nodes import device_owners as owners
from service.nodes import region_scope, repository, signatures
from service.nodes.loadable import check_loadable
from service.nodes.schemas import SnapshotAccepted, SnapshotReport
from service.notify import publish
from service.state import PREPARE_TRIES, ServiceState

log = logging.getLogger("topoplace.nodes")
FIRST_REPORT_TRIES = 3  # a first snapshot racing another first one re-reads and tries again


def report_snapshot(
    state: ServiceState, name: str, report: SnapshotReport, caller: Caller = INTERNAL
) -> SnapshotAccepted:
    """Store a node's snapshot and apply it; everything is checked before anything is kept.

    ``caller`` is who sent it (the transports pass theirs; the default is the
    process itself). Refused: a signature that is not the node's registered
    key's (403, signatures.py), a snapshot the engine could not load (422, loadable.py), a seq
    older than the stored one or an equal seq with other content (409), and
    a GPU or MIG UUID that another node's snapshot lists or a live allocation holds on
    another node (409). The seq rule
    is also the condition of the write, so of racing reports the newest
    wins whatever their order. A refusal leaves an audit row (``snapshot``, the
    refusal's code as the action), in a transaction of its own: the report's was undone;
    at most one a window for each node and code (``_audit_refusal``).
    """
    try:
        return _report(state, name, report, caller)
    except ServiceError as refusal:
        _audit_refusal(state, name, report, refusal)
        raise


def _audit_refusal(
    state: ServiceState, name: str, report: SnapshotReport, refusal: ServiceError
) -> None:
    """An agent that is broken (a wrong key, a clock gone back) or hostile reports again
    and again, each report refused: one audit row for each would fill the log. At most one
    row is written for a node and code a window (TOPOPLACE_AUDIT_REFUSAL_WINDOW_S), with
    the refusals since the last folded into it (``coalesced``), and at most
    TOPOPLACE_AUDIT_REFUSAL_ROWS a window for all nodes (service/audit/refusals.py); every
    refusal is still answered and counted (topoplace_snapshot_refusals_total)."""
    coalesced = state.snapshot_refusal_gate.admit((name, refusal.code))
    if coalesced is None:
        return
    detail = {
        "code": refusal.code,
        "message": refusal.message,
        "detail": refusal.detail,
        "seq": report.snapshot.seq,
        "signed": report.signature is not None,
        "coalesced": coalesced,
    }
    row = records.record("snapshot", refusal.code, state.clock(), nodes=[name], detail=detail)
    try:
        audit.write_alone(state.engine, row)
    except SQLAlchemyError:  # the refusal is the answer; a database hiccup must not hide it
        log.exception("the audit row of a refused snapshot of %s was not written", name)


def _report(
    state: ServiceState, name: str, report: SnapshotReport, caller: Caller
) -> SnapshotAccepted:
    snap = report.snapshot
    if snap.name != name:
        raise BadRequest(
            f"snapshot.name is {snap.name!r} but the URL names node {name!r}",
            {"field": "snapshot.name"},
        )
    with state.engine.connect() as conn:
        key = signatures.verified_key(conn, name, report, caller)
    body = check_loadable(snap, state.cluster)
    devices = owners.device_uuids(snap)
    now = state.clock()
    for _ in range(FIRST_REPORT_TRIES):
        memory = owners.devices_in_memory(state, name, devices)
        revoked_meanwhile.refuse_if_revoked()  # the token revoked while the report waited
        try:
            with following(state):  # a commit answer lost: memory reads the stored snapshot
                # The report takes its node row, then (ON UPDATE CASCADE) the node's holds;
                # a release or reservation of another replica takes holds, then the row.
                # Postgres ends one of two such transactions: the report's is run again
                # (not answered 503 with the database up), whole, as the cordon's is.
                changed = retry_transient(
                    functools.partial(
                        _store, state, name, report, body, devices, memory, now, key, caller
                    ),
                    retried=state.metrics.retried,
                )
        except IntegrityError:
            continue  # another first report of this node was inserted meanwhile
        break
    else:
        raise Conflict(f"node {name!r} was reported concurrently; send the snapshot again")
    appeared: frozenset[str] = frozenset()
    for attempt in range(PREPARE_TRIES):
        # A new design's tables (0.6 s for 16 GPUs) are built here, not under the lock
        # that every /place and /score of this replica takes.
        design = state.cluster.prepare(snap)
        with state.lock:
            if _newer_than_memory(state, snap):
                if attempt < PREPARE_TRIES - 1 and not state.cluster.has_design(design):
                    continue  # the state was rebuilt or dropped the design meanwhile
                appeared = snap.device_uuids - _devices_in_memory(state, name)
                state.cluster.upsert(snap, design)
            if state.cluster.node(name).snapshot == snap:
                state.reported[name] = now  # what the row says now: a sync has nothing to load
            state.heartbeats[name] = now
            state.refresh_availability([name])
        break
    if appeared:
        # Memory holds only the devices its snapshot lists (a sync or start leaves out a
        # hold on a device the node stopped reporting), while a degraded allocation keeps
        # its hold in the database: a device reported again is read with its holds, or
        # this replica would show it free, and place on it, until its next resync. A node
        # new to memory is read back too: a delete that committed after this report and
        # reached memory first would otherwise be undone here, the node served again.
        state.sync_nodes([name])
    return SnapshotAccepted(node=name, seq=snap.seq, changed=changed)


def _devices_in_memory(state: ServiceState, name: str) -> frozenset[str]:
    """The devices memory's snapshot of the node lists (under the lock); none if unknown."""
    if name not in state.cluster:
        return frozenset()
    return state.cluster.node(name).snapshot.device_uuids


def _newer_than_memory(state: ServiceState, snap: NodeSnapshot) -> bool:
    """Whether memory should take this stored snapshot (under the lock): a newer seq, or
    the same seq with other content (the node was deleted meanwhile, perhaps on another
    replica, and reported again from its old seq)."""
    if snap.name not in state.cluster:
        return True
    held = state.cluster.node(snap.name).snapshot
    return held.seq < snap.seq or (held.seq == snap.seq and held != snap)


def _store(
    state: ServiceState,
    name: str,
    report: SnapshotReport,
    body: str,
    devices: set[str],
    memory: owners.MemoryDevices,
    now: datetime,
    key: str | None,
    caller: Caller,
) -> bool:
    """The report's transaction; whether the snapshot changed. IntegrityError: a first
    report of this node was stored meanwhile (the transaction is undone)."""
    snap = report.snapshot
    with state.engine.begin() as conn:
        repository.lock_device_uuids(conn, devices)
        row = repository.get(conn, name)
        # A region-scoped agent: the stored region, not this replica's memory, says
        # whether the node is its to report (region_scope.py).
        region_scope.check(caller, name, snap.region, None if row is None else row["region"])
        signed_seq = signatures.check_unchanged(conn, name, key)
        keyed = key is not None
        if signed_seq is not None:  # also when the node's row was deleted since
            _check_seq(name, snap.seq, signed_seq, False, keyed)
        if row is not None:
            _check_seq(name, snap.seq, int(row["seq"]), row["snapshot"] == body, keyed)
        changed = row is None or _content_differs(row["snapshot"], body)
        stored = repository.StoredSnapshot(
            name=name, region=snap.region, body=body, seq=snap.seq, signature=report.signature
        )
        region = region_scope.required_region(caller, name)
        if row is None:
            repository.insert_snapshot(conn, stored, now)
        elif not repository.update_snapshot(conn, stored, now, same_again=not keyed, region=region):
            newer = repository.get(conn, name)  # a newer report won the race since the read
            if newer is not None:
                region_scope.check(caller, name, snap.region, newer["region"])  # or a move
                _check_seq(name, snap.seq, int(newer["seq"]), newer["snapshot"] == body, keyed)
            raise Conflict(
                f"node {name!r} was removed or changed while this snapshot was stored;"
                " send it again"
            )
        if keyed:
            repository.mark_signed_seq(conn, name, snap.seq)
        # After the write: on SQLite this transaction now holds the write lock,
        # on Postgres the UUID locks; either way no other report can claim
        # these devices until this one commits or is undone.
        owners.refuse_claimed(
            name,
            owners.device_owners(conn, name, devices, memory),
            owners.held_elsewhere(conn, name, devices),
        )
        if changed:
            publish(conn, [name])
            repository.add_history(
                conn,
                name=name,
                snapshot_json=body,
                seq=snap.seq,
                signature=report.signature,
                now=now,
                keep=state.settings.snapshot_history,
            )
            _mark_degraded(conn, snap)
    return changed


def _content_differs(stored: str, body: str) -> bool:
    """Whether two snapshot bodies differ in more than seq and timestamp.

    An agent sends every restart's first report (and every ``--once``) with a
    new seq and time; the same node otherwise is a heartbeat: no history row,
    no ``node/reported`` event, ``changed: false``.
    """
    if stored == body:
        return False
    try:
        old = json.loads(stored)
    except ValueError:
        return True  # a row that is no snapshot's JSON (loadable.py): its agent repairs it
    new = json.loads(body)
    if not isinstance(old, dict):
        return True
    for fields in (old, new):
        fields.pop("seq", None)
        fields.pop("timestamp", None)
    return bool(old != new)


def _check_seq(name: str, seq: int, stored: int, same_content: bool, keyed: bool) -> None:
    if keyed and seq <= stored:
        # A signed snapshot is only taken once: sent again, even unchanged, it is a
        # replay, and taking it would refresh the heartbeat of a node that may be dead.
        raise ReplayedSnapshot(
            f"snapshot seq {seq} is not newer than the stored seq {stored}: node {name!r}"
            " signs its snapshots, and a signed snapshot is taken once (send a new seq)",
            {"field": "snapshot.seq", "stored_seq": stored},
        )
    if seq == stored and same_content:
        return
    if stored >= MAX_SEQ:
        # Only a forged report of a node without a key gets here (agents count
        # from the time in ms, and sign): the node is deleted and reported again.
        raise Conflict(
            f"node {name!r} holds the largest seq a snapshot can have ({stored}), so no later"
            f" snapshot can be accepted; delete the node (DELETE /v1/nodes/{name}) and report"
            " it again",
            {"field": "snapshot.seq", "stored_seq": stored},
        )
    if seq < stored:
        raise Conflict(
            f"snapshot seq {seq} is older than the stored seq {stored}:"
            " a replay, an agent whose counter went back, or a newer report that won a race",
            {"field": "snapshot.seq", "stored_seq": stored},
        )
    if seq == stored:
        raise Conflict(
            f"snapshot seq {seq} was already reported with different content;"
            " agents must increase seq with every change",
            {"field": "snapshot.seq", "stored_seq": stored},
        )


def _mark_degraded(conn: sa.Connection, snap: NodeSnapshot) -> None:
    """Allocations on GPUs that vanished, turned unhealthy or turned MIG become `degraded`,
    not dropped."""
    # A GPU in MIG mode serves only through its instances: a job held on the GPU
    # whole or in a share has lost it (turning MIG on needs the GPU idle), so the
    # GPU's own UUID counts as gone for those holds. Each hold is judged by its kind:
    # a MIG instance's UUID reported next as a GPU's (or back) is gone as what was held.
    gpus = {g.uuid for g in snap.gpus if g.health is Health.HEALTHY and not g.mig_enabled}
    migs = {
        m.uuid
        for m in snap.mig_instances
        if m.health is Health.HEALTHY
        and m.parent_gpu < len(snap.gpus)
        and snap.gpus[m.parent_gpu].health is Health.HEALTHY
    }
    held = schema.holdings()
    holds = conn.execute(
        sa.select(held.c.device, held.c.kind, held.c.allocation_id).where(
            held.c.node == snap.name, held.c.kind != "cpu"
        )
    ).all()
    broken = {
        allocation
        for device, kind, allocation in holds
        if device not in (migs if kind == "mig" else gpus)
    }
    if broken:
        conn.execute(
            sa.update(schema.allocations)
            .where(
                schema.allocations.c.id.in_(broken),
                schema.allocations.c.state.in_(("pending", "active")),
            )
            .values(state="degraded")
        )
