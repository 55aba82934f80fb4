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
allocation it made, not a 409 for a "different request".
"""

from __future__ import annotations

import json

# Fields earlier versions stored and the request no longer has.
REMOVED_FIELDS = ("priority",)
# Fields the request gained, whose default (null) rows written before they existed
# lack: a retry with the same request now carries them as null.
ADDED_FIELDS = ("cpu_milli", "memory_mib")


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
    if isinstance(new, dict):
        for name in ADDED_FIELDS:
            if name not in old and new.get(name, 0) is None:
                del new[name]
    return old == new  # objects compare by their members, in any order; lists in order
