"""The request rate per token over gRPC (service/grpc/rate_limit.py): one bucket per token
however its ``authorization`` metadata is spelled, shared with REST's."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from service.access import Role
from service.db import make_engine
from service.grpc.gen import topoplace_pb2 as pb
from service.settings import Settings
from service.tokens import store
from tests.service.edge.test_rate_limit import count_digests, spellings
from tests.service.grpc.conftest import Running, reason, start

BURST = 3


@pytest.fixture
def running(settings: Settings) -> Iterator[Running]:
    limits = {
        "insecure_dev": False,
        "api_tokens": "grpc-rate-static-0123456789abcdef",
        "rate_limit_per_s": 0.001,  # nothing comes back within a test
        "rate_limit_burst": BURST,
    }
    yield from start(settings.model_copy(update=limits))


def code_of(running: Running, authorization: str) -> grpc.StatusCode:
    try:
        running.stub.ListNodes(pb.ListNodesRequest(), metadata=(("authorization", authorization),))
    except grpc.RpcError as error:
        assert error.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED or (
            reason(error) == "rate_limited"
        )
        return error.code()
    return grpc.StatusCode.OK


def test_one_token_spelled_many_ways_shares_one_bucket(running: Running) -> None:
    engine = make_engine(running.state.settings.database_url)
    _, token = store.create(engine, Role.VIEWER, name="dashboard")
    ways = spellings(token)
    assert [code_of(running, w) for w in ways[:BURST]] == [grpc.StatusCode.OK] * BURST
    over = [code_of(running, w) for w in ways]
    assert over == [grpc.StatusCode.RESOURCE_EXHAUSTED] * len(ways)
    # Over REST too: the buckets are shared, keyed alike.
    refused = running.rest.get("/v1/nodes", headers={"Authorization": f"bearer   {token}"})
    assert refused.status_code == 429
    # Another token has its own bucket.
    other = "bearer  grpc-rate-static-0123456789abcdef"
    assert code_of(running, other) is grpc.StatusCode.OK


def test_a_known_token_is_hashed_once_a_call(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interceptors share the digest the rate limit made: one hash a call."""
    engine = make_engine(running.state.settings.database_url)
    _, token = store.create(engine, Role.VIEWER, name="dashboard")
    assert code_of(running, f"Bearer {token}") is grpc.StatusCode.OK  # verified: now known
    hashed = count_digests(monkeypatch)
    assert code_of(running, f"BEARER   {token}") is grpc.StatusCode.OK
    assert hashed == [token]


def test_metadata_naming_no_token_gets_no_bucket_of_its_own(running: Running) -> None:
    made_up = ["Basic a", "Token b", "Bearer", "Basic c", "Digest d"]
    codes = [code_of(running, m) for m in made_up]
    unauthenticated = grpc.StatusCode.UNAUTHENTICATED
    assert codes == [unauthenticated] * BURST + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2
