"""Node operations: views out, cordons, keys. Handlers stay thin; SQL lives in repository.

Snapshots in: snapshot_report.py (re-exported here for the callers that import it here).
"""

from __future__ import annotations

import json
from collections import defaultdict

import sqlalchemy as sa
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from placement import NodeSnapshot, bandwidth_matrix
from placement.topo_text import render_topo_matrix
from service import schema
from service.admin_actions import INTERNAL, Caller, require_admin
from service.audit import records
from service.audit import store as audit
from service.db import in_transaction
from service.edge import revoked_meanwhile
from service.errors import Conflict, NotFound
from service.lost_commit import following
from service.nodes import region_scope, repository
from service.nodes.loadable import check_loadable
from service.nodes.schemas import (
    IslandView,
    NodeGpuView,
    NodeKeyRegistration,
    NodeKeyView,
    NodeView,
    TopologyView,
)
from service.nodes.snapshot_report import report_snapshot
from service.notify import publish
from service.state import ServiceState

__all__ = ["report_snapshot"]  # with the functions defined here


def heartbeat(state: ServiceState, name: str, caller: Caller = INTERNAL) -> None:
    """The node is alive. A region-scoped agent's heartbeat is written only while the
    database holds the node in its region (region_scope.py), whatever this replica's
    memory says: the update is conditional on it, so a move that committed first wins."""
    now = state.clock()
    region = region_scope.required_region(caller, name)
    revoked_meanwhile.refuse_if_revoked()
    with state.engine.begin() as conn:
        if not repository.touch_heartbeat(conn, name, now, region=region):
            row = repository.get(conn, name)
            if row is None:
                raise NotFound(f"no node named {name!r}; report a snapshot first")
            region_scope.check(caller, name, region or "", str(row["region"]))
            # Moved back into the region since the update: its region is the agent's now.
            if not repository.touch_heartbeat(conn, name, now, region=region):
                raise Conflict(f"node {name!r} changed region during the heartbeat; send it again")
    with state.lock:
        state.heartbeats[name] = now
        state.refresh_availability([name])


def _refuse_unloadable(state: ServiceState, name: str) -> None:
    """NotFound for a stored node the engine cannot load (a row from before snapshots were
    checked so, or edited by hand): the API knows no such node, and a cordon written
    under the 404 that follows it (and audited) came back with the node once its agent
    repaired it. Judged on the stored row, not memory, which may not have loaded a node
    another replica stored a moment ago; without the state lock, which a cordon takes
    only after its commit (see set_cordoned)."""
    with state.engine.connect() as conn:
        body = conn.execute(
            sa.select(schema.nodes.c.snapshot).where(schema.nodes.c.name == name)
        ).scalar_one_or_none()
    if body is None:
        return  # the write finds no row and says so
    try:
        check_loadable(NodeSnapshot.model_validate_json(body), state.cluster)
    except Exception:  # whatever the row holds, this replica serves no such node
        raise NotFound(f"no node named {name!r}") from None


def set_cordoned(state: ServiceState, name: str, cordoned: bool) -> NodeView:
    """Cordon or uncordon. The node's reservations' holds follow the cordon (ON UPDATE
    CASCADE, service/schema.py), so a reservation committing at the same moment may
    deadlock with it on Postgres: the transaction is then run again."""

    def write(conn: Connection) -> None:
        changed = repository.set_cordoned(conn, name, cordoned)
        if changed is None:
            raise NotFound(f"no node named {name!r}")
        if not changed:
            # Cordoned (or not) already: no change, so no audit row (docs/security.md:
            # an admin action that changed nothing leaves none) and nothing to tell.
            return
        publish(conn, [name])
        action = "node_cordoned" if cordoned else "node_uncordoned"
        audit.write(conn, [records.record("admin", action, state.clock(), nodes=[name])])

    revoked_meanwhile.refuse_if_revoked()
    _refuse_unloadable(state, name)
    with following(state):  # a commit answer lost: memory reads what the database says
        in_transaction(state.engine, write)
    # Memory takes the stored row, read under the state lock, not this call's value: a
    # cordon and an uncordon racing here commit in one order and could reach memory in
    # the other, leaving the operator's last word undone in memory.
    state.sync_nodes([name])
    return get_node(state, name)


def remove_node(state: ServiceState, name: str) -> None:
    revoked_meanwhile.refuse_if_revoked()
    try:
        with state.engine.begin() as conn:
            holdings = schema.holdings()  # what allocations hold, not the pools counting it
            held = conn.execute(
                sa.select(sa.func.count()).select_from(holdings).where(holdings.c.node == name)
            ).scalar_one()
            if held:
                raise Conflict(
                    f"node {name!r} still holds {held} allocated device(s); release them first",
                    {"held": held},
                )
            if not repository.delete(conn, name):
                raise NotFound(f"no node named {name!r}")
            publish(conn, [name])
            audit.write(
                conn, [records.record("admin", "node_deleted", state.clock(), nodes=[name])]
            )
    except IntegrityError:
        # A reservation committed between the count and the delete (another replica's):
        # its holds name the node's snapshot (service/schema.py), so the delete is undone.
        raise Conflict(
            f"node {name!r} was given an allocation while it was deleted; release it first",
            {"node": name},
        ) from None
    # Memory takes what the database holds now, read under the state lock, not "gone": a
    # first report of the node committing after the delete may reach memory before this
    # line, and removing the node then left the stored node unserved here (on SQLite,
    # which has no resync, until its next change).
    state.sync_nodes([name])


def _allocations_by_node(state: ServiceState, names: list[str] | None) -> dict[str, list[str]]:
    held = schema.holdings()
    query = sa.select(held.c.node, held.c.allocation_id).distinct()
    if names is not None:
        query = query.where(held.c.node.in_(names))
    with state.engine.connect() as conn:
        rows = conn.execute(query).all()
    out: dict[str, list[str]] = defaultdict(list)
    for node, allocation in rows:
        out[node].append(allocation)
    return {node: sorted(ids) for node, ids in out.items()}


def _times(state: ServiceState, names: list[str] | None) -> dict[str, sa.RowMapping]:
    query = sa.select(
        schema.nodes.c.name,
        schema.nodes.c.seq,
        schema.nodes.c.reported_at,
        schema.nodes.c.heartbeat_at,
    )
    if names is not None:
        query = query.where(schema.nodes.c.name.in_(names))
    with state.engine.connect() as conn:
        return {row["name"]: row for row in conn.execute(query).mappings().all()}


def _view(state: ServiceState, name: str, row: sa.RowMapping, allocations: list[str]) -> NodeView:
    entry = state.cluster.node(name)
    snap = entry.snapshot
    free = entry.free_mask
    free_list = [g.index for g in snap.gpus if free >> g.index & 1]
    status = (
        "cordoned" if name in state.cordoned else ("stale" if state.is_stale(name) else "ready")
    )
    return NodeView(
        name=name,
        region=snap.region,
        labels=snap.labels,
        cpu_isa=snap.cpu_isa,
        gpu_count=snap.gpu_count,
        free_gpus=free_list,
        gpus=[
            NodeGpuView(
                index=g.index,
                uuid=g.uuid,
                model=g.model,
                memory_mib=g.memory_mib,
                numa_node=g.numa_node,
                health=g.health.value,
                mig_enabled=g.mig_enabled,
                free=bool(free >> g.index & 1),
                island=entry.island_of[g.index],
                share_milli=entry.shares.get(g.uuid, 0),
            )
            for g in snap.gpus
        ],
        islands=[
            IslandView(
                name=i.name,
                gpus=list(i.gpus),
                free=[g for g in i.gpus if free >> g & 1],
                kind=i.kind,
            )
            for i in entry.islands
        ],
        fabric_domain=snap.fabric_domain(),
        state=status,
        seq=int(row["seq"]),
        reported_at=row["reported_at"],
        heartbeat_at=state.heartbeats[name],
        allocations=allocations,
    )


def get_node(state: ServiceState, name: str) -> NodeView:
    with state.lock:
        if name not in state.cluster:
            raise NotFound(f"no node named {name!r}")
    times = _times(state, [name])
    if name not in times:
        raise NotFound(f"no node named {name!r}")
    allocations = _allocations_by_node(state, [name]).get(name, [])
    with state.lock:
        # Asked again: a delete heard between the two holds of the lock (this replica's,
        # or another's through the listener) took the node out of memory meanwhile.
        if name not in state.cluster:
            raise NotFound(f"no node named {name!r}")
        return _view(state, name, times[name], allocations)


def list_nodes(state: ServiceState) -> list[NodeView]:
    times = _times(state, None)
    allocations = _allocations_by_node(state, None)
    with state.lock:
        return [
            _view(state, name, times[name], allocations.get(name, []))
            for name in state.cluster.names()
            if name in times
        ]


def topology(state: ServiceState, name: str) -> TopologyView:
    with state.lock:
        if name not in state.cluster:
            raise NotFound(f"no node named {name!r}")
        snap = state.cluster.node(name).snapshot
        table = state.cluster.bandwidth
    matrix = bandwidth_matrix(snap, table)
    return TopologyView(
        node=name,
        gpus=[f"GPU{g.index}" for g in snap.gpus],
        links=snap.links,
        bandwidth_gbps=[[float(v) for v in row] for row in matrix],
        text=render_topo_matrix(snap),
    )


def snapshot_history(state: ServiceState, name: str) -> list[dict[str, object]]:
    with state.engine.connect() as conn:
        rows = repository.history(conn, name)
    if not rows:
        raise NotFound(f"no node named {name!r}")
    return [
        {
            "seq": row["seq"],
            "received_at": row["received_at"],
            "signature": row["signature"],
            "snapshot": json.loads(row["snapshot"]),
        }
        for row in rows
    ]


def _key_view(row: sa.RowMapping) -> NodeKeyView:
    return NodeKeyView(
        node=row["node"],
        algorithm=row["algorithm"],
        public_key=row["public_key"],
        registered_at=row["registered_at"],
    )


def register_key(
    state: ServiceState,
    name: str,
    key: NodeKeyRegistration,
    caller: Caller = INTERNAL,
    *,
    replace: bool = False,
) -> NodeKeyView:
    """Register the key a node signs its snapshots with (docs/security.md).

    The access table (service/access.py) lets only admins and the agent
    tokens whose scope holds the node call this. A node's first key is
    registered by an admin, or by that agent when the operator trusts on
    first use (TOPOPLACE_TRUST_ON_FIRST_USE). The same key again is accepted
    (agents register on every start); a different one is a conflict, so a
    stray agent cannot take over a name, unless an admin ``replace``s it.
    """
    try:
        NodeSnapshot(name=name)
    except ValidationError as exc:
        raise RequestValidationError(
            [{"loc": ("path", "name"), "msg": exc.errors()[0]["msg"], "type": "value_error"}]
        ) from None
    if replace:
        require_admin(caller, "replacing a node's key")
    revoked_meanwhile.refuse_if_revoked()
    for _ in range(2):  # a concurrent first registration may win the insert
        try:
            with state.engine.begin() as conn:
                row = repository.get_key(conn, name)
                if row is None or (replace and _differs(row, key)):
                    if row is None and not state.settings.trust_on_first_use:
                        require_admin(caller, "registering a node's first key")
                    if row is None:
                        _check_stored_region(conn, caller, name)
                    action = "key_registered" if row is None else "key_replaced"
                    if row is not None:
                        repository.delete_key(conn, name)
                    now = state.clock()
                    repository.insert_key(
                        conn,
                        name=name,
                        algorithm=key.algorithm,
                        public_key=key.public_key,
                        now=now,
                    )
                    row = repository.get_key(conn, name)
                    assert row is not None
                    detail = {"algorithm": key.algorithm, "public_key": key.public_key}
                    audit.write(
                        conn, [records.record("admin", action, now, nodes=[name], detail=detail)]
                    )
        except IntegrityError:
            continue
        if _differs(row, key):
            raise Conflict(
                f"node {name!r} already has a different {row['algorithm']} public key;"
                f" an admin replaces it (PUT /v1/nodes/{name}/key?replace=true) or deletes it"
                f" (DELETE /v1/nodes/{name}/key)",
                {"field": "public_key"},
            )
        return _key_view(row)
    raise Conflict(f"the key of node {name!r} changed while registering; try again")


def _check_stored_region(conn: Connection, caller: Caller, name: str) -> None:
    """A region-scoped agent claims a node's first key only for a node the database holds
    in its region, or holds not at all (its first snapshot must then be in the region):
    this replica's memory may not know of a move, or of the node, another one stored.
    The row is held (Postgres) until the key commits, so a move waits for it or wins."""
    region = region_scope.required_region(caller, name)
    if region is None:
        return
    row = repository.get(conn, name, hold=True)
    region_scope.check(caller, name, region, None if row is None else str(row["region"]))


def _differs(row: sa.RowMapping, key: NodeKeyRegistration) -> bool:
    return bool(row["public_key"] != key.public_key or row["algorithm"] != key.algorithm)


def get_key(state: ServiceState, name: str) -> NodeKeyView:
    with state.engine.connect() as conn:
        row = repository.get_key(conn, name)
    if row is None:
        raise NotFound(f"no public key is registered for node {name!r}")
    return _key_view(row)


def delete_key(state: ServiceState, name: str, caller: Caller = INTERNAL) -> None:
    require_admin(caller, "deleting a node's key")
    revoked_meanwhile.refuse_if_revoked()
    with state.engine.begin() as conn:
        if not repository.delete_key(conn, name):
            raise NotFound(f"no public key is registered for node {name!r}")
        audit.write(conn, [records.record("admin", "key_deleted", state.clock(), nodes=[name])])
