"""One error shape for the whole API, mapped to HTTP in one place.

    ServiceError                 {"error": {"code", "message", "detail"}}
    ├── BadRequest        400    the request cannot be understood
    ├── NotFound          404    no such node / allocation
    ├── Conflict          409    the state says no (e.g. idempotency key reused)
    ├── Unschedulable     409    nothing fits now; retry later (Retry-After)
    ├── Unresolvable      422    nothing could ever fit; change the request
    ├── Unsupported       422    valid, but this service does not do it (GPU shares)
    ├── TooLarge          413    the body is over the limit
    └── Unavailable       503    the database cannot be reached (Retry-After)

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


class NotFound(ServiceError):
    status = 404
    code = "not_found"


class Conflict(ServiceError):
    status = 409
    code = "conflict"


class Unschedulable(ServiceError):
    status = 409
    code = "unschedulable"
    retry_after = 5


class Unresolvable(ServiceError):
    status = 422
    code = "unresolvable"


class Unsupported(ServiceError):
    status = 422
    code = "unsupported"


class TooLarge(ServiceError):
    status = 413
    code = "payload_too_large"


class Unavailable(ServiceError):
    status = 503
    code = "database_unavailable"
    retry_after = 5
