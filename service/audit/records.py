"""Audit rows, built: one dictionary per ``audit_log`` row (service/schema.py).

Built where the change is made and written in its transaction (store.py);
the actor is the current one (actor.py) unless one is given.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Literal

from service.audit.actor import Actor, current

Kind = Literal["allocation", "admin", "snapshot"]


def nodes_text(nodes: Iterable[str]) -> str:
    """ ",a,b,": every node of the row, found by one LIKE '%,a,%' (empty for none)."""
    names = sorted(set(nodes))
    return f",{','.join(names)}," if names else ""


def record(
    kind: Kind,
    action: str,
    at: datetime,
    *,
    actor: Actor | None = None,
    nodes: Iterable[str] = (),
    job_id: str | None = None,
    allocation_id: str | None = None,
    detail: Mapping[str, Any] | str = "{}",
) -> dict[str, Any]:
    """One row. ``detail`` is JSON text already (the placed row joins stored JSON) or a
    mapping to encode."""
    who = actor or current()
    text = detail if isinstance(detail, str) else json.dumps(detail, default=str)
    return {
        "at": at,
        "kind": kind,
        "action": action,
        "actor_id": who.token_id,
        "actor_name": who.name[:256],
        "actor_role": who.role,
        "route": who.route[:128],
        "nodes": nodes_text(nodes),
        "job_id": job_id,
        "allocation_id": allocation_id,
        "detail": text,
    }


def placed(
    at: datetime,
    allocation_id: str,
    job_id: str | None,
    nodes: Iterable[str],
    state: str,
    request_json: str,
    placement_json: str,
) -> dict[str, Any]:
    """A placement decision: the allocation's state as made, the request as stored and
    the chosen nodes, GPUs and score parts (the allocation's ``placement`` column),
    joined without decoding them: this is on /place's path."""
    detail = f'{{"state": "{state}", "request": {request_json}, "placement": {placement_json}}}'
    return record(
        "allocation",
        "placed",
        at,
        nodes=nodes,
        job_id=job_id,
        allocation_id=allocation_id,
        detail=detail,
    )


def _gpus(placement_json: str) -> dict[str, list[int]]:
    """Node -> the GPU indices an allocation's stored placement holds there."""
    gpus: dict[str, set[int]] = {}
    for task in json.loads(placement_json).get("tasks", ()):
        gpus.setdefault(str(task["node"]), set()).update(task.get("gpu_indices", ()))
    return {node: sorted(indices) for node, indices in gpus.items()}


def allocation_change(action: str, at: datetime, row: Mapping[Any, Any]) -> dict[str, Any]:
    """A change to an allocation, from its row as the change left it."""
    gpus = _gpus(str(row["placement"]))
    expires = row["expires_at"]
    detail = {
        "state": row["state"],
        "owner": row["owner"],
        "gpus": gpus,
        "expires_at": None if expires is None else expires.isoformat(),
    }
    return record(
        "allocation",
        action,
        at,
        nodes=gpus,
        job_id=row["job_id"],
        allocation_id=str(row["id"]),
        detail=detail,
    )
