"""A region-scoped agent's gRPC heartbeat is checked against the stored region.

The second replica's memory still has the node in the agent's region after the
first one stored a move to another region: the heartbeat's own transaction says no.
"""

from __future__ import annotations

import contextlib
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from agent.signing import NodeKey
from service import schema
from service.app import create_app
from service.grpc.gen import topoplace_pb2 as pb
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import ADMIN_TOKEN, FakeClock, secured
from tests.service.grpc.conftest import details, reason, start
from tests.service.nodes.test_region_agent_replicas import _signed

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def test_a_grpc_heartbeat_for_a_node_moved_out_of_the_agents_region_is_refused(
    settings: Settings, clock: FakeClock
) -> None:
    trusting = secured(settings.model_copy(update={"trust_on_first_use": True}))
    key = NodeKey.generate()
    first_app = create_app(trusting, clock=clock, background=False)
    with TestClient(first_app, headers=ADMIN) as first:
        created = first.post("/v1/tokens", json={"role": "agent", "region": "us"})
        metadata = (("authorization", f"Bearer {created.json()['token']}"),)
        assert first.put("/v1/nodes/n7/key", json={"public_key": key.public_key})
        answer = first.put("/v1/nodes/n7/snapshot", json=_signed("n7", "us", 1, key))
        assert answer.status_code == 200, answer.text
        with contextlib.contextmanager(start)(trusting, clock) as second:
            second.stub.Heartbeat(pb.HeartbeatRequest(node="n7"), metadata=metadata)
            moved = first.put("/v1/nodes/n7/snapshot", json=_signed("n7", "eu", 2, key))
            assert moved.status_code == 200, moved.text
            assert second.state.cluster.node("n7").snapshot.region == "us"  # not heard of yet
            before = _heartbeat_at(second.state)
            clock.advance(30)
            with pytest.raises(grpc.RpcError) as refused:
                second.stub.Heartbeat(pb.HeartbeatRequest(node="n7"), metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert reason(refused.value) == "forbidden"
            # The request's field, not REST's path: the node named in the call.
            [violation] = details(refused.value)["BadRequest"].field_violations  # type: ignore[attr-defined]
            assert violation.field == "node"
            assert _heartbeat_at(second.state) == before


def _heartbeat_at(state: ServiceState) -> Any:
    with state.engine.connect() as conn:
        query = sa.select(schema.nodes.c.heartbeat_at).where(schema.nodes.c.name == "n7")
        return conn.execute(query).scalar_one()
