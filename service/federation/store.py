"""The regions table and the forwarded keys: every SQL statement of the federation.

Plain functions on an engine (or a connection), called off the event loop.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from service.access import Role
from service.audit import records
from service.audit import store as audit
from service.schema import federation_forwards, regions
from service.tokens import store as token_store


@dataclass(frozen=True)
class RegionRecord:
    name: str
    cloud: str
    location: str
    url: str
    public_key: str
    forward_token: str | None
    token_id: str
    prices: list[dict[str, Any]]
    egress: dict[str, float]
    labels: dict[str, str]
    registered_at: datetime
    retired_at: datetime | None
    summary: dict[str, Any] | None
    summary_seq: int | None
    summary_at: datetime | None


def _utc(value: datetime | None) -> datetime | None:
    # SQLite returns naive datetimes for timezone-aware columns.
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def _record(row: sa.Row[Any]) -> RegionRecord:
    m = row._mapping
    registered = _utc(m["registered_at"])
    assert registered is not None
    return RegionRecord(
        name=m["name"],
        cloud=m["cloud"],
        location=m["location"],
        url=m["url"],
        public_key=m["public_key"],
        forward_token=m["forward_token"],
        token_id=m["token_id"],
        prices=orjson.loads(m["prices"]),
        egress=orjson.loads(m["egress"]),
        labels=orjson.loads(m["labels"]),
        registered_at=registered,
        retired_at=_utc(m["retired_at"]),
        summary=orjson.loads(m["summary"]) if m["summary"] else None,
        summary_seq=m["summary_seq"],
        summary_at=_utc(m["summary_at"]),
    )


class NameTaken(ValueError):
    """A region of this name is registered (or was, and is retired)."""


def register(engine: sa.Engine, body: dict[str, Any], now: datetime) -> tuple[RegionRecord, str]:
    """Store a region and make its region token in one transaction; (record, secret)."""
    name = body["name"]
    with engine.begin() as conn:
        if conn.execute(sa.select(regions.c.name).where(regions.c.name == name)).first():
            raise NameTaken(name)
        record, secret = token_store.create_in(
            conn, Role.REGION, token_store.Scope(region=name), f"region {name}", now
        )
        try:
            conn.execute(
                regions.insert().values(
                    name=name,
                    cloud=body["cloud"],
                    location=body.get("location", ""),
                    url=body["url"],
                    public_key=body["public_key"],
                    forward_token=body.get("forward_token"),
                    token_id=record.id,
                    prices=json.dumps(body["prices"]),
                    egress=json.dumps(body["egress"]),
                    labels=json.dumps(body.get("labels", {})),
                    registered_at=now,
                )
            )
        except IntegrityError:
            raise NameTaken(name) from None
        row = conn.execute(sa.select(regions).where(regions.c.name == name)).one()
        detail = {"region": name, "cloud": body["cloud"], "url": body["url"]}
        detail |= {"token_id": record.id, "public_key": body["public_key"]}
        audit.write(conn, [records.record("admin", "region_registered", now, detail=detail)])
    return _record(row), secret


def listed(engine: sa.Engine, include_retired: bool = False) -> list[RegionRecord]:
    query = sa.select(regions).order_by(regions.c.name)
    if not include_retired:
        query = query.where(regions.c.retired_at.is_(None))
    with engine.connect() as conn:
        return [_record(row) for row in conn.execute(query)]


def live_seqs(engine: sa.Engine) -> dict[str, int | None]:
    """Each live region's summary seq: what moves when its summary does (a cheap read,
    so a replica rereads only the regions whose summary changed)."""
    query = sa.select(regions.c.name, regions.c.summary_seq).where(regions.c.retired_at.is_(None))
    with engine.connect() as conn:
        return {str(name): seq for name, seq in conn.execute(query)}


def named(engine: sa.Engine, names: Collection[str]) -> list[RegionRecord]:
    """The live regions of these names (those still live)."""
    query = sa.select(regions).where(
        regions.c.name.in_(list(names)), regions.c.retired_at.is_(None)
    )
    with engine.connect() as conn:
        return [_record(row) for row in conn.execute(query)]


def get(engine: sa.Engine, name: str) -> RegionRecord | None:
    with engine.connect() as conn:
        row = conn.execute(sa.select(regions).where(regions.c.name == name)).first()
    return None if row is None else _record(row)


def retire(engine: sa.Engine, name: str, now: datetime) -> RegionRecord | None:
    """Mark the region retired and revoke its token, together; None if there is none."""
    with engine.begin() as conn:
        row = conn.execute(sa.select(regions).where(regions.c.name == name)).first()
        if row is None:
            return None
        if row._mapping["retired_at"] is None:
            conn.execute(regions.update().where(regions.c.name == name).values(retired_at=now))
            token_store.revoke_in(conn, row._mapping["token_id"], now)
            detail = {"region": name, "token_id": row._mapping["token_id"]}
            audit.write(conn, [records.record("admin", "region_retired", now, detail=detail)])
        row = conn.execute(sa.select(regions).where(regions.c.name == name)).one()
    return _record(row)


class Retired(ValueError):
    """The region is retired: nothing is forwarded to it, so nothing of it is changed."""


def update(
    engine: sa.Engine, name: str, changes: dict[str, str | None], now: datetime
) -> RegionRecord | None:
    """Set a live region's forward target (``url``, ``forward_token``) and write its audit
    row, together; None if there is no such region, :class:`Retired` if it is retired. A
    change to nothing writes nothing."""
    # The row locked (on Postgres) from the read on: a retirement committed in between
    # would get a URL set on a retired region, another update the audit row a previous
    # URL no longer stored.
    locked = sa.select(regions).where(regions.c.name == name).with_for_update()
    with engine.begin() as conn:
        row = conn.execute(locked).first()
        if row is None:
            return None
        if row._mapping["retired_at"] is not None:
            raise Retired(name)
        changed = {k: v for k, v in changes.items() if row._mapping[k] != v}
        if changed:
            conn.execute(regions.update().where(regions.c.name == name).values(**changed))
            # The token is a secret: the row says it changed, never what it is.
            detail: dict[str, Any] = {"region": name, "changed": sorted(changed)}
            if "url" in changed:
                detail |= {"url": changed["url"], "previous_url": row._mapping["url"]}
            audit.write(conn, [records.record("admin", "region_updated", now, detail=detail)])
            row = conn.execute(sa.select(regions).where(regions.c.name == name)).one()
    return _record(row)


def forward_target(engine: sa.Engine, name: str) -> tuple[str, str | None] | None:
    """The live region's ``url`` and ``forward_token`` as the database holds them now;
    None when it is not registered or is retired."""
    query = sa.select(regions.c.url, regions.c.forward_token).where(
        regions.c.name == name, regions.c.retired_at.is_(None)
    )
    with engine.connect() as conn:
        found = conn.execute(query).first()
    return None if found is None else (str(found[0]), found[1])


def store_summary(
    engine: sa.Engine,
    name: str,
    summary: dict[str, Any],
    seq: int,
    now: datetime,
    binding_up_to: int,
) -> bool:
    """Keep a summary newer than the stored one; False when it is not newer (a replay).
    A stored seq above ``binding_up_to`` is too far ahead to bind (summary_seq.py)."""
    s = regions.c.summary_seq
    with engine.begin() as conn:
        changed = conn.execute(
            regions.update()
            .where(
                regions.c.name == name,
                regions.c.retired_at.is_(None),
                sa.or_(s.is_(None), s < seq, s > binding_up_to),
            )
            .values(summary=orjson.dumps(summary).decode(), summary_seq=seq, summary_at=now)
        ).rowcount
    return bool(changed)


# -- which region each Idempotency-Key went to ---------------------------------
#
# A keyed request holds its key's row (``holder``, until ``held_until``) while it
# forwards, on whichever replica it runs: a second request with the same key meanwhile
# is told the key is in flight rather than routed on its own, so the two can never
# place the key in two regions. Only the holder moves the row to another region or
# deletes it; a holder that died lets go when its time is up.


class KeyHeld(Exception):
    """Another request holds this Idempotency-Key now (a twin, on this or another replica)."""


class OtherRequest(Exception):
    """The key was sent before for another request (its row names that one)."""


def take_key(
    engine: sa.Engine,
    key: str,
    holder: str,
    now: datetime,
    until: datetime,
    request: str | None = None,
    same: Callable[[str, str], bool] = operator.eq,
) -> tuple[str, str] | None:
    """Hold ``key``'s row: (region, GPU model) it went to before; None when it never went
    anywhere (the row is made by :func:`hold_key`). Raises :class:`OtherRequest` when the
    row names another request than ``request`` (None: not compared; a row made before
    requests were kept names none), by ``same(kept, request)``, and :class:`KeyHeld`
    when another request holds it. A row for another request is never taken (the take
    is rolled back), so its own retry finds it free."""
    t = federation_forwards
    with engine.begin() as conn:
        taken = conn.execute(
            t.update()
            .where(
                t.c.idempotency_key == key,
                sa.or_(t.c.held_until.is_(None), t.c.held_until <= now),
            )
            .values(holder=holder, held_until=until)
        ).rowcount
        # Read after the update, in its transaction: where the row points now.
        found = conn.execute(
            sa.select(t.c.region, t.c.gpu_model, t.c.request).where(t.c.idempotency_key == key)
        ).first()
        if found is None:
            return None
        if request is not None and found[2] is not None and not same(found[2], request):
            raise OtherRequest(key)  # raised in the transaction: the take is undone
    if not taken:
        raise KeyHeld(key)
    return str(found[0]), str(found[1])


def hold_key(
    engine: sa.Engine,
    key: str,
    region: str,
    gpu_model: str,
    holder: str,
    now: datetime,
    until: datetime,
    request: str | None = None,
) -> bool:
    """Record that ``key`` goes to ``region`` for ``request``, held by ``holder``; False
    when a twin request recorded it first."""
    try:
        with engine.begin() as conn:
            conn.execute(
                federation_forwards.insert().values(
                    idempotency_key=key,
                    region=region,
                    gpu_model=gpu_model,
                    request=request,
                    created_at=now,
                    holder=holder,
                    held_until=until,
                )
            )
    except IntegrityError:
        return False
    return True


def move_key(engine: sa.Engine, key: str, holder: str, region: str, gpu_model: str) -> bool:
    """The key's region refused it and holds nothing for it: it goes to ``region`` now.
    False when ``holder`` no longer holds the row (its time ran out and a retry took it)."""
    t = federation_forwards
    with engine.begin() as conn:
        moved = conn.execute(
            t.update()
            .where(t.c.idempotency_key == key, t.c.holder == holder)
            .values(region=region, gpu_model=gpu_model)
        ).rowcount
    return bool(moved)


def let_go_key(engine: sa.Engine, key: str, holder: str) -> None:
    """The holder is done: the row stays (where the key went) for the next request."""
    t = federation_forwards
    with engine.begin() as conn:
        conn.execute(
            t.update()
            .where(t.c.idempotency_key == key, t.c.holder == holder)
            .values(holder=None, held_until=None)
        )


def drop_key(engine: sa.Engine, key: str, holder: str) -> None:
    """Every region refused the key and holds nothing for it: it may go anywhere next."""
    t = federation_forwards
    with engine.begin() as conn:
        conn.execute(t.delete().where(t.c.idempotency_key == key, t.c.holder == holder))


def _forgettable(t: sa.FromClause, before: datetime, now: datetime) -> sa.ColumnElement[bool]:
    """First forwarded before ``before``, and held by no request at ``now``."""
    held_by_none = sa.or_(t.c.held_until.is_(None), t.c.held_until <= now)
    return sa.and_(t.c.created_at < before, held_by_none)


def forget_keys(engine: sa.Engine, before: datetime, now: datetime, batch: int) -> int:
    """Delete at most ``batch`` rows of keys first forwarded before ``before`` that no
    request holds at ``now``, oldest first; how many went. One statement, whose
    conditions are checked again on each row it deletes: a retry that took a row after
    the oldest were chosen keeps it (on Postgres the delete waits for the retry's commit
    and reads the row as it left it), so a key is never forgotten under its request."""
    t = federation_forwards
    chosen = t.alias("chosen")
    oldest = (
        sa.select(chosen.c.idempotency_key)
        .where(_forgettable(chosen, before, now))
        .order_by(chosen.c.created_at)
        .limit(batch)
    )
    with engine.begin() as conn:
        deleted = conn.execute(
            t.delete().where(t.c.idempotency_key.in_(oldest), _forgettable(t, before, now))
        ).rowcount
    return int(deleted)
