"""The FastAPI application: routers, the one error shape, health, and background work."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from service import cluster_view, front_page, migrate
from service.allocations import api as allocations
from service.allocations import endpoints as allocation_routes
from service.audit import endpoints as audit_routes
from service.audit import retention as audit_retention
from service.audit.actor import acting, service_task
from service.auth import REVOCATION_POLL_S, Authenticator, RequireToken, region_checker
from service.console import endpoints as console_routes
from service.database_time import MEASURE_INTERVAL_S, DatabaseTime, database_reader
from service.database_unreachable import NOT_ANSWERING
from service.db import checkpoint, make_engine
from service.demo import heartbeat_demo_cluster, register_demo_cluster
from service.direct_routes import DirectRoutes
from service.edge.dev_hosts import DevHosts
from service.edge.failed_token_budget import FailedTokenBudget
from service.edge.faults import FaultBarrier
from service.edge.guard import RequestGuard
from service.edge.headers import SafetyHeaders
from service.edge.known_query import KNOWN_QUERY
from service.edge.rate_limit import RateLimit, RateLimiter
from service.edge.unread_body import CloseUnreadBody
from service.event_loop import off_loop
from service.federation import endpoints as federation_routes
from service.federation import forward_retention
from service.federation.forward import region_client
from service.federation.pusher import SummaryPusher
from service.federation.registry import Registry
from service.federation.summary_refusals import SummaryRefusals
from service.grpc.server import start_grpc
from service.k8s import device_routes as k8s_device_routes
from service.k8s import endpoints as k8s_routes
from service.metrics import endpoint as metrics_route
from service.metrics.http import RequestMetrics
from service.nodes import endpoints as node_routes
from service.notify import Listener, psycopg_dsn
from service.openapi_errors import declare_errors
from service.responses import HANDLED_ERRORS, database_down, handled_error
from service.settings import Settings
from service.slurm import endpoints as slurm_routes
from service.slurm import watchers
from service.slurm.node_states_watcher import NodeStatesWatcher
from service.slurm.reconcile import Reconciler
from service.state import Clock, ServiceState, utc_now
from service.tokens import endpoints as token_routes
from service.tokens import store as token_store
from service.tokens.verification_slots import VerificationSlots

log = logging.getLogger("topoplace.service")
# Expiry runs often, so each sweep ends few reservations: ending hundreds at
# once held the state lock long enough to show in /place's p99, and at 200
# reservations/s expiring, sweeps every 0.5 s (about 100 each) still stalled
# /place by 10-15 ms twice a second; every 0.1 s those stalls are gone.
SWEEP_INTERVAL_S = 0.1
MAINTENANCE_INTERVAL_S = 2.0  # demo heartbeats
SWEEP = service_task("sweep")
# SQLite's WAL is copied into the database here, off the commit path (db.checkpoint):
# at a thousand reservations a second that is under 10,000 pages a time.
CHECKPOINT_INTERVAL_S = 1.0


async def _background(
    state: ServiceState, demo_nodes: list[str], database_time: DatabaseTime | None = None
) -> None:
    """Expire stale reservations; checkpoint SQLite; prune the audit log and the
    forwarded keys past retention; keep the demo nodes' heartbeats fresh; read the
    database's clock again (service/database_time.py)."""
    # Each in its own task (service/slurm/watchers.py): a slow squeue holds up neither
    # sinfo's reads nor the sweep. The reconciler keeps its own clock: it also runs as
    # soon as a fresh Slurm reservation's grace period ends (service/slurm/fresh.py).
    slurm = watchers.start(
        {
            # where squeue is present (TOPOPLACE_SLURM_SQUEUE_COMMAND)
            "reconcile": Reconciler(state).tick,
            # every TOPOPLACE_SLURM_NODES_INTERVAL_S where sinfo is (..._SINFO_COMMAND)
            "Slurm node states": NodeStatesWatcher(state).tick,
        }
    )
    try:
        await _sweep_forever(state, demo_nodes, database_time)
    finally:
        await watchers.stop(slurm)


async def _sweep_forever(
    state: ServiceState, demo_nodes: list[str], database_time: DatabaseTime | None
) -> None:
    interval = min(MAINTENANCE_INTERVAL_S, state.settings.heartbeat_ttl_s / 3)
    last_maintenance = last_checkpoint = 0.0
    next_prune = float("-inf")  # the first round prunes what a stopped service left
    next_forward_prune = float("-inf")
    loop = asyncio.get_running_loop()
    last_measure = loop.time()  # the lifespan measured it before the state loaded
    while True:
        await asyncio.sleep(SWEEP_INTERVAL_S)
        try:
            if database_time is not None and loop.time() - last_measure >= MEASURE_INTERVAL_S:
                last_measure = loop.time()
                await off_loop(database_time.measure)
            with acting(SWEEP):  # the audit log's actor of what expires
                await off_loop(allocations.sweep, state)  # one `expired` event each
            if loop.time() - last_checkpoint >= CHECKPOINT_INTERVAL_S:
                last_checkpoint = loop.time()
                await off_loop(checkpoint, state.engine)
            # Each prune's next round is set an interval on before it runs: one that fails
            # (a role without DELETE, a statement timeout) is tried again then, not every
            # round, where it would hold up the work after it in the loop for good.
            if loop.time() >= next_prune:
                next_prune = loop.time() + audit_retention.wait_after(state, 0)
                pruned = await off_loop(audit_retention.prune, state)
                next_prune = loop.time() + audit_retention.wait_after(state, pruned)
            if loop.time() >= next_forward_prune:
                next_forward_prune = loop.time() + forward_retention.wait_after(0)
                pruned = await off_loop(forward_retention.prune, state)
                next_forward_prune = loop.time() + forward_retention.wait_after(pruned)
            if loop.time() - last_maintenance < interval:
                continue
            last_maintenance = loop.time()
            if demo_nodes:
                await off_loop(heartbeat_demo_cluster, state, demo_nodes)
        except Exception:  # the loop must outlive a database hiccup
            log.exception("background sweep failed; retrying")


INSECURE_BANNER = (
    "\n" + "!" * 72 + "\n"
    "!! INSECURE: --insecure-dev / TOPOPLACE_INSECURE_DEV is on. Every caller without\n"
    "!! a token is an admin: it may place, release, cordon, delete nodes and keys.\n"
    "!! For a laptop only; never on a network others can reach.\n" + "!" * 72
)


class NoTokenSource(RuntimeError):
    """The service would start open: no token of any kind and no --insecure-dev."""


def require_token_source(settings: Settings, engine: sa.Engine, check: Authenticator) -> None:
    """Refuse to serve without a way to authenticate anyone (secure by default)."""
    if settings.insecure_dev:
        log.warning(INSECURE_BANNER)
        return
    if check.has_static or token_store.any_live(engine):
        return
    raise NoTokenSource(
        "refusing to start without API tokens: set TOPOPLACE_BOOTSTRAP_ADMIN_TOKEN (or"
        " TOPOPLACE_API_TOKENS / TOPOPLACE_API_TOKEN_FILE), or make one with `topoplace token"
        " create --database-url URL --role admin`; for a laptop, `--insecure-dev`"
    )


async def _forget_revoked(check: Authenticator) -> None:
    """Keep this process's token cache in step with revocations made anywhere."""
    while True:
        await asyncio.sleep(REVOCATION_POLL_S)
        try:
            await off_loop(check.forget_revoked)
        except Exception:  # a database hiccup: the next round tries again
            log.exception("token revocation check failed; retrying")


def _settle_heap() -> None:
    """Move the loaded cluster out of the garbage collector's sight.

    The in-memory state is hundreds of thousands of long-lived objects; a
    full collection walks all of them (tens of milliseconds at 10,000 nodes)
    and lands on whichever request is running: the /place p99. Freezing what
    exists after the load leaves collections only the young, short-lived
    objects of requests; a higher first threshold makes those rarer.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def _ticks_of(clock: Clock) -> Callable[[], float]:
    return lambda: clock().timestamp()


def create_app(
    settings: Settings | None = None,
    *,
    demo: bool = False,
    clock: Clock | None = None,
    database_clock: Clock | None = None,
    background: bool = True,
) -> FastAPI:
    """``clock``: this host's clock (None: its wall clock). ``database_clock``: the
    database's (None: read from a Postgres server when ``clock`` is None; else the one
    clock given is also the database's, so that a test moving it moves every decision).
    Every decision is on the database's clock (service/database_time.py)."""
    settings = settings or Settings()
    engine = make_engine(settings.database_url, settings.database_idle_in_transaction_s)
    host = clock or utc_now
    read = database_clock
    if read is None and clock is None:
        read = database_reader(engine)
    database_time = None
    if read is not None:
        # In production the time elapsed between two reads is counted on the monotonic
        # clock, which no NTP step moves; a host clock given (tests) counts it instead.
        ticks = time.monotonic if clock is None else _ticks_of(host)
        database_time = DatabaseTime(read, host, ticks)
    state = ServiceState(settings, engine, database_time or host)
    token_check = Authenticator(
        engine,
        settings.static_tokens(),
        insecure=settings.insecure_dev,
        dev_hosts=DevHosts(settings.insecure_dev_hosts.split(",")),
        failures=FailedTokenBudget(settings.auth_failures_per_s, settings.auth_failure_burst),
        verifications=VerificationSlots(
            settings.token_verifications_at_once, settings.token_verification_wait_s
        ),
    )
    limiter = RateLimiter(settings.rate_limit_per_s, settings.rate_limit_burst)
    # A region's service pushes its summary to a global one (docs/federation.md); the
    # key and token are read now, so that `serve` refuses a bad one before it starts.
    pusher = SummaryPusher(state, settings) if settings.federation_global else None
    federation_client = region_client()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.migrate_on_start:
            await off_loop(migrate.upgrade, settings.database_url)
        await off_loop(require_token_source, settings, engine, token_check)
        if database_time is not None:
            await off_loop(database_time.measure)  # before anything is judged by it
        await off_loop(state.load)
        _settle_heap()
        listener = None
        if not settings.is_sqlite:
            dsn = psycopg_dsn(settings.database_url)
            listener = Listener(dsn, state, on_lag=state.metrics.lag)
            listener.start()
        demo_nodes = await off_loop(register_demo_cluster, state) if demo else []
        app.state.grpc = await off_loop(start_grpc, state, token_check, limiter)
        task = (
            asyncio.create_task(_background(state, demo_nodes, database_time))
            if background
            else None
        )
        revocations = asyncio.create_task(_forget_revoked(token_check))
        pushing = asyncio.create_task(pusher.run()) if pusher is not None else None
        following = asyncio.create_task(app.state.federation.follow())
        try:
            yield
        finally:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
            if pushing is not None:
                pushing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pushing
            await federation_client.aclose()
            revocations.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await revocations
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if app.state.grpc is not None:
                await off_loop(app.state.grpc.stop)
            if listener is not None:
                await off_loop(listener.stop)
            await off_loop(state.committer.stop)
            engine.dispose()

    app = FastAPI(
        title="topoplace",
        version="1",
        description="Topology-aware GPU placement: chooses the node and the exact GPUs.",
        lifespan=lifespan,
        # Served from the package by service/console/, not from a CDN: see docs/console.md.
        docs_url=None,
        redoc_url=None,
        # A path with a trailing slash is no route (404, service/edge/no_route.py), not a
        # 307 to the path without it: a write's body is not sent on to another URL.
        redirect_slashes=False,
    )
    app.state.service = state
    app.state.token_check = token_check
    app.state.federation = Registry(engine, settings.federation_stale_s, state.clock)
    app.state.federation_client = federation_client
    app.state.summary_refusals = SummaryRefusals(state)
    app.state.pusher = pusher
    # The general API refuses query parameters its routes do not declare (known_query.py).
    general = [KNOWN_QUERY]
    app.include_router(node_routes.router, dependencies=general)
    app.include_router(allocation_routes.router, dependencies=general)
    app.include_router(cluster_view.router, dependencies=general)
    app.include_router(slurm_routes.router)
    app.include_router(k8s_routes.router)
    app.include_router(k8s_device_routes.router)
    app.include_router(token_routes.router, dependencies=general)
    app.include_router(metrics_route.router)
    app.state.exposition = metrics_route.exposition(state)
    app.include_router(console_routes.router)
    console_routes.mount_assets(app)
    app.include_router(federation_routes.router, dependencies=general)
    app.include_router(audit_routes.router, dependencies=general)
    app.include_router(front_page.router)

    async def _handled(_: Request, exc: Exception) -> JSONResponse:
        response = handled_error(exc)
        assert response is not None  # registered for the kinds it answers, below
        return response

    for kind in HANDLED_ERRORS:
        app.add_exception_handler(kind, _handled)

    # Innermost first: the direct routes run behind the request checks and the token
    # check; a fault anywhere inside is answered by the barrier, outermost.
    direct = {**slurm_routes.DIRECT, **k8s_routes.DIRECT, **federation_routes.DIRECT}
    app.add_middleware(DirectRoutes, routes=direct)
    app.add_middleware(
        RequestGuard,
        max_body_bytes=settings.max_body_bytes,
        body_timeout_s=settings.body_timeout_s,
        max_placement_body_bytes=settings.max_placement_body_bytes,
        max_reconcile_body_bytes=settings.max_reconcile_body_bytes,
    )
    # Outside the guard: a body is read only once the caller's token is allowed its route,
    # which is what makes the reconcile route's larger limit safe (a scheduler's token).
    app.add_middleware(
        RequireToken,
        check=token_check,
        region_of=region_checker(state),
        max_body_bytes=settings.max_body_bytes,
        routes=app.router.routes,
        body_timeout_s=settings.body_timeout_s,
    )
    # Outside the token check: a flood of bad tokens is throttled before it costs a hash.
    app.add_middleware(RateLimit, limiter=limiter)
    app.add_middleware(FaultBarrier)
    # Every answer is timed as the client gets it, a fault's 500 and a 429 too.
    app.add_middleware(RequestMetrics, metrics=state.metrics, direct=direct)
    # Outside the checks: a 500, a 429 and a 401 are answers a browser may show too.
    app.add_middleware(SafetyHeaders)
    # Outermost: whatever answers before a request's body was read closes the connection.
    app.add_middleware(CloseUnreadBody)
    declare_errors(app)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    loading = {"type": "object", "properties": {"status": {"const": "loading"}}}
    not_ready = {"description": "not ready", "content": {"application/json": {"schema": loading}}}

    @app.get("/readyz", tags=["health"], responses={503: not_ready})
    def readyz() -> Any:
        """The database answers and the in-memory state is loaded."""
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
        except NOT_ANSWERING as exc:
            return database_down(exc)
        if not state.loaded:
            return JSONResponse({"status": "loading"}, status_code=503)
        ready: dict[str, Any] = {"status": "ready", "nodes": len(state.cluster)}
        if settings.insecure_dev:
            ready["insecure"] = True  # callers without a token are admins
        k8s = getattr(app.state, "k8s", None)
        if k8s is not None:  # the pod watch: says when the Kubernetes API is unreachable
            ready["kubernetes"] = k8s.health()
        return ready

    return app
