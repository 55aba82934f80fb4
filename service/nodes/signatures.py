"""Snapshots proven by their node: each signature checked against the node's registered key.

- A node with a registered key: every snapshot carries the Ed25519 signature
  of that key over the snapshot as sent (docs/agent.md, "Signing format"),
  else 403 ``bad_signature``: unsigned, not base64, wrong, or another
  node's. Its seq must be newer than the stored one (snapshot_report.py):
  the same signed snapshot sent again is a replay, so a captured report
  cannot keep a dead node alive.
- A node without a key: its snapshots are taken from a caller who could
  register its key anyway, an admin (service/admin_actions.py), and refused
  from anyone else (403 ``node_key_required``): the agent registers its key
  first, as it does on every start. Requiring a signature from a caller
  who may register any key it likes would prove nothing.

The public key is read before the snapshot is checked further, so a forged
report learns nothing about why its content would be refused; the write
then checks, in its own transaction, that the key is still that one.
"""

from __future__ import annotations

import sqlalchemy as sa

from agent.signing import verify
from service.admin_actions import Caller, is_admin
from service.errors import BadSignature, Conflict, NodeKeyRequired
from service.nodes import repository
from service.nodes.schemas import SnapshotReport


def verified_key(
    conn: sa.Connection, name: str, report: SnapshotReport, caller: Caller
) -> str | None:
    """The node's public key the report's signature verified against; None for a node
    without a key (from an admin). Raises the refusals above."""
    row = repository.get_key(conn, name)
    if row is None:
        if not is_admin(caller):
            raise NodeKeyRequired(
                f"node {name!r} has no registered public key: register it first"
                f" (PUT /v1/nodes/{name}/key: an admin, or the node's agent when the"
                " service trusts on first use, TOPOPLACE_TRUST_ON_FIRST_USE)",
                {"field": "signature"},
            )
        return None
    public_key = str(row["public_key"])
    if report.signature is None:
        raise BadSignature(
            f"node {name!r} has a registered key: its snapshots must be signed",
            {"field": "signature"},
        )
    snapshot = report.snapshot.model_dump(mode="json")
    if not verify(public_key, snapshot, report.signature):
        raise BadSignature(
            f"the signature is not node {name!r}'s over this snapshot (docs/agent.md,"
            " 'Signing format')",
            {"field": "signature"},
        )
    return public_key


def check_unchanged(conn: sa.Connection, name: str, public_key: str | None) -> int | None:
    """Inside the write: the key verified against is still the node's (not deleted or
    replaced meanwhile). Returns the newest seq taken under it (None: none yet, or no
    key): it outlives the node's row, so a deleted node is not brought back by a replay."""
    row = repository.get_key(conn, name)
    now = None if row is None else str(row["public_key"])
    if now != public_key:
        raise Conflict(
            f"the public key of node {name!r} changed while this snapshot was stored;"
            " send it again",
            {"field": "signature"},
        )
    return None if row is None or row["seq"] is None else int(row["seq"])
