"""One error shape for the whole API, mapped to HTTP in one place.

    ServiceError                 {"error": {"code", "message", "detail"}}
    ├── BadRequest        400    the request cannot be understood
    ├── Forbidden         403    the caller may not do this (e.g. register a node's key)
    │   ├── BadSignature  403    a snapshot not signed by its node's registered key
    │   └── NodeKeyRequired 403  a snapshot of a node without a key, from a non-admin
    ├── NotFound          404    no such node / allocation / route
    ├── MethodNotAllowed  405    the route exists, not with this method (Allow)
    ├── Conflict          409    the state says no (e.g. idempotency key reused)
    │   ├── KeyInFlight   409    a retry racing its key's first try, still committing (Retry-After)
    │   ├── ReplayedSnapshot 409 a signed snapshot not newer than the stored one
    │   ├── ReplayedSummary 409  a region's summary not newer than the stored one
    │   ├── RegionBusy    409    retiring a region with live allocations, unforced
    │   └── RegionRetired 409    a summary for, a job to, or a key kept for a retired region
    ├── Unschedulable     409    nothing fits now; retry later (Retry-After)
    │   └── NoRegion      409    no region fits, or every one that did refused
    ├── RequestTimeout    408    headers or body arrived too slowly (connection closed)
    ├── RateLimited       429    over the request rate of this token or address (Retry-After)
    ├── InvalidRequest    422    a field, parameter or header is malformed
    ├── Unresolvable      422    nothing could ever fit; change the request
    ├── Unsupported       422    valid, but this service does not do it (GPU shares)
    ├── SeqAhead          422    a region's summary seq too far ahead of the global clock
    ├── TooLarge          413    the body is over the limit
    ├── UriTooLong        414    the path and query are over the limit
    ├── (itself)          500    a fault of the service (logged with its traceback)
    ├── Unavailable       503    the database cannot be reached (Retry-After)
    ├── DatabaseFull      507    the database has no space to write (disk full)
    └── RegionUnavailable 503    a keyed job's region did not answer: retry the same key

Validation errors from pydantic become 422 ``invalid_request`` naming the
field. Codes are stable: clients switch on ``code``, people read ``message``.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ServiceError(Exception):
    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"
    retry_after: ClassVar[int | None] = None

    def __init__(self, message: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "detail": self.detail}}


class BadRequest(ServiceError):
    status = 400
    code = "bad_request"


class Forbidden(ServiceError):
    status = 403
    code = "forbidden"


class BadSignature(Forbidden):
    code = "bad_signature"


class NodeKeyRequired(Forbidden):
    code = "node_key_required"


class NotFound(ServiceError):
    status = 404
    code = "not_found"


class MethodNotAllowed(ServiceError):
    status = 405
    code = "method_not_allowed"


class Conflict(ServiceError):
    status = 409
    code = "conflict"


class KeyInFlight(Conflict):
    """A retry that found nothing free while its key's first try was still committing."""

    code = "idempotency_key_in_flight"
    retry_after = 1


class ReplayedSnapshot(Conflict):
    code = "replayed_snapshot"


class ReplayedSummary(Conflict):
    code = "replayed_summary"


class RegionBusy(Conflict):
    code = "region_busy"


class RegionRetired(Conflict):
    code = "region_retired"


class RequestTimeout(ServiceError):
    status = 408
    code = "request_timeout"


class RateLimited(ServiceError):
    """Over the rate; ``retry_after`` is per instance: the seconds until a token is back."""

    status = 429
    code = "rate_limited"

    def __init__(
        self, message: str, retry_after: int, detail: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message, detail)
        self.retry_after = retry_after  # type: ignore[misc]


class Unschedulable(ServiceError):
    status = 409
    code = "unschedulable"
    retry_after = 5


class NoRegion(Unschedulable):
    code = "no_region"


class InvalidRequest(ServiceError):
    """What pydantic's 422 says, for the checks made before the body is parsed."""

    status = 422
    code = "invalid_request"

    def __init__(self, field: str, message: str) -> None:
        detail = {"field": field, "errors": [{"field": field, "message": message}]}
        super().__init__(f"{field}: {message}", detail)


class Unresolvable(ServiceError):
    status = 422
    code = "unresolvable"


class Unsupported(ServiceError):
    status = 422
    code = "unsupported"


def share_unsupported() -> Unsupported:
    """A GPU share asked where nodes are ranked (REST /score, gRPC Score): a share is one
    GPU that only place chooses (docs/service.md, "GPU shares")."""
    message = (
        "a GPU share (gpu_fraction) is placed by POST /v1/place, which chooses its GPU;"
        " /v1/score ranks nodes for whole GPUs and MIG instances only"
    )
    return Unsupported(message, {"field": "gpu_fraction"})


class TooManyWatches(ServiceError):
    """A Watch past the bound on open watches (a caller's own, or all callers')."""

    status = 429
    code = "too_many_watches"


class TooManyStreams(ServiceError):
    """A health Watch or reflection stream past the bound on open ones (a peer's, or all)."""

    status = 429
    code = "too_many_streams"


class SeqAhead(ServiceError):
    status = 422
    code = "seq_ahead"


class TooLarge(ServiceError):
    status = 413
    code = "payload_too_large"


class AnswerTooLarge(ServiceError):
    """A reservation, or a confirm or extend of one, whose answer the client said it
    cannot receive (gRPC's receive limit): refused before it is committed, so nothing
    is held or changed that the client cannot learn of."""

    status = 400
    code = "answer_too_large"


class UriTooLong(ServiceError):
    status = 414
    code = "uri_too_long"


class Unavailable(ServiceError):
    status = 503
    code = "database_unavailable"
    retry_after = 5


class DatabaseFull(ServiceError):
    """The database answered, with no room for the write: retrying as it is will not
    help until its disk (or SQLite's max_page_count) has room again."""

    status = 507
    code = "database_full"


class RegionUnavailable(ServiceError):
    status = 503
    code = "region_unavailable"
    retry_after = 5
