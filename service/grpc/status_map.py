"""The one place where the service's outcomes become gRPC status codes.

Every error carries, in the standard ``grpc-status-details-bin`` trailer, a
``google.rpc.Status`` whose details hold an ``ErrorInfo`` (``reason`` is the
REST error code, ``domain`` is ``topoplace``, ``metadata`` the scalar parts
of the REST ``detail``), and where they apply:

    code (REST)              gRPC status            more details
    invalid_request, bad_request  INVALID_ARGUMENT  BadRequest naming the field(s)
    unauthorized             UNAUTHENTICATED
    forbidden                PERMISSION_DENIED      (role, scope, or an admin action)
    bad_signature            PERMISSION_DENIED
    node_key_required        PERMISSION_DENIED
    replayed_snapshot        FAILED_PRECONDITION
    rate_limited             RESOURCE_EXHAUSTED     RetryInfo (the seconds until allowed)
    not_found                NOT_FOUND
    conflict                 FAILED_PRECONDITION    (retrying will not help)
    idempotency_key_in_flight ABORTED               RetryInfo 1 s (retry: the first try's answer)
    unschedulable            RESOURCE_EXHAUSTED     RetryInfo 5 s, PlacementRefusal
    unresolvable             FAILED_PRECONDITION    PlacementRefusal (change the request)
    payload_too_large        RESOURCE_EXHAUSTED
    answer_too_large         INVALID_ARGUMENT       (a Place answer past the client's receive limit)
    request_timeout          DEADLINE_EXCEEDED      (the message did not arrive in time)
    database_unavailable     UNAVAILABLE            RetryInfo 5 s
    database_full            RESOURCE_EXHAUSTED     (no space to write: free the disk)
    idempotent_replay        ALREADY_EXISTS         the Allocation made before
    watch_overflow           RESOURCE_EXHAUSTED     (list again, watch again)
    too_many_watches         RESOURCE_EXHAUSTED     (end a watch, or retry later)
    too_many_streams         RESOURCE_EXHAUSTED     (end a health Watch or reflection stream)
    unsupported              INVALID_ARGUMENT       BadRequest (a share asked of Score)
    anything else            INTERNAL

Clients switch on ``ErrorInfo.reason`` exactly as REST clients switch on
``error.code``; the status code is what generic gRPC tooling (retry
policies, dashboards) understands.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from pydantic import ValidationError

from placement.cluster import SharesUnsupported
from service.database_unreachable import NOT_ANSWERING, unavailable
from service.errors import ServiceError, share_unsupported
from service.grpc.gen import topoplace_pb2 as pb

log = logging.getLogger("topoplace.grpc")

DOMAIN = "topoplace"
DETAILS_KEY = "grpc-status-details-bin"
# A refusal travels in the trailers, which gRPC clients bound: grpc-core refuses a value
# past 16 KiB, grpc-java takes 8 KiB of metadata in all; the client then reads
# RESOURCE_EXHAUSTED "Stream removed" with no details at all (retry later, where the
# refusal may have said "change the request" or "here is your allocation"). The message
# is sent twice (grpc-message, percent-encoded: 3 bytes for each byte past printable
# ASCII; and in the Status) and the Status in base64, so the message is cut to
# MAX_MESSAGE_BYTES of UTF-8 and the Status gets what is left of TRAILER_BYTES; a detail
# that does not fit is left out (ErrorInfo, the first, always stays).
TRAILER_BYTES = 7168  # under 8 KiB with the other headers and HPACK's 32 bytes per entry
MAX_MESSAGE_BYTES = 768
# An entry of a detail: a PlacementRefusal's reason (one sentence per cause, naming a few
# of the request's labels, models or regions), a field violation's description.
MAX_ENTRY_BYTES = 256

CODES: dict[str, grpc.StatusCode] = {
    "invalid_request": grpc.StatusCode.INVALID_ARGUMENT,
    "bad_request": grpc.StatusCode.INVALID_ARGUMENT,
    "unauthorized": grpc.StatusCode.UNAUTHENTICATED,
    "forbidden": grpc.StatusCode.PERMISSION_DENIED,
    "bad_signature": grpc.StatusCode.PERMISSION_DENIED,
    "node_key_required": grpc.StatusCode.PERMISSION_DENIED,
    "replayed_snapshot": grpc.StatusCode.FAILED_PRECONDITION,
    "rate_limited": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "conflict": grpc.StatusCode.FAILED_PRECONDITION,
    "idempotency_key_in_flight": grpc.StatusCode.ABORTED,
    "unschedulable": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "unresolvable": grpc.StatusCode.FAILED_PRECONDITION,
    "payload_too_large": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "request_timeout": grpc.StatusCode.DEADLINE_EXCEEDED,
    "database_unavailable": grpc.StatusCode.UNAVAILABLE,
    "database_full": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "idempotent_replay": grpc.StatusCode.ALREADY_EXISTS,
    "watch_overflow": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "too_many_watches": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "too_many_streams": grpc.StatusCode.RESOURCE_EXHAUSTED,
    # a valid request this service does not serve: asking again as it is never helps
    "unsupported": grpc.StatusCode.INVALID_ARGUMENT,
    "answer_too_large": grpc.StatusCode.INVALID_ARGUMENT,
}


@dataclass(frozen=True)
class ErrorReply:
    """A refusal as gRPC sends it: status code, message, and typed details."""

    reason: str
    message: str
    details: list[Message] = field(default_factory=list)

    @property
    def code(self) -> grpc.StatusCode:
        return CODES.get(self.reason, grpc.StatusCode.INTERNAL)

    @property
    def wire_message(self) -> str:
        """The message as sent: bounded, so the trailers reach the client (see above)."""
        return shortened(self.message, MAX_MESSAGE_BYTES)

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        return ((DETAILS_KEY, self.status().SerializeToString()),)

    def status(self) -> status_pb2.Status:
        """The Status sent, with the details that fit beside the message."""
        message = self.wire_message
        room = status_room(message)
        status = status_pb2.Status(code=self.code.value[0], message=message)
        for detail in self.details:
            # ErrorInfo, the first, always; the others where they fit.
            packed = _fitted(detail, room - status.ByteSize() if status.details else None)
            if packed is not None:
                status.details.append(packed)
        return status


# The details whose entries may be cut to make them fit: the first ones are kept.
_ENTRIES = {"BadRequest": "field_violations", "PlacementRefusal": "reasons"}


def _fitted(detail: Message, room: int | None) -> any_pb2.Any | None:
    """``detail`` packed, within ``room`` bytes of the Status (None: whatever its size); a
    list of field violations or refusal reasons cut to its first entries that fit; None
    when nothing fits."""
    packed = any_pb2.Any()
    packed.Pack(detail)
    # A repeated field's entry costs its size and a few bytes of tag and length.
    if room is None or packed.ByteSize() + 8 <= room:
        return packed
    entries = _ENTRIES.get(detail.DESCRIPTOR.name)
    if entries is None:
        return None
    cut = type(detail)()
    cut.CopyFrom(detail)
    items = getattr(cut, entries)
    while len(items) > 1:
        del items[(len(items) + 1) // 2 :]
        packed.Pack(cut)
        if packed.ByteSize() + 8 <= room:
            return packed
    return None


def status_room(message: str) -> int:
    """Bytes the serialized Status may take beside ``message`` sent as grpc-message."""
    encoded = sum(1 if 0x20 <= b <= 0x7E and b != 0x25 else 3 for b in message.encode())
    return (TRAILER_BYTES - encoded) * 3 // 4  # base64: 4 characters for 3 bytes


def shortened(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` bytes of UTF-8 (never inside a character), marked."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - 4].decode(errors="ignore") + " ..."


def _info(reason: str, detail: dict[str, Any]) -> error_details_pb2.ErrorInfo:
    scalars = {k: str(v) for k, v in detail.items() if isinstance(v, str | int | float | bool)}
    return error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=scalars)


def _refusal(reasons: list[dict[str, Any]]) -> pb.PlacementRefusal:
    return pb.PlacementRefusal(
        reasons=[
            pb.RefusalReason(
                cause=str(r["cause"]),
                nodes=int(r["nodes"]),
                message=shortened(str(r["message"]), MAX_ENTRY_BYTES),
                resolvable=bool(r["resolvable"]),
            )
            for r in reasons
        ]
    )


def from_service_error(error: ServiceError) -> ErrorReply:
    details: list[Message] = [_info(error.code, error.detail)]
    if error.retry_after:
        delay = duration_pb2.Duration(seconds=error.retry_after)
        details.append(error_details_pb2.RetryInfo(retry_delay=delay))
    if "field" in error.detail:
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=str(error.detail["field"]),
            description=shortened(error.message, MAX_ENTRY_BYTES),
        )
        details.append(error_details_pb2.BadRequest(field_violations=[violation]))
    if error.code in ("unschedulable", "unresolvable"):
        details.append(_refusal(error.detail.get("reasons", [])))
    return ErrorReply(error.code, error.message, details)


def from_validation(exc: ValidationError, prefix: str = "") -> ErrorReply:
    """pydantic's errors as INVALID_ARGUMENT, fields named as in the request message."""

    def name(loc: tuple[int | str, ...]) -> str:
        return ".".join([prefix] * bool(prefix) + [str(p) for p in loc])

    errors = exc.errors()
    violations = [
        error_details_pb2.BadRequest.FieldViolation(
            field=name(e["loc"]), description=shortened(e["msg"], MAX_ENTRY_BYTES)
        )
        for e in errors
    ]
    first = violations[0] if violations else None
    field_name = first.field if first else prefix
    if first is None:
        message = "invalid request"
    else:  # as REST words it: a rule across fields (no field) is its description alone
        said = str(errors[0]["msg"])
        message = f"{field_name}: {said}" if field_name else said
    details: list[Message] = [
        _info("invalid_request", {"field": field_name}),
        error_details_pb2.BadRequest(field_violations=violations),
    ]
    return ErrorReply("invalid_request", message, details)


def invalid_field(field_name: str, message: str) -> ErrorReply:
    violation = error_details_pb2.BadRequest.FieldViolation(
        field=field_name, description=shortened(message, MAX_ENTRY_BYTES)
    )
    details: list[Message] = [
        _info("invalid_request", {"field": field_name}),
        error_details_pb2.BadRequest(field_violations=[violation]),
    ]
    return ErrorReply("invalid_request", f"{field_name}: {message}", details)


def replay(allocation: pb.Allocation) -> ErrorReply:
    """An idempotency-key replay: ALREADY_EXISTS, with the allocation made before where it
    fits the trailers; a larger one (a gang of some tens of tasks) is named by its id, and
    GetAllocation returns it."""
    info = _info("idempotent_replay", {"allocation_id": allocation.id})
    said = f"this idempotency-key already placed allocation {allocation.id};"
    reply = ErrorReply(
        "idempotent_replay", f"{said} it is in the status details", [info, allocation]
    )
    if len(reply.status().details) == 2:
        return reply
    return ErrorReply(
        "idempotent_replay",
        f"{said} it is too large for the status details: GetAllocation returns it",
        [info],
    )


def watch_overflow(buffer: int) -> ErrorReply:
    message = (
        f"this watcher fell more than {buffer} events behind and was dropped;"
        " list again, then watch again"
    )
    return ErrorReply("watch_overflow", message, [_info("watch_overflow", {"buffer": buffer})])


def from_exception(exc: BaseException) -> ErrorReply:
    if isinstance(exc, ServiceError):
        return from_service_error(exc)
    if isinstance(exc, ValidationError):
        return from_validation(exc)
    if isinstance(exc, NOT_ANSWERING):
        return from_service_error(unavailable(exc))
    if isinstance(exc, SharesUnsupported):
        return from_service_error(share_unsupported())
    log.error("unexpected error in a gRPC call", exc_info=exc)
    return ErrorReply("internal_error", f"internal error: {type(exc).__name__}")


async def abort(context: grpc.aio.ServicerContext[Any, Any], reply: ErrorReply) -> None:
    """End the call with this refusal (raises, as grpc.aio's abort does)."""
    await context.abort(reply.code, reply.wire_message, trailing_metadata=reply.trailing_metadata())
