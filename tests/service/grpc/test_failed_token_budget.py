"""Failed token checks per client address over gRPC: as REST's (tests/service/edge/)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from service.access import Role
from service.db import make_engine
from service.grpc.gen import topoplace_pb2 as pb
from service.settings import Settings
from service.tokens import store
from tests.service.edge.test_failed_token_budget import Costs, count_costs
from tests.service.grpc.conftest import Running, details, reason, start

BURST = 5


@pytest.fixture
def running(settings: Settings) -> Iterator[Running]:
    limits = {
        "insecure_dev": False,
        "api_tokens": "s3cret-0123456789abcdef",
        "auth_failure_burst": BURST,
        "auth_failures_per_s": 0.001,
    }
    yield from start(settings.model_copy(update=limits))


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def refusal(running: Running, token: str, *, stream: bool = False) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        if stream:
            next(running.stub.Watch(pb.WatchRequest(), metadata=bearer(token), timeout=10))
        else:
            running.stub.ListNodes(pb.ListNodesRequest(), metadata=bearer(token))
    return refused.value


def test_a_flood_of_made_up_tokens_is_resource_exhausted_without_reads_or_hashes(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(running.state.settings.database_url)
    record, token = store.create(engine, Role.VIEWER, name="dashboard")
    costs: Costs = count_costs(running.server.check.engine, monkeypatch)
    assert not running.stub.ListNodes(pb.ListNodesRequest(), metadata=bearer(token)).nodes
    costs.hashes = costs.reads = 0
    codes = [refusal(running, f"tpp_{record.id}_guess{n}").code() for n in range(BURST + 10)]
    assert (
        codes
        == [grpc.StatusCode.UNAUTHENTICATED] * BURST + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 10
    )
    assert (costs.hashes, costs.reads) == (BURST, BURST)
    last = refusal(running, f"tpp_{record.id}_guess-last")
    assert reason(last) == "rate_limited"
    assert details(last)["RetryInfo"].retry_delay.seconds >= 1  # type: ignore[attr-defined]
    # A stream is refused the same way, before it starts.
    watched = refusal(running, f"tpp_{record.id}_guess-watch", stream=True)
    assert watched.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (costs.hashes, costs.reads) == (BURST, BURST)
    # The token verified before the flood keeps working from the same address.
    assert not running.stub.ListNodes(pb.ListNodesRequest(), metadata=bearer(token)).nodes
    stream = running.stub.Watch(pb.WatchRequest(), metadata=bearer(token), timeout=10)
    assert next(stream).type == "started"
    stream.cancel()
    # A token not verified yet waits for the address's budget.
    _, fresh = store.create(engine, Role.VIEWER, name="another")
    assert reason(refusal(running, fresh)) == "rate_limited"
    engine.dispose()


def test_a_token_first_seen_over_grpc_is_held_to_its_role_and_scope(running: Running) -> None:
    """A token verified inside the call (where the peer's address is known) is checked
    against the rule table as one found in the cache."""
    engine = make_engine(running.state.settings.database_url)
    _, viewer = store.create(engine, Role.VIEWER, name="viewer")
    _, other_viewer = store.create(engine, Role.VIEWER, name="viewer 2")
    _, agent = store.create(engine, Role.AGENT, store.Scope(nodes=frozenset({"h0"})), "agent")
    engine.dispose()
    with pytest.raises(grpc.RpcError) as caught:
        running.stub.Place(pb.PlaceRequest(gpus=1), metadata=bearer(viewer))
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as caught:
        running.stub.Heartbeat(pb.HeartbeatRequest(node="elsewhere"), metadata=bearer(agent))
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
    stream = running.stub.Watch(pb.WatchRequest(), metadata=bearer(other_viewer), timeout=10)
    assert next(stream).type == "started"
    stream.cancel()
    # None of them was a failure: the address's budget is whole.
    for n in range(BURST):
        assert refusal(running, f"tpp_0123456789ab_guess{n}").code() is (
            grpc.StatusCode.UNAUTHENTICATED
        )
