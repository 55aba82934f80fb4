"""Who is calling, and may they: one check for every transport.

A caller presents ``Authorization: Bearer TOKEN``. A token is one of:

- a database token (``tpp_<id>_<secret>``, service/tokens/): a role and, for
  agents, a scope; made with ``topoplace token create`` or POST /v1/tokens;
- a static admin token from ``TOPOPLACE_API_TOKENS`` (comma-separated),
  ``TOPOPLACE_API_TOKEN_FILE`` (one per line) or
  ``TOPOPLACE_BOOTSTRAP_ADMIN_TOKEN``: the bootstrap path, and what
  deployments from before database tokens use.

The principal a token stands for is then checked against the one rule table
(service/access.py): 401 ``unauthorized`` without a known token, 403
``forbidden`` with one whose role or scope does not allow the call.

Verifying a database token costs one scrypt hash (tens of ms), so each
process keeps the principals it verified, keyed by the token's SHA-256: a
request pays a hash of its token and a dictionary lookup. A token it does
not know yet is checked under two bounds: its client address's budget of
refused tokens (service/edge/failed_token_budget.py), and the verifications
the process runs at once (service/tokens/verification_slots.py). A revoked token
leaves every process's cache within ``REVOCATION_POLL_S``: each process asks
the database which of its cached tokens are still live (a short indexed
read); the process that revoked it drops it at once.

With ``--insecure-dev`` (TOPOPLACE_INSECURE_DEV) a request without a token
is an admin; a token that is presented is still checked.

Health probes, metrics and the API's own documentation stay open: a kubelet
or a load balancer cannot present a token, and the schema is not a secret.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import sqlalchemy as sa
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from placement import UnknownNodeError
from service import access
from service.access import OPEN_PATHS, Permission, Role
from service.audit import actor as audit_actor
from service.database_unreachable import unavailable
from service.direct_routes import route_path
from service.edge import no_route, revoked_meanwhile
from service.edge.dev_hosts import DevHosts
from service.edge.dev_origin import is_own_origin
from service.edge.failed_token_budget import FailedTokenBudget
from service.edge.guard import replay_body
from service.edge.rate_limit import TOKEN_IDENTITY
from service.errors import RateLimited, RequestTimeout, ServiceError, TooLarge, Unavailable
from service.event_loop import off_loop
from service.responses import error_response
from service.tokens import secrets, store
from service.tokens.presented import Unauthorized
from service.tokens.presented import digest as _digest
from service.tokens.presented import presented as _presented
from service.tokens.verification_slots import VerificationSlots

__all__ = [
    "GRPC_FIELDS",
    "OPEN_PATHS",
    "REST_FIELDS",
    "Authenticator",
    "Forbidden",
    "NodeFields",
    "Principal",
    "RequireToken",
    "Unauthorized",
    "out_of_scope_by",
]

REVOCATION_POLL_S = 0.25
_REFUSED_TTL_S = 5.0  # an unknown tpp_ token is not hashed again for this long
_REFUSED_MAX = 10_000


class Forbidden(ServiceError):
    status = 403
    code = "forbidden"


@dataclass(frozen=True)
class Principal:
    token_id: str
    role: Role
    nodes: frozenset[str] = field(default_factory=frozenset)
    region: str | None = None
    name: str = ""

    def actor(self, route: str) -> audit_actor.Actor:
        """Who this is in the audit log, calling through ``route``."""
        return audit_actor.Actor(self.token_id, self.name, self.role.value, route)

    def scope_text(self) -> str:
        parts = []
        if self.nodes:
            parts.append("nodes " + ", ".join(sorted(self.nodes)))
        if self.region is not None:
            parts.append(f"region {self.region}")
        return "; ".join(parts) or "nothing"


INSECURE = Principal("insecure-dev", Role.ADMIN, name="--insecure-dev: no token")


@dataclass(frozen=True)
class NodeFields:
    """Where a transport's call names the node it acts for, and the region its snapshot
    claims: the field (``detail.field``) a refusal for a node outside the token's scope
    names, so the caller is told which part of its request was out of bounds."""

    node: str
    region: str


REST_FIELDS = NodeFields("path.name", "snapshot.region")
GRPC_FIELDS = NodeFields("node", "snapshot_json.region")


def read_token_file(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read the token file {path}: {exc.strerror}") from exc
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


RegionOf = Callable[[str], "str | None"]


class Authenticator:
    """Tokens to principals (cached), and principals against the rule table."""

    def __init__(
        self,
        engine: sa.Engine | None,
        static_tokens: Iterable[str] = (),
        *,
        insecure: bool = False,
        dev_hosts: DevHosts | None = None,
        failures: FailedTokenBudget | None = None,
        verifications: VerificationSlots | None = None,
    ) -> None:
        self.engine = engine
        self.insecure = insecure
        # The Host names a tokenless call is answered for in insecure mode (dev_hosts.py).
        self.dev_hosts = dev_hosts or DevHosts()
        self._open_prefixes: tuple[str, ...] = access.OPEN_PREFIXES
        self._static: dict[bytes, Principal] = {}
        for index, token in enumerate(t for t in static_tokens if t):
            self._static[_digest(token)] = Principal(f"static-{index}", Role.ADMIN, name="static")
        self._cache: dict[bytes, Principal] = {}
        # Ids this process knows were revoked: a principal authenticated before (an open
        # gRPC Watch, a hash in flight) is checked against them, not only the cache.
        self._revoked: set[str] = set()
        # Bumped each time ids join ``_revoked``: a request let in at one count and about
        # to write at the same one lost no token meanwhile (service/edge/revoked_meanwhile.py).
        self._generation = 0
        self._refused: dict[bytes, float] = {}
        self._lock = threading.Lock()
        # What a token not known yet may cost (shared by REST and gRPC: one instance).
        self.failures = failures or FailedTokenBudget()
        self.verifications = verifications or VerificationSlots()

    # -- which paths need nothing --------------------------------------------

    def open_prefix(self, prefix: str) -> None:
        """Let paths under ``prefix`` through without a token (a caller that cannot send one,
        such as kube-scheduler's extender client, protected by mTLS or network policy)."""
        self._open_prefixes += (prefix,)

    def is_open(self, path: str) -> bool:
        return path in OPEN_PATHS or path.startswith(self._open_prefixes)

    @property
    def has_static(self) -> bool:
        return bool(self._static)

    # -- who is calling -------------------------------------------------------

    def cached(self, authorization: str | None, identity: bytes | None = None) -> Principal | None:
        """The principal, when this process knows the token (static, or verified before);
        None when it must be checked. Raises :class:`Unauthorized` for a missing or
        malformed header. The path of nearly every request: two dictionary lookups.
        ``identity``: the token's digest, when the rate limit read it from this header
        already (service/tokens/presented.py), so that it is not hashed again."""
        if identity is None:
            if not authorization and self.insecure:
                return INSECURE
            identity = _digest(_presented(authorization))
        return self._static.get(identity) or self._cache.get(identity)

    def authenticate(self, authorization: str | None, address: str | None = None) -> Principal:
        """Blocking form of the two steps, for callers already off the event loop.
        ``address``: the client's, whose refused tokens are counted
        (service/edge/failed_token_budget.py)."""
        return self.cached(authorization) or self.verify(authorization, address)

    async def authenticate_async(
        self, authorization: str | None, address: str | None = None
    ) -> Principal:
        found = self.cached(authorization)
        if found is not None:
            return found
        return await self.verify_async(authorization, address)

    def verify(self, authorization: str | None, address: str | None) -> Principal:
        """The principal of a token :meth:`cached` did not know (blocking: a read, and a
        hash when the id is a live token's)."""
        token = _presented(authorization)
        token_id, secret = self._admit(token, address)
        try:
            live = self._live(token_id)
            if live is not None:
                with self.verifications.held_blocking():
                    if not secrets.verify_secret(secret, live[1]):
                        live = None
        except (Unavailable, RateLimited):
            self.failures.give_back(address)  # the service's trouble, not a refused token
            raise
        return self._settle(token, live, address)

    async def verify_async(self, authorization: str | None, address: str | None) -> Principal:
        """:meth:`verify` from the event loop: the read and the hash on worker threads, the
        hash under the process's bound on verifications at once (waiting on the loop, not
        on a thread)."""
        token = _presented(authorization)
        token_id, secret = self._admit(token, address)
        try:
            live = await off_loop(self._live, token_id)
            if live is not None and not await self.verifications.run(
                secrets.verify_secret, secret, live[1]
            ):
                live = None
        except (Unavailable, RateLimited):
            self.failures.give_back(address)
            raise
        # A caller cancelled meanwhile keeps its check taken: it may not buy hashes for free.
        return self._settle(token, live, address)

    def _admit(self, token: str, address: str | None) -> tuple[str, str]:
        """The (id, secret) of a token worth a read, before anything is read: raises
        :class:`Unauthorized` for one refused within the last few seconds (free, and not
        counted: a retry is no new guess) or of no known form (counted),
        :class:`RateLimited` while ``address`` has no refusals left."""
        digest = _digest(token)
        refused_until = self._refused.get(digest)
        if refused_until is not None and refused_until > time.monotonic():
            raise Unauthorized("the token is not one this service accepts")
        self.failures.take(address)
        parts = secrets.split(token)
        if self.engine is None or parts is None:
            self._remember_refused(digest)
            raise Unauthorized("the token is not one this service accepts")
        return parts

    def _live(self, token_id: str) -> tuple[store.TokenRecord, str] | None:
        assert self.engine is not None  # _admit checked it
        try:
            return store.live_token(self.engine, token_id)
        except sa.exc.OperationalError as exc:
            # The database's trouble, not the caller's: told as every route tells it, without
            # the driver's words (a caller not known yet reads the answer).
            raise unavailable(exc) from None

    def _settle(
        self, token: str, live: tuple[store.TokenRecord, str] | None, address: str | None
    ) -> Principal:
        """The principal of a token whose secret matched (``live``), cached; or the refusal
        of one that did not, remembered for a few seconds."""
        digest = _digest(token)
        if live is None:
            self._remember_refused(digest)
            raise Unauthorized("the token is not one this service accepts (unknown or revoked)")
        self.failures.give_back(address)
        record = live[0]
        principal = Principal(
            record.id, record.role, record.scope.nodes, record.scope.region, record.name
        )
        with self._lock:
            if record.id in self._revoked:  # revoked while its hash was checked
                raise Unauthorized("the token is not one this service accepts (revoked)")
            self._cache[digest] = principal
        return principal

    def _remember_refused(self, digest: bytes) -> None:
        with self._lock:
            if len(self._refused) >= _REFUSED_MAX:
                self._refused.clear()
            self._refused[digest] = time.monotonic() + _REFUSED_TTL_S

    # -- revocation -----------------------------------------------------------

    def drop(self, token_id: str) -> None:
        """Forget a token at once (this process revoked it)."""
        with self._lock:
            self._revoked.add(token_id)
            self._generation += 1
            for digest in [d for d, p in self._cache.items() if p.token_id == token_id]:
                del self._cache[digest]

    def forget_revoked(self) -> None:
        """Drop the cached tokens the database no longer holds live (blocking)."""
        if self.engine is None or not self._cache:
            return
        with self._lock:
            cached_ids = {p.token_id for p in self._cache.values()}
        live = store.live_ids(self.engine, cached_ids)
        gone = cached_ids - live
        if gone:
            with self._lock:
                self._revoked |= gone
                self._generation += 1
                for digest in [d for d, p in self._cache.items() if p.token_id in gone]:
                    del self._cache[digest]

    def revoked(self, principal: Principal) -> bool:
        """Whether the token ``principal`` stands for was revoked since it was authenticated
        (as far as this process knows: at once where it was revoked, else within a poll)."""
        return self.revoked_id(principal.token_id)

    def revoked_id(self, token_id: str) -> bool:
        return token_id in self._revoked

    @property
    def generation(self) -> int:
        """How many times this process has heard of revoked tokens (only grows)."""
        return self._generation

    # -- may they -------------------------------------------------------------

    def authorize(
        self,
        principal: Principal,
        permission: Permission,
        node: str | None,
        node_region: str | None,
        path_region: str | None = None,
        *,
        field: str = REST_FIELDS.node,
    ) -> None:
        """Raise :class:`Forbidden` unless ``principal`` may do this to ``node`` (or, for a
        region's summary, to the region its path names). ``field``: where the request
        named what put it out of scope (the node, or the region its snapshot claims)."""
        if permission not in access.GRANTS[principal.role]:
            roles = " or ".join(r.value for r in access.roles_with(permission))
            raise Forbidden(
                f"this call needs the {roles} role; the token has the {principal.role} role",
                {"needed": [r.value for r in access.roles_with(permission)]},
            )
        if principal.role is Role.REGION:
            if path_region is not None and path_region == principal.region:
                return
            raise Forbidden(
                f"this region token may only push the summary of region {principal.region!r},"
                f" not of {path_region!r}",
                {"region": path_region},
            )
        if principal.role is not Role.AGENT or permission is not Permission.REPORT:
            return
        if node is not None and node in principal.nodes:
            return
        if principal.region is not None and node_region == principal.region:
            return
        raise Forbidden(
            f"this agent token may not act for node {node!r} (its scope: {principal.scope_text()})",
            {"node": node, "field": field},
        )


def snapshot_region(body: bytes, *, wrapped: bool = True) -> str | None:
    """The region a snapshot's JSON names (the model's default when absent): of a REST
    report's body (``{"snapshot": {...}}``), or of the snapshot itself (gRPC)."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    snapshot = parsed.get("snapshot") if wrapped and isinstance(parsed, dict) else parsed
    if not isinstance(snapshot, dict):
        return None
    region = snapshot.get("region", "default")
    return region if isinstance(region, str) else None


def region_checker(state: Any) -> RegionOf:
    """The stored region of a node, from the service's in-memory cluster; None if unknown."""

    def region_of(node: str) -> str | None:
        # One read, not "in" then "node": read without the state lock, a delete heard
        # between the two (the listener's thread) raised, and the request answered 500.
        try:
            region: str = state.cluster.node(node).snapshot.region
        except UnknownNodeError:
            return None
        return region

    return region_of


class RequireToken:
    """ASGI middleware: the caller's principal, checked against the rule table, for every
    HTTP request but the open paths. The principal is left in ``scope["state"]``, and
    is the audit log's actor while the request runs (service/audit/actor.py)."""

    def __init__(
        self,
        app: ASGIApp,
        check: Authenticator,
        region_of: RegionOf,
        max_body_bytes: int,
        routes: Sequence[BaseRoute] = (),
        body_timeout_s: float = 30.0,
    ) -> None:
        self.app = app
        self.check = check
        self.region_of = region_of
        self.max_body_bytes = max_body_bytes
        # The body a region-scoped agent's snapshot is judged on is read here, before the
        # request guard that holds every other body to this deadline (service/edge/guard.py).
        self.body_timeout_s = body_timeout_s
        # The application's routes: a request no rule matches and that names none of them
        # is answered 404 or 405, not "needs the admin role" (service/edge/no_route.py).
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        if self.check.is_open(path):
            # No token is asked for (a probe; the extender when its routes are open).
            anonymous = audit_actor.Actor(None, "no token", None, f"{scope['method']} {path}")
            with audit_actor.acting(anonymous):
                await self.app(scope, receive, send)
            return
        # Read before the token is looked up: a revocation from now on is one made while
        # this request is in flight, checked again before it writes (revoked_meanwhile.py).
        generation = self.check.generation
        header = None
        site = None
        host = None
        origin = None
        for key, value in scope.get("headers", ()):
            if key == b"authorization" and header is None:
                header = value.decode("latin-1")
            elif key == b"sec-fetch-site" and site is None:
                site = value.decode("latin-1").strip().lower()
            elif key == b"host" and host is None:
                host = value.decode("latin-1")
            elif key == b"origin" and origin is None:
                origin = value.decode("latin-1")
        try:
            # The token's digest as the rate limit read it, so it is not hashed twice.
            principal = self.check.cached(header, scope.get(TOKEN_IDENTITY))
            if principal is INSECURE:
                # Judged on the principal, not on the header's absence: an empty
                # 'Authorization:' (which fetch() may send) presents no token either.
                _refuse_rebound_host(host, self.check.dev_hosts)
                if scope["method"] not in SAFE_METHODS:
                    _refuse_another_site(site)
                    if site is None:  # a browser that sends it was judged on it
                        _refuse_another_origin(origin, host, scope.get("scheme", "http"))
            if principal is None:  # not on the path of a token known (nearly every request)
                client = scope.get("client")
                principal = await self.check.verify_async(header, client[0] if client else None)
            receive, route = await self._authorize(principal, scope, path, receive)
        except Unauthorized as error:
            response = error_response(error)
            response.headers["WWW-Authenticate"] = "Bearer"
            await response(scope, receive, send)
            return
        except ServiceError as refusal:  # forbidden, too large, the database down
            response = error_response(refusal)
            if isinstance(refusal, no_route.MethodNotTaken):
                response.headers["Allow"] = ", ".join(refusal.allow)
            if isinstance(refusal, TooLarge | RequestTimeout):
                # The rest of the body is not read: the connection cannot carry another request.
                response.headers["Connection"] = "close"
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = principal
        with (
            audit_actor.acting(principal.actor(route)),
            revoked_meanwhile.admitted(
                revoked_meanwhile.Admission(self.check, principal.token_id, generation)
            ),
        ):
            await self.app(scope, receive, send)

    async def _authorize(
        self, principal: Principal, scope: Scope, path: str, receive: Receive
    ) -> tuple[Receive, str]:
        """The body's receive (replayed when it was read here) and the route as the audit
        log names it, the rule's template (``POST /v1/allocations/{allocation_id}/confirm``)."""
        match = access.rest_rule(scope["method"], path, access.query_of(scope))
        if match.rule is None and self.routes:
            no_route.check(self.routes, scope, path)  # then a route with no rule: admin's
        route = f"{scope['method']} {match.rule.path if match.rule else path}"
        node = match.node
        region = self.region_of(node) if node is not None else None
        needs_body = (
            principal.role is Role.AGENT
            and match.permission is Permission.REPORT
            and principal.region is not None
            and node not in principal.nodes
            and scope["method"] == "PUT"
            and path.endswith("/snapshot")
        )
        if not needs_body:
            if (
                principal.role is Role.AGENT
                and principal.region is not None
                and region is None
                and path.endswith("/key")
            ):
                # A key comes before a node's first snapshot: a region token may register
                # one for a node not yet known (its snapshot must then be in the region).
                region = principal.region
            self.check.authorize(principal, match.permission, node, region, match.region)
            return receive, route
        # A region-scoped agent's snapshot: the node must be in the region now (if known)
        # and stay in it, so the body is read here (bounded) and handed on unchanged.
        body, replay = await _buffer(receive, self.max_body_bytes, self.body_timeout_s)
        claimed = snapshot_region(body)
        field = out_of_scope_by(principal, region, REST_FIELDS)
        if region is not None and claimed != region:
            claimed = None
        self.check.authorize(principal, match.permission, node, claimed, field=field)
        return replay, route


def out_of_scope_by(principal: Principal, region: str | None, fields: NodeFields) -> str:
    """Which field put a region-scoped agent's snapshot out of its scope: the node (the
    path, the request's ``node``) when it is known here in another region; else the region
    the snapshot claims (the node is new, or in the token's region and claimed out of it)."""
    if region is not None and region != principal.region:
        return fields.node
    return fields.region


# What a browser sends for a page of another site (Sec-Fetch-Site, which no page can set):
# a form or a no-cors fetch, sent without asking this service.
OTHER_SITES = frozenset({"cross-site", "same-site"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _refuse_rebound_host(host: str | None, allowed: DevHosts) -> None:
    """With --insecure-dev a call without a token is an admin's: one whose Host is not
    this machine's may come from a page of another site that pointed its own name at the
    service (DNS rebinding), which the browser would let read the answer too. Reads are
    refused as well as writes (service/edge/dev_hosts.py)."""
    if not allowed.allows(host):
        raise Forbidden(
            f"an --insecure-dev service answers calls without a token only for a loopback"
            f" host, not {host!r}: send 'Authorization: Bearer TOKEN', call it as localhost"
            " or 127.0.0.1, or list the name in TOPOPLACE_INSECURE_DEV_HOSTS",
            {"host": host},
        )


def _refuse_another_site(site: str | None) -> None:
    """With --insecure-dev a call without a token is an admin's, so a page of any other
    site a developer's browser opens could change the service (cordon, place, make a
    token) by a plain form post: like a cookie, no token is a credential the browser
    sends by itself. Such a write is refused; reads stay open (the browser keeps another
    site from reading the answer), and so do programs, which send no Sec-Fetch-Site."""
    if site in OTHER_SITES:
        raise Forbidden(
            f"a page of another site ({site}) may not change an --insecure-dev service"
            " without a token: send 'Authorization: Bearer TOKEN', or call it from its own"
            " pages (/console, /docs)",
            {"sec_fetch_site": site},
        )


def _refuse_another_origin(origin: str | None, host: str | None, scheme: str) -> None:
    """As :func:`_refuse_another_site`, for a browser that sends no Sec-Fetch-Site: its
    write still names the page it came from in ``Origin`` (service/edge/dev_origin.py).
    A call without ``Origin`` is a program's, and stays served. Only where Sec-Fetch-Site
    is absent: a proxy that serves the service under its own name and sends the
    upstream's ``Host`` (the console behind a path prefix) makes the service's own pages
    another origin to this check, while the browser's Sec-Fetch-Site says same-origin."""
    if origin is not None and not is_own_origin(origin, host, scheme):
        raise Forbidden(
            f"a page of another origin ({origin}) may not change an --insecure-dev service"
            " without a token: send 'Authorization: Bearer TOKEN', or call it from its own"
            " pages (/console, /docs)",
            {"origin": origin},
        )


async def _buffer(receive: Receive, limit: int, timeout_s: float) -> tuple[bytes, Receive]:
    """The whole body (at most ``limit`` bytes, within ``timeout_s``), and a receive that
    hands it on. Without the deadline a body dripped a byte at a time held its connection
    for good: the guard's own deadline starts only after this check."""
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_whole(receive, limit)
    except TimeoutError:
        raise RequestTimeout(
            f"the request's body did not arrive within {timeout_s:g} s (TOPOPLACE_BODY_TIMEOUT_S)",
            {"limit_s": timeout_s, "part": "body"},
        ) from None


async def _read_whole(receive: Receive, limit: int) -> tuple[bytes, Receive]:
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"the body is over {limit} bytes")
        chunks.append(chunk)
        more = message.get("more_body", False)
    body = b"".join(chunks)
    return body, replay_body(body, receive)
