"""The request an Idempotency-Key was forwarded for, as ``federation_forwards`` keeps
it, and whether a retry of the key is that request.

The region sees only the forward (no federation options, the GPU model the key
was priced on), so only the global service can tell a retry from another job
under the same key (docs/federation.md, "Idempotency"). Kept as text, compared
as the fields it asks for: a row written before the request gained a field
(``cpu_milli`` and ``memory_mib`` came the revision after rows were first
kept) has no such field, and its retry now sends it at its default. Compared
as text, that retry was told to use a new key, and a new key is placed afresh
while the first allocation is still held in the key's region. A field at its
default means what leaving it out means, in the federation block too, as the
regions' own replays compare (service/allocations/stored_request.py).
"""

from __future__ import annotations

import json
from typing import Any

from service.federation.schemas import FederatedPlaceRequest

# ``deadline_s`` is the caller's patience, which a retry may raise: never part of it.
_LEFT_OUT: Any = {"federation": {"deadline_s"}}
_DEFAULTS: dict[str, Any] = FederatedPlaceRequest().model_dump(mode="json", exclude=_LEFT_OUT)
_NONE = object()  # no default: a field the request no longer has is kept, and compared


def request_text(body: FederatedPlaceRequest) -> str:
    """The request a key is kept for. Keys sorted: labels in another order are the same
    request (a JSON object, or a map in a client's memory, keeps no order)."""
    fields = body.model_dump(mode="json", exclude=_LEFT_OUT)
    return json.dumps(fields, sort_keys=True, separators=(",", ":"))


def same_request(kept: str, sent: str) -> bool:
    """Whether the kept request and this one (both :func:`request_text`) ask the same."""
    if kept == sent:
        return True  # the usual retry: no parsing
    try:
        old, new = json.loads(kept), json.loads(sent)
    except ValueError:
        return False
    if not isinstance(old, dict) or not isinstance(new, dict):
        return False
    return _asked(old, _DEFAULTS) == _asked(new, _DEFAULTS)


def _asked(fields: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``fields`` without those at their defaults; objects member by member, lists in
    order."""
    kept: dict[str, Any] = {}
    for name, value in fields.items():
        default = defaults.get(name, _NONE)
        if isinstance(value, dict) and isinstance(default, dict):
            value = _asked(value, default)
            if not value:
                continue
        elif value == default:
            continue
        kept[name] = value
    return kept
