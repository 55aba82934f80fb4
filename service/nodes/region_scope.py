"""A region-scoped agent's report, checked against the stored node inside its write.

The token check (service/auth.py) runs before the report, with the node's region
as this replica's memory has it: another replica may have moved the node to
another region (an admin's report) that this one has not heard of yet, or have
stored a node this one does not know, and a move may commit between the check
and the write. So the report's transaction checks again, against the row it
writes: the stored region must be the agent's (or the node new), and the update
is conditional on it, so of a move and a report racing the report never wins
over a move that committed first. A heartbeat (service.py ``heartbeat``) is
conditional on the stored region the same way, and a first key registration
(``register_key``) reads the node's row, held until it commits, and is refused
for a node stored in another region.
"""

from __future__ import annotations

from service.access import Role
from service.admin_actions import Caller
from service.auth import Forbidden


def required_region(caller: Caller, name: str) -> str | None:
    """The region ``caller`` may report ``name`` in, and only in; None when its right
    does not come from a region (the process itself, an admin or scheduler, an agent
    whose scope names the node)."""
    principal = caller.principal
    if principal is None or principal.role is not Role.AGENT or name in principal.nodes:
        return None
    return principal.region


def check(caller: Caller, name: str, claimed: str, stored: str | None) -> None:
    """Forbidden unless ``caller`` may report ``name`` in region ``claimed`` while the
    database holds it in ``stored`` (None: not stored yet)."""
    principal = caller.principal
    if principal is None or principal.role is not Role.AGENT or name in principal.nodes:
        return
    region = principal.region
    if region is not None and claimed == region and stored in (None, region):
        return
    where = "" if stored is None else f"; the node is in region {stored!r}"
    # Out of scope by the region its snapshot claims, or by where the node is stored.
    by_claim = region is not None and claimed != region and stored in (None, region)
    raise Forbidden(
        f"this agent token may not act for node {name!r} (its scope:"
        f" {principal.scope_text()}){where}",
        {"node": name, "field": caller.fields.region if by_claim else caller.fields.node},
    )
