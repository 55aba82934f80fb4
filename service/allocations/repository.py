"""All SQL about allocations and the GPU holds that guard them.

Every state change is one conditional statement: ``UPDATE ... WHERE id IN
(...) AND <the transition's guard> RETURNING ...``. Whatever ran before it
(a read, another replica's write), the statement changes a row only if the
row is still in the state the transition starts from, and the database
serializes two statements on one row; so of two racing transitions at most
one happens, and the loser learns it from the rows it got back. The guards
are listed once, in ``GUARDS``, and docs/service.md draws the machine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from service import schema
from service.allocations import pools
from service.allocations.mapped_on import MappedOn

LIVE = schema.LIVE_STATES
_T = schema.allocations
_H = schema.gpu_holds
_S = schema.gpu_shares
SHARED = schema.SHARED


@dataclass(frozen=True, slots=True)
class FreedHold:
    """A hold (or a share, kind ``shared``) deleted because its allocation ended."""

    allocation_id: str
    node: str
    device: str
    kind: str


def _expired(now: datetime) -> sa.ColumnElement[bool]:
    return sa.and_(_T.c.expires_at.is_not(None), _T.c.expires_at <= now)


def _unexpired(now: datetime) -> sa.ColumnElement[bool]:
    return sa.or_(_T.c.expires_at.is_(None), _T.c.expires_at > now)


Guard = Callable[[datetime], sa.ColumnElement[bool]]
# Transition -> the condition the row must meet when the statement runs.
GUARDS: dict[str, Guard] = {
    # pending (or degraded with a TTL) -> active / degraded without a TTL: bound in time
    "confirm": lambda now: sa.and_(_T.c.state.in_(("pending", "degraded")), _unexpired(now)),
    # a reservation's TTL moves, while it still has one and it has not passed
    "extend": lambda now: sa.and_(
        _T.c.state.in_(("pending", "degraded")), _T.c.expires_at.is_not(None), _unexpired(now)
    ),
    # any live allocation ends when released
    "release": lambda now: _T.c.state.in_(LIVE),
    # only an unconfirmed reservation whose TTL passed expires
    "expire": lambda now: sa.and_(_T.c.state.in_(("pending", "degraded")), _expired(now)),
    # a live allocation learns the scheduler's job id, once (a job id never changes)
    "attach": lambda now: sa.and_(_T.c.state.in_(LIVE), _T.c.job_id.is_(None)),
    # a live allocation takes the GPUs its job really runs on (Slurm chose them)
    "relocate": lambda now: _T.c.state.in_(LIVE),
    # a live reservation is reused (a retried bind, a gang member's claim) and says when
    "touch": lambda now: _T.c.state.in_(LIVE),
    # a reservation the scheduler says its job runs on loses its TTL, passed or not: the
    # job holds the GPUs until it ends, whatever the reservation's clock said
    "run": lambda now: sa.and_(
        _T.c.state.in_(("pending", "degraded")), _T.c.expires_at.is_not(None)
    ),
}


def quiet_since(cutoff: datetime) -> sa.ColumnElement[bool]:
    """The row was neither made nor reused (``touch``) after ``cutoff``: what a release
    decided from a view older than the row's last use must also meet, so that a
    reservation a bind reused after the view was read outlives the decision."""
    return sa.func.coalesce(_T.c.touched_at, _T.c.created_at) <= cutoff


def by_id(conn: Connection, allocation_id: str) -> sa.RowMapping | None:
    return conn.execute(sa.select(_T).where(_T.c.id == allocation_id)).mappings().first()


def by_ids(conn: Connection, allocation_ids: Sequence[str]) -> list[sa.RowMapping]:
    query = sa.select(_T).where(_T.c.id.in_(list(allocation_ids)))
    return list(conn.execute(query).mappings().all())


def by_idempotency_key(conn: Connection, key: str) -> sa.RowMapping | None:
    query = sa.select(_T).where(_T.c.idempotency_key == key)
    return conn.execute(query).mappings().first()


def live_keyed_under(conn: Connection, prefix: str) -> list[sa.RowMapping]:
    """Live allocations whose key starts with ``prefix`` (its ``%`` and ``_`` are
    characters, not patterns), in key order."""
    query = (
        sa.select(_T)
        .where(_T.c.idempotency_key.startswith(prefix, autoescape=True), _T.c.live.is_(True))
        .order_by(_T.c.idempotency_key)
    )
    return list(conn.execute(query).mappings().all())


def confirm(conn: Connection, allocation_id: str, now: datetime) -> sa.RowMapping | None:
    """pending -> active (degraded stays degraded) and the TTL is dropped; the row, or
    None when the guard did not hold."""
    return _without_ttl(conn, allocation_id, "confirm", now)


def run(conn: Connection, allocation_id: str, now: datetime) -> sa.RowMapping | None:
    """As ``confirm``, whether or not the TTL has passed: its job runs on the GPUs (a
    scheduler's truth). The row, or None when it had no TTL to lose (already active, or
    ended)."""
    return _without_ttl(conn, allocation_id, "run", now)


def _without_ttl(
    conn: Connection, allocation_id: str, transition: str, now: datetime
) -> sa.RowMapping | None:
    """pending -> active, degraded stays degraded, the TTL dropped, under the guard of
    ``transition``."""
    statement = (
        sa.update(_T)
        .where(_T.c.id == allocation_id, GUARDS[transition](now))
        .values(
            state=sa.case((_T.c.state == "pending", "active"), else_=_T.c.state),
            expires_at=None,
        )
        .returning(*_T.c)
    )
    return conn.execute(statement).mappings().first()


def extend(
    conn: Connection, allocation_id: str, now: datetime, expires_at: datetime
) -> sa.RowMapping | None:
    """A reservation's new expiry; the row, or None when the guard did not hold."""
    statement = (
        sa.update(_T)
        .where(_T.c.id == allocation_id, GUARDS["extend"](now))
        .values(expires_at=expires_at)
        .returning(*_T.c)
    )
    return conn.execute(statement).mappings().first()


def touch(conn: Connection, allocation_id: str, now: datetime) -> sa.RowMapping | None:
    """Stamp a live allocation as reused now; the row, or None when it is no longer live."""
    statement = (
        sa.update(_T)
        .where(_T.c.id == allocation_id, GUARDS["touch"](now))
        .values(touched_at=now)
        .returning(*_T.c)
    )
    return conn.execute(statement).mappings().first()


def end(
    conn: Connection, allocation_ids: Sequence[str] | None, transition: str, now: datetime
) -> tuple[list[str], list[FreedHold]]:
    """``end_rows``, answering the ended allocations' ids."""
    rows, freed = end_rows(conn, allocation_ids, transition, now)
    return [str(r["id"]) for r in rows], freed


def any_due(conn: Connection, transition: str, now: datetime) -> bool:
    """Whether any row passes the transition's guard: a read, so the sweep's write (which
    on SQLite takes the database's one write lock ten times a second) runs only when
    there is something to end."""
    found = conn.execute(sa.select(_T.c.id).where(GUARDS[transition](now)).limit(1))
    return found.first() is not None


def end_rows(
    conn: Connection,
    allocation_ids: Sequence[str] | None,
    transition: str,
    now: datetime,
    quiet: datetime | None = None,
) -> tuple[list[sa.RowMapping], list[FreedHold]]:
    """End the allocations the transition's guard lets through (``None``: every row it
    does, for the sweep) and delete their holds; returns (the ended rows as they are now,
    by id; the freed holds). The rows are what their audit rows are made of. ``quiet``:
    only rows also ``quiet_since`` it end.

    The state change comes first: it takes the rows (Postgres locks them; on SQLite
    it starts the write), so the holds deleted next are exactly those of the rows it
    changed. The foreign keys are checked at commit, when both statements have run.
    """
    final = "expired" if transition == "expire" else "released"
    where = [GUARDS[transition](now)]
    if quiet is not None:
        where.append(quiet_since(quiet))
    if allocation_ids is not None:
        if not allocation_ids:
            return [], []
        where.append(_T.c.id.in_(list(allocation_ids)))
    statement = (
        sa.update(_T)
        .where(*where)
        .values(
            state=final,
            live=None,
            anchor_node=None,
            anchor_device=None,
            share_node=None,
            share_device=None,
            ended_at=now,
            expires_at=None,
        )
        .returning(*_T.c)
    )
    rows = sorted(conn.execute(statement).mappings(), key=lambda r: str(r["id"]))
    ended = [str(r["id"]) for r in rows]
    if not ended:
        return [], []
    return rows, drop_holds(conn, ended)


def ended_by(
    conn: Connection, allocation_ids: Sequence[str] | None, transition: str, now: datetime
) -> list[str]:
    """The allocations (of ``allocation_ids``; None: any) that ``end_rows`` ended with this
    transition at ``now``, by id: a transaction whose commit went unanswered finds here
    whether it committed (``now`` is its own moment, to the microsecond)."""
    final = "expired" if transition == "expire" else "released"
    where = [_T.c.state == final, _T.c.ended_at == now]
    if allocation_ids is not None:
        where.append(_T.c.id.in_(list(allocation_ids)))
    return sorted(str(i) for i in conn.execute(sa.select(_T.c.id).where(*where)).scalars())


def drop_shares(conn: Connection, allocation_ids: Sequence[str]) -> list[FreedHold]:
    """Delete these allocations' shares and give their thousandths back to the pools,
    deleting a pool that reaches 0; the shares deleted.

    A pool is subtracted from first and deleted after, at 0: of two replicas ending a
    GPU's last two shares at once, the second waits on the first's row lock (Postgres)
    and then sees 0, so no empty pool is left (deleting a pool whose shares looked
    gone first, each could see the other's share still there). Pools are updated in
    (node, device) order, so two such transactions lock them in one order.
    """
    deleted = conn.execute(
        sa.delete(_S)
        .where(_S.c.allocation_id.in_(list(allocation_ids)))
        .returning(_S.c.allocation_id, _S.c.node, _S.c.device, _S.c.milli)
    ).all()
    if not deleted:
        return []
    given: dict[tuple[str, str], int] = {}
    for _, node, device, milli in deleted:
        given[(str(node), str(device))] = given.get((str(node), str(device)), 0) + int(milli)
    pools.give_back(conn, SHARED, given)
    return [FreedHold(str(a), str(n), str(d), SHARED) for a, n, d, _ in deleted]


def attach(
    conn: Connection, allocation_ids: Sequence[str], job_id: str, now: datetime
) -> list[str]:
    """Record the job id on the live allocations that have none; the ids changed."""
    if not allocation_ids:
        return []
    statement = (
        sa.update(_T)
        .where(_T.c.id.in_(list(allocation_ids)), GUARDS["attach"](now))
        .values(job_id=job_id)
        .returning(_T.c.id)
    )
    return sorted(str(i) for i in conn.execute(statement).scalars())


def relocate(
    conn: Connection,
    allocation_id: str,
    now: datetime,
    *,
    job_id: str | None,
    placement: str,
    holds: Sequence[tuple[str, str, str]],
    on: Mapping[str, MappedOn] | None = None,
    placed: str | None = None,
) -> tuple[sa.RowMapping | None, list[FreedHold]]:
    """Move a live allocation onto ``holds`` (node, device, kind): the row and the holds
    it gave up, or (None, []) when the guard did not hold. The holds are replaced in the
    caller's transaction; a new hold another allocation has makes the insert fail
    (IntegrityError), so the caller ends those first. The anchor moves to the first new
    hold; the deferred foreign keys see both at commit (``on`` as for ``insert_holds``).
    ``placed``: move it only while its placement is still this one, the one ``placement``
    and ``holds`` were made from (one task of several moved: another transaction that
    moved another task meanwhile is not written over)."""
    node, device, _ = holds[0]
    where = [_T.c.id == allocation_id, GUARDS["relocate"](now)]
    if placed is not None:
        where.append(_T.c.placement == placed)
    statement = (
        sa.update(_T)
        .where(*where)
        .values(
            job_id=job_id,
            placement=placement,
            anchor_node=node,
            anchor_device=device,
            share_node=None,  # what the job really runs on is whole GPUs
            share_device=None,
        )
        .returning(*_T.c)
    )
    row = conn.execute(statement).mappings().first()
    if row is None:
        return None, []
    given_up = drop_holds(conn, [allocation_id])
    insert_holds(conn, allocation_id, holds, placement, on)
    return row, given_up


def drop_holds(conn: Connection, allocation_ids: Sequence[str]) -> list[FreedHold]:
    """Delete every hold and share of these allocations, in the caller's transaction
    (which gives them new ones, or ends them, before it commits); what was freed."""
    if not allocation_ids:
        return []
    return _deleted(conn, _H.c.allocation_id.in_(list(allocation_ids))) + drop_shares(
        conn, allocation_ids
    )


def drop_devices(
    conn: Connection, allocation_id: str, devices: Sequence[tuple[str, str]]
) -> list[FreedHold]:
    """Delete these (node, device) holds of one allocation (a task about to move), in the
    caller's transaction, which gives the allocation its new holds before it commits."""
    if not devices:
        return []
    return _deleted(
        conn,
        sa.and_(
            _H.c.allocation_id == allocation_id,
            sa.tuple_(_H.c.node, _H.c.device).in_(list(devices)),
        ),
    )


def keep_anchor(conn: Connection, allocation_id: str) -> None:
    """Name one of the allocation's holds left as its anchor where the hold it named was
    just deleted (``drop_devices`` giving up some of a live allocation's devices and
    keeping the rest): else the deferred foreign key failed the whole transaction at
    its commit."""
    row = conn.execute(
        sa.select(_T.c.anchor_node, _T.c.anchor_device).where(_T.c.id == allocation_id)
    ).first()
    if row is None or row.anchor_node is None:
        return  # ended, or anchored on its share row
    named = sa.and_(
        _H.c.allocation_id == allocation_id,
        _H.c.node == row.anchor_node,
        _H.c.device == row.anchor_device,
    )
    if conn.execute(sa.select(_H.c.device).where(named)).first() is not None:
        return
    left = conn.execute(
        sa.select(_H.c.node, _H.c.device)
        .where(_H.c.allocation_id == allocation_id)
        .order_by(_H.c.node, _H.c.device)
        .limit(1)
    ).first()
    if left is not None:
        conn.execute(
            sa.update(_T)
            .where(_T.c.id == allocation_id)
            .values(anchor_node=left.node, anchor_device=left.device)
        )


def _deleted(conn: Connection, which: sa.ColumnElement[bool]) -> list[FreedHold]:
    """Delete these holds, giving each MIG instance's back to its GPU's pool."""
    deleted = conn.execute(
        sa.delete(_H)
        .where(which)
        .returning(_H.c.allocation_id, _H.c.node, _H.c.device, _H.c.kind, _H.c.parent)
    ).all()
    pools.give_back(conn, pools.MIG_POOL, pools.migs_given((n, k, p) for _, n, _, k, p in deleted))
    return [FreedHold(str(a), str(n), str(d), str(k)) for a, n, d, k, _ in deleted]


def insert(
    conn: Connection,
    row: dict[str, object],
    holds: Sequence[tuple[str, str, str]],
    on: Mapping[str, MappedOn] | None = None,
) -> None:
    """A new live allocation and its holds (outside the group committer: rare writes)."""
    conn.execute(sa.insert(_T), row)
    insert_holds(conn, str(row["id"]), holds, str(row["placement"]), on)


def insert_holds(
    conn: Connection,
    allocation_id: str,
    holds: Sequence[tuple[str, str, str]],
    placement: str,
    on: Mapping[str, MappedOn] | None = None,
) -> None:
    """``placement``: the allocation's, JSON (a MIG instance's GPU, whose pool counts its
    hold, is read from it). ``on``: node -> its row as the devices were named on; a hold
    then names it (``gpu_holds.node_seq``, ``node_reported_at``, ``node_cordoned``), and
    a row that differs at the commit (a snapshot replaced, a cordon changed) fails it."""
    known = on or {}
    # Every row names the same columns (one multi-row insert): none for a node not named.
    unnamed: dict[str, object] = {"node_seq": None, "node_reported_at": None, "node_cordoned": None}
    rows = pools.with_parents(
        (
            {
                "node": n,
                "device": d,
                "kind": k,
                "allocation_id": allocation_id,
                "live": True,
                "parent": None,
                **(known[n].columns() if n in known else unnamed),
            }
            for n, d, k in holds
        ),
        placement,
    )
    conn.execute(sa.insert(_H), rows)
    pools.add_migs(conn, rows)


def holders(conn: Connection, devices: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    """Allocation id -> the devices of ``devices`` (node, device) it holds, a GPU's MIG
    instances counting as the GPU: an instance held since its GPU turned MIG off (the
    snapshot lists it no more) still holds the GPU's pool, which a whole hold meets."""
    if not devices:
        return {}
    named = list(devices)
    held = schema.holdings()  # a shared GPU's holders are its shares' allocations
    query = sa.union_all(
        sa.select(held.c.allocation_id, held.c.node, held.c.device).where(
            sa.tuple_(held.c.node, held.c.device).in_(named)
        ),
        sa.select(_H.c.allocation_id, _H.c.node, _H.c.device).where(
            _H.c.kind == "mig", sa.tuple_(_H.c.node, _H.c.parent).in_(named)
        ),
    )
    found: dict[str, list[str]] = {}
    for allocation_id, node, device in conn.execute(query).all():
        seen = found.setdefault(str(allocation_id), [])
        if f"{node}/{device}" not in seen:
            seen.append(f"{node}/{device}")
    return found


def beyond(conn: Connection, allocation_ids: Sequence[str], nodes: Sequence[str]) -> list[str]:
    """Those of ``allocation_ids`` that hold, or share, a device on a node not in ``nodes``."""
    if not allocation_ids:
        return []
    held = schema.holdings()
    query = (
        sa.select(held.c.allocation_id)
        .where(held.c.allocation_id.in_(list(allocation_ids)), held.c.node.not_in(list(nodes)))
        .distinct()
    )
    return sorted(str(a) for a in conn.execute(query).scalars())


def live_for_job(
    conn: Connection, job_id: str, allocation_ids: Sequence[str]
) -> list[sa.RowMapping]:
    """Live allocations of a job: carrying its id, or named by it (its admin comment)."""
    named = _T.c.id.in_(list(allocation_ids)) if allocation_ids else sa.false()
    query = (
        sa.select(_T)
        .where(sa.or_(_T.c.job_id == job_id, named), _T.c.state.in_(LIVE))
        .order_by(_T.c.created_at, _T.c.id)
    )
    return list(conn.execute(query).mappings().all())


def holds_with_kind(conn: Connection, allocation_id: str) -> list[tuple[str, str, str]]:
    """(node, device, kind) of every hold of one allocation (a share is not a hold: a
    relocation gives it up, ``drop_shares``)."""
    query = sa.select(_H.c.node, _H.c.device, _H.c.kind).where(_H.c.allocation_id == allocation_id)
    return [(str(n), str(d), str(k)) for n, d, k in conn.execute(query).all()]


def holds_of(conn: Connection, allocation_ids: Sequence[str]) -> set[tuple[str, str, str]]:
    """(node, device, kind) of everything these allocations hold, shares (kind
    ``shared``) included: a truth matches them only as the same kind, so a share is
    never taken for the whole GPU a scheduler says the job runs on."""
    if not allocation_ids:
        return set()
    held = schema.holdings()
    query = sa.select(held.c.node, held.c.device, held.c.kind).where(
        held.c.allocation_id.in_(list(allocation_ids))
    )
    return {(str(n), str(d), str(k)) for n, d, k in conn.execute(query).all()}


def live_rows(conn: Connection) -> list[sa.RowMapping]:
    """Every live allocation, oldest first: a reconciler must see them all."""
    query = sa.select(_T).where(_T.c.state.in_(LIVE)).order_by(_T.c.created_at, _T.c.id)
    return list(conn.execute(query).mappings().all())


def live_ids_for_job(conn: Connection, job_id: str) -> list[str]:
    query = sa.select(_T.c.id).where(_T.c.job_id == job_id, _T.c.state.in_(LIVE))
    return list(conn.execute(query).scalars())


def count_for_job(conn: Connection, job_id: str) -> int:
    """How many allocations, live or ended, ever carried ``job_id``."""
    query = sa.select(sa.func.count()).select_from(_T).where(_T.c.job_id == job_id)
    return int(conn.execute(query).scalar_one())


def listing(
    conn: Connection, *, job_id: str | None, node: str | None, state: str | None, limit: int
) -> list[sa.RowMapping]:
    query = sa.select(_T).order_by(_T.c.created_at.desc(), _T.c.id).limit(limit)
    if job_id is not None:
        query = query.where(_T.c.job_id == job_id)
    if state is not None:
        query = query.where(_T.c.state == state)
    if node is not None:
        # The placement JSON names its nodes; holds only exist while live, so
        # match on the stored placement to find ended allocations too.
        # autoescape: % and _ in the name are the characters themselves, not wildcards.
        query = query.where(_T.c.placement.contains(f'"node": "{node}"', autoescape=True))
    return list(conn.execute(query).mappings().all())
