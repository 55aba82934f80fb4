"""The audit log as GET /v1/audit answers it."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

AuditKind = Literal["allocation", "admin", "snapshot", "summary"]


class AuditActor(BaseModel):
    token_id: str | None = Field(description="the token's id; null: the service itself")
    name: str = Field(description="the token's name")
    role: str | None = Field(description="the token's role; null: the service itself")


class AuditEntry(BaseModel):
    id: int
    at: datetime
    kind: AuditKind
    action: str = Field(
        description="allocation: placed, refused, confirmed, extended, released, expired, attached,"
        " moved; admin: token_created, token_revoked, key_registered, key_replaced,"
        " key_deleted, node_cordoned, node_uncordoned, node_deleted, region_registered,"
        " region_updated, region_retired; summary and snapshot: the"
        " refusal's error code (bad_signature, replayed_snapshot, node_key_required,"
        " conflict, ...)"
    )
    actor: AuditActor
    route: str = Field(description='how it was asked: "POST /v1/place", "gRPC Place", "sweep"')
    nodes: list[str]
    job_id: str | None
    allocation_id: str | None
    detail: dict[str, Any]


class AuditPage(BaseModel):
    entries: list[AuditEntry] = Field(description="newest first")
    next_cursor: str | None = Field(
        description="pass as `cursor` for the next (older) page; null on the last"
    )
