"""The database goes away: UNAVAILABLE with RetryInfo, health NOT_SERVING, nothing half-done."""

from __future__ import annotations

import time

import grpc
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.app import create_app
from service.grpc.gen import topoplace_pb2 as pb
from service.grpc.gen import topoplace_pb2_grpc as pb_grpc
from service.grpc.server import GrpcServer
from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.grpc.conftest import details, reason, snapshot_request


def test_place_is_unavailable_and_health_says_so(
    doomed_database: tuple[str, sa.Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, admin = doomed_database
    monkeypatch.setattr("service.grpc.server.HEALTH_INTERVAL_S", 0.2)
    app = create_app(Settings(database_url=url, grpc_port=0), clock=FakeClock(), background=False)
    with TestClient(app):
        server: GrpcServer = app.state.grpc
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.TopoplaceStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            service = health_pb2.HealthCheckRequest(service="topoplace.v1.Topoplace")
            assert health.Check(service).status == health_pb2.HealthCheckResponse.SERVING
            stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))
            name = sa.make_url(url).database
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE "{name}" WITH (FORCE)'))
            with pytest.raises(grpc.RpcError) as caught:
                stub.Place(pb.PlaceRequest(gpus=2))
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert reason(caught.value) == "database_unavailable"
            assert details(caught.value)["RetryInfo"].retry_delay.seconds == 5
            # The tentative choice was undone: memory still shows every GPU free.
            entry = app.state.service.cluster.node("h0")
            assert entry.free_mask == (1 << 8) - 1
            deadline = time.monotonic() + 10
            status = health_pb2.HealthCheckResponse.SERVING
            while time.monotonic() < deadline:
                status = health.Check(service).status
                if status == health_pb2.HealthCheckResponse.NOT_SERVING:
                    break
                time.sleep(0.1)
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING
            overall = health.Check(health_pb2.HealthCheckRequest(service=""))
            assert overall.status == health_pb2.HealthCheckResponse.SERVING  # the process is up
        with admin.connect() as conn:  # give the fixture a database to drop
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
