"""The request JSON stored with each allocation, compared when an Idempotency-Key
comes back.

A replay must be the same request as the one that made the allocation: the
same fields with the same values. Not the same text: a JSON object's keys
have no order, and ``node_labels`` comes in whatever order the client wrote
it or, over gRPC, in the order protobuf keeps its map, which differs from one
process to the next (a retry on another replica, or over REST, would read as
another request and be refused, and a client told so may place again under a
new key). The stored text is the request model's JSON, so a field removed
from the API is still in the rows written before: ``priority`` (never had an
effect, refused since) was stored as ``"priority":0`` in every row. A caller
retrying such a key with the same request, now without ``priority``, gets the
allocation it made, not a 409 for a "different request". The other way
round, a field the request gained is in the retried text and not in the rows
written before: a field at its default value means what leaving it out means,
so both sides are compared without the fields at their defaults, and a new
optional field needs no special case here.
"""

from __future__ import annotations

import json
from typing import Any

from service.allocations.schemas import PlaceRequest

# Fields earlier versions stored and the request no longer has.
REMOVED_FIELDS = ("priority",)
# Each field's default as the stored text writes it (the JSON of a request that names
# nothing): a field equal to it is dropped from both sides before they are compared.
DEFAULTS: dict[str, Any] = json.loads(PlaceRequest().model_dump_json())
# The host figures per task, copied out of the request into the allocation's columns.
HOST_FIELDS = ("cpu_milli", "memory_mib")


def same_request(stored: str, request_json: str) -> bool:
    """Whether the stored request and this one ask for the same thing."""
    if stored == request_json:
        return True  # the usual retry: no parsing
    try:
        old = json.loads(stored)
    except ValueError:
        return False
    if not isinstance(old, dict):
        return False
    for name in REMOVED_FIELDS:
        old.pop(name, None)
    new: object = json.loads(request_json)
    if not isinstance(new, dict):
        return False
    # Objects compare by their members, in any order; lists in order.
    return _without_defaults(old) == _without_defaults(new)


def _without_defaults(request: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in request.items() if k not in DEFAULTS or v != DEFAULTS[k]}


def host_figures(request_json: str) -> dict[str, int | None]:
    """The allocation's host figure columns from its request text: each figure the
    request names, None where it names none (or the text is no request)."""
    try:
        request = json.loads(request_json)
    except ValueError:
        request = None
    if not isinstance(request, dict):
        return dict.fromkeys(HOST_FIELDS)
    # bool is an int to Python, never a figure to the request model.
    return {
        name: value if isinstance(value, int) and not isinstance(value, bool) else None
        for name in HOST_FIELDS
        for value in (request.get(name),)
    }
