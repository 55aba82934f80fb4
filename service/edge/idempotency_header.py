"""The Idempotency-Key header of a route served before FastAPI's router
(service/direct_routes.py), read and refused as FastAPI reads the Header each such
route declares for its OpenAPI document (``KEY_LENGTH``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi.exceptions import RequestValidationError
from pydantic import StringConstraints, TypeAdapter, ValidationError
from starlette.requests import Request

KEY_LENGTH: dict[str, Any] = {"min_length": 1, "max_length": 256}
_KEY = TypeAdapter(Annotated[str, StringConstraints(**KEY_LENGTH)])


def idempotency_key(request: Request) -> str | None:
    """The request's key, None when it has none; a key out of bounds is refused (422,
    ``header.idempotency-key``). One given twice is refused before (edge/guard.py)."""
    key = request.headers.get("idempotency-key")
    if key is None:
        return None
    try:
        return _KEY.validate_python(key)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        raise RequestValidationError(
            [{**e, "loc": ("header", "idempotency-key")} for e in errors]
        ) from None
