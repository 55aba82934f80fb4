"""API tokens in the database: make, list, revoke, and look up one by id.

Plain functions on an engine, so that `topoplace token create --database-url`
can make the first admin token before any service runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import sqlalchemy as sa

from service.access import Role
from service.audit import records
from service.audit import store as audit
from service.schema import api_tokens
from service.tokens import secrets


@dataclass(frozen=True)
class Scope:
    """Where an agent token may report: these nodes, and/or every node of one region."""

    nodes: frozenset[str] = field(default_factory=frozenset)
    region: str | None = None

    @property
    def empty(self) -> bool:
        return not self.nodes and self.region is None

    def to_json(self) -> str:
        body: dict[str, object] = {}
        if self.nodes:
            body["nodes"] = sorted(self.nodes)
        if self.region is not None:
            body["region"] = self.region
        return json.dumps(body)

    @classmethod
    def from_json(cls, text: str) -> Scope:
        body = json.loads(text or "{}")
        return cls(frozenset(body.get("nodes", ())), body.get("region"))


@dataclass(frozen=True)
class TokenRecord:
    id: str
    role: Role
    scope: Scope
    name: str
    created_at: datetime
    revoked_at: datetime | None

    def view(self) -> dict[str, object]:
        """The token as listed: never its secret, nor its hash."""
        return {
            "id": self.id,
            "role": self.role.value,
            "nodes": sorted(self.scope.nodes),
            "region": self.scope.region,
            "name": self.name,
            "created_at": self.created_at.isoformat(),
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
        }


class ScopeError(ValueError):
    """The scope does not fit the role; ``field`` is the part of the request that does not
    (``nodes`` or ``region``)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def check_scope(role: Role, scope: Scope) -> None:
    if role is Role.AGENT and scope.empty:
        raise ScopeError("an agent token needs a scope: at least one node or a region", "nodes")
    if role is Role.REGION and (scope.region is None or scope.nodes):
        raise ScopeError(
            "a region token names one region (its own) and no nodes",
            "nodes" if scope.nodes else "region",
        )
    if role not in (Role.AGENT, Role.REGION) and not scope.empty:
        raise ScopeError(
            f"a {role.value} token has no scope; only agent and region tokens have one",
            "nodes" if scope.nodes else "region",
        )


def _utc(value: datetime | None) -> datetime | None:
    # SQLite returns naive datetimes for timezone-aware columns.
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def _record(row: sa.Row[tuple[object, ...]]) -> TokenRecord:
    m = row._mapping
    created = _utc(m["created_at"])
    assert created is not None
    return TokenRecord(
        id=m["id"],
        role=Role(m["role"]),
        scope=Scope.from_json(m["scope"]),
        name=m["name"],
        created_at=created,
        revoked_at=_utc(m["revoked_at"]),
    )


def create(
    engine: sa.Engine,
    role: Role,
    scope: Scope = Scope(),
    name: str = "",
    now: datetime | None = None,
) -> tuple[TokenRecord, str]:
    """Make a token; returns it and its secret (``tpp_<id>_<secret>``), shown only now."""
    with engine.begin() as conn:
        return create_in(conn, role, scope, name, now)


def create_in(
    conn: sa.Connection,
    role: Role,
    scope: Scope = Scope(),
    name: str = "",
    now: datetime | None = None,
) -> tuple[TokenRecord, str]:
    """:func:`create` inside the caller's transaction (a region and its token together)."""
    check_scope(role, scope)
    token_id, secret = secrets.new_id(), secrets.new_secret()
    created = now or datetime.now(UTC)
    conn.execute(
        api_tokens.insert().values(
            id=token_id,
            role=role.value,
            scope=scope.to_json(),
            name=name,
            secret_hash=secrets.hash_secret(secret),
            created_at=created,
        )
    )
    detail = {
        "token_id": token_id,
        "role": role.value,
        "name": name,
        "nodes": sorted(scope.nodes),
        "region": scope.region,
    }
    audit.write(
        conn,
        [records.record("admin", "token_created", created, nodes=scope.nodes, detail=detail)],
    )
    record = TokenRecord(token_id, role, scope, name, created, None)
    return record, secrets.compose(token_id, secret)


def listed(engine: sa.Engine, include_revoked: bool = False) -> list[TokenRecord]:
    query = sa.select(api_tokens).order_by(api_tokens.c.created_at, api_tokens.c.id)
    if not include_revoked:
        query = query.where(api_tokens.c.revoked_at.is_(None))
    with engine.connect() as conn:
        return [_record(row) for row in conn.execute(query)]


def revoke(engine: sa.Engine, token_id: str, now: datetime | None = None) -> TokenRecord | None:
    """Mark a token revoked (idempotent); None when there is no such token."""
    with engine.begin() as conn:
        return revoke_in(conn, token_id, now)


def revoke_in(
    conn: sa.Connection, token_id: str, now: datetime | None = None
) -> TokenRecord | None:
    """:func:`revoke` inside the caller's transaction."""
    at = now or datetime.now(UTC)
    revoked = conn.execute(
        api_tokens.update()
        .where(api_tokens.c.id == token_id, api_tokens.c.revoked_at.is_(None))
        .values(revoked_at=at)
    ).rowcount
    row = conn.execute(sa.select(api_tokens).where(api_tokens.c.id == token_id)).first()
    if revoked and row is not None:  # a token revoked before is not revoked again
        detail = {
            "token_id": token_id,
            "role": row._mapping["role"],
            "name": row._mapping["name"],
        }
        audit.write(conn, [records.record("admin", "token_revoked", at, detail=detail)])
    return None if row is None else _record(row)


def live_token(engine: sa.Engine, token_id: str) -> tuple[TokenRecord, str] | None:
    """The live token with this id and its stored hash (one indexed read); None when there
    is none. The caller checks the secret against the hash (service/auth.py, under a bound
    on verifications at once)."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(api_tokens).where(
                api_tokens.c.id == token_id, api_tokens.c.revoked_at.is_(None)
            )
        ).first()
    if row is None:
        return None
    return _record(row), row._mapping["secret_hash"]


def live_ids(engine: sa.Engine, ids: Iterable[str]) -> set[str]:
    """Which of ``ids`` are still live (not revoked, not deleted)."""
    wanted: Sequence[str] = sorted(set(ids))
    found: set[str] = set()
    for start in range(0, len(wanted), 500):
        chunk = wanted[start : start + 500]
        query = sa.select(api_tokens.c.id).where(
            api_tokens.c.id.in_(chunk), api_tokens.c.revoked_at.is_(None)
        )
        with engine.connect() as conn:
            found.update(conn.execute(query).scalars())
    return found


def any_live(engine: sa.Engine) -> bool:
    query = sa.select(api_tokens.c.id).where(api_tokens.c.revoked_at.is_(None)).limit(1)
    with engine.connect() as conn:
        return conn.execute(query).first() is not None
