"""The gRPC server: grpc.aio on a thread of its own, sharing the process's ServiceState.

It runs its own asyncio loop on its own thread, so it works the same under
uvicorn (uvloop), under a test client, or alone, and the REST loop and the
gRPC loop never wait on each other. Blocking service calls run on a worker
pool of the same size as the one FastAPI gives REST's handlers.

Also served: the standard health service (``grpc.health.v1``: the overall
status "" is SERVING while the process runs; ``topoplace.v1.Topoplace`` is
SERVING while the database answers, checked every few seconds, as REST's
/readyz) and server reflection, so grpcurl and grpc_cli work without the
.proto.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import sqlalchemy as sa
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from service.auth import Authenticator, region_checker
from service.edge.rate_limit import RateLimiter
from service.event_loop import off_loop
from service.grpc.auth import RequireToken
from service.grpc.gen import topoplace_pb2 as pb
from service.grpc.gen import topoplace_pb2_grpc as pb_grpc
from service.grpc.open_streams import OpenStreams
from service.grpc.rate_limit import RateLimit
from service.grpc.servicer import TopoplaceServicer
from service.grpc.slow_clients import MessageDeadline
from service.settings import Settings
from service.state import ServiceState

# Announced beside uvicorn's own "running on" line, on the logger uvicorn configures.
announce = logging.getLogger("uvicorn.error")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Topoplace"].full_name
WORKERS = 40  # as anyio's default thread limit, which FastAPI's sync handlers use
HEALTH_INTERVAL_S = 5.0
STOP_GRACE_S = 5.0


class GrpcServer:
    def __init__(
        self,
        state: ServiceState,
        check: Authenticator,
        host: str,
        port: int,
        *,
        health_interval_s: float | None = None,
        limiter: RateLimiter | None = None,
    ) -> None:
        self.state = state
        self.check = check
        settings = state.settings
        self.limiter = limiter or RateLimiter(settings.rate_limit_per_s, settings.rate_limit_burst)
        self.host = host
        self.requested_port = port
        self.port: int | None = None  # the bound one (port 0 picks a free one)
        self.health_interval_s = health_interval_s or HEALTH_INTERVAL_S
        self._thread = threading.Thread(target=self._run, name="topoplace-grpc", daemon=True)
        self._started = threading.Event()
        self._error: BaseException | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's own event loop
        self._stop: asyncio.Event | None = None

    def start(self) -> int:
        """Bind and start serving; returns the port; raises if it cannot bind."""
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise RuntimeError(
                f"the gRPC server could not start on {self.host}:{self.requested_port}:"
                f" {self._error}"
            ) from self._error
        assert self.port is not None
        return self.port

    def stop(self) -> None:
        if self.loop is not None and self._stop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=STOP_GRACE_S + 5)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        loop.set_default_executor(ThreadPoolExecutor(WORKERS, thread_name_prefix="topoplace-grpc"))
        self.loop = loop
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        try:
            server, health_servicer = self._build()
            address = f"{self.host}:{self.requested_port}"
            credentials = server_credentials(self.state.settings)
            if credentials is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, credentials)
            if port == 0:
                raise OSError("the address is in use or not available")
            await server.start()
            await self._check_health(health_servicer)  # known before the first call comes
        except Exception as exc:
            self._error = exc
            self._started.set()
            return
        self.port = port
        announce.info(
            "gRPC API on %s:%d (%s; health and reflection on)",
            self.host,
            port,
            "TLS" if self.state.settings.tls else "plaintext",
        )
        self._started.set()
        probe = asyncio.create_task(self._probe(health_servicer))
        await self._stop.wait()
        probe.cancel()
        self.state.events.close_all()  # watchers' streams end now, not after the grace period
        await health_servicer.enter_graceful_shutdown()
        await server.stop(STOP_GRACE_S)

    def _build(self) -> tuple[grpc.aio.Server, health.aio.HealthServicer]:
        settings = self.state.settings
        server = grpc.aio.server(
            interceptors=[
                MessageDeadline(settings.body_timeout_s),  # first: it wraps what the rest chose
                OpenStreams(settings.max_open_streams, settings.max_open_streams_per_peer),
                RateLimit(self.limiter),
                RequireToken(self.check, region_checker(self.state)),
            ],
            options=[
                ("grpc.max_receive_message_length", settings.max_body_bytes),
                ("grpc.so_reuseport", 0),  # a port in use is an error, not shared
                # A connection with no call open is closed (GOAWAY) as REST's kept-alive
                # one is: idle ones were held for good, each a file descriptor of the
                # process REST shares. Clients reconnect for their next call.
                ("grpc.max_connection_idle_ms", settings.keep_alive_timeout_s * 1000),
            ],
        )
        pb_grpc.add_TopoplaceServicer_to_server(TopoplaceServicer(self.state, self.check), server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        names = (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, server)
        return server, health_servicer

    async def _probe(self, health_servicer: health.aio.HealthServicer) -> None:
        """Keep the Topoplace service's health in step with the database, as /readyz."""
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self._check_health(health_servicer)

    async def _check_health(self, health_servicer: health.aio.HealthServicer) -> None:
        ready = await off_loop(self._database_answers)
        serving = health_pb2.HealthCheckResponse.SERVING
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        await health_servicer.set("", serving)
        await health_servicer.set(SERVICE_NAME, serving if ready else not_serving)

    def _database_answers(self) -> bool:
        try:
            with self.state.engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
        except sa.exc.SQLAlchemyError:
            return False
        return self.state.loaded


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS credentials from TOPOPLACE_TLS_CERT/KEY, the files REST serves too; None without."""
    if not settings.tls:
        return None
    assert settings.tls_cert is not None and settings.tls_key is not None
    with open(settings.tls_key, "rb") as key, open(settings.tls_cert, "rb") as cert:
        return grpc.ssl_server_credentials([(key.read(), cert.read())])


def start_grpc(
    state: ServiceState, check: Authenticator, limiter: RateLimiter | None = None
) -> GrpcServer | None:
    """Start the gRPC API when TOPOPLACE_GRPC_PORT is set; None otherwise."""
    port = state.settings.grpc_port
    if port is None:
        return None
    server = GrpcServer(state, check, state.settings.host, port, limiter=limiter)
    server.start()
    return server
