"""GET /v1/audit: the audit log, newest first, filtered and paged by a cursor (admins only)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, Depends, Query

from service.audit import store
from service.audit.schemas import AuditKind, AuditPage
from service.deps import get_state
from service.errors import InvalidRequest
from service.state import ServiceState

router = APIRouter(prefix="/v1/audit", tags=["audit"])
State = Annotated[ServiceState, Depends(get_state)]
MAX_LIMIT = 1000
# The largest row id either database stores (a signed 64-bit integer): a cursor past it
# was never given out, and the drivers refuse to send it (SQLite: OverflowError; Postgres:
# out of range for bigint), which was a 500.
MAX_CURSOR = 2**63 - 1
Short = Annotated[str | None, Query(min_length=1, max_length=256)]


def _utc(value: datetime | None) -> datetime | None:
    """A time without a zone is UTC, as the service writes every time."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def _aware(value: datetime) -> datetime:
    """SQLite hands back naive datetimes for timezone-aware columns; they are UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _cursor(text: str | None) -> int | None:
    if text is None:
        return None
    # ASCII digits only: str.isdigit() also takes '²' (int() then raised: a 500) and other
    # scripts' digits, which no cursor given out is written in.
    if not re.fullmatch(r"[0-9]{1,19}", text) or not 1 <= int(text) <= MAX_CURSOR:
        raise InvalidRequest("cursor", "not a cursor this service gave out (next_cursor)")
    return int(text)


def _nodes(text: str) -> list[str]:
    return [n for n in text.strip(",").split(",") if n]


def entry(row: sa.RowMapping) -> dict[str, Any]:
    return {
        "id": int(row["id"]),
        "at": _aware(row["at"]),
        "kind": row["kind"],
        "action": row["action"],
        "actor": {
            "token_id": row["actor_id"],
            "name": row["actor_name"],
            "role": row["actor_role"],
        },
        "route": row["route"],
        "nodes": _nodes(row["nodes"]),
        "job_id": row["job_id"],
        "allocation_id": row["allocation_id"],
        "detail": json.loads(row["detail"]),
    }


@router.get("", response_model=AuditPage)
def audit_log(
    state: State,
    kind: Annotated[AuditKind | None, Query()] = None,
    action: Annotated[str | None, Query(min_length=1, max_length=32)] = None,
    actor: Annotated[
        str | None, Query(min_length=1, max_length=64, description="a token id")
    ] = None,
    node: Short = None,
    job_id: Short = None,
    allocation_id: Annotated[str | None, Query(min_length=1, max_length=36)] = None,
    since: Annotated[datetime | None, Query(description="at or after (UTC without a zone)")] = None,
    until: Annotated[datetime | None, Query(description="before (UTC without a zone)")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
    cursor: Annotated[str | None, Query(max_length=32, description="a next_cursor")] = None,
) -> dict[str, Any]:
    """What happened, newest first: placements and every change to an allocation, admin
    actions, refused snapshots, each with who asked (the token) and through which route."""
    since, until = _utc(since), _utc(until)
    if since is not None and until is not None and until <= since:
        raise InvalidRequest("until", "must be after since")
    filters = store.Filters(
        kind=kind,
        action=action,
        actor_id=actor,
        node=node,
        job_id=job_id,
        allocation_id=allocation_id,
        since=since,
        until=until,
    )
    found = store.page(state.engine, filters, limit, _cursor(cursor))
    cursor_out = None if found.next_cursor is None else str(found.next_cursor)
    return {"entries": [entry(r) for r in found.rows], "next_cursor": cursor_out}
