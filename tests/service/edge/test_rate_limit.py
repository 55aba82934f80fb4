"""The request rate per token (per client address without one), on REST and gRPC."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from fastapi.testclient import TestClient

from service import auth
from service.app import create_app
from service.edge.rate_limit import MAX_BUCKETS, RateLimiter, caller_key
from service.errors import RateLimited
from service.grpc.gen import topoplace_pb2 as pb
from service.settings import Settings
from service.tokens import presented
from tests.service.conftest import FakeClock
from tests.service.grpc.conftest import Running, details, reason, start

# Static admin tokens (long enough to be accepted: a short one is refused at start).
TOKEN_A = "rate-limit-token-a-0123456789"
TOKEN_B = "rate-limit-token-b-0123456789"
TOKENS = f"{TOKEN_A},{TOKEN_B}"


class Seconds:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_holds_the_burst_and_refills_at_the_rate() -> None:
    clock = Seconds()
    limiter = RateLimiter(rate=2.0, burst=3, clock=clock)
    key = caller_key("Bearer a", None)
    assert [limiter.take(key) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take(key) == pytest.approx(0.5)  # one request back in half a second
    clock.now += 0.5
    assert limiter.take(key) == 0.0
    clock.now += 100  # refilled, never above the burst
    assert [limiter.take(key) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take(key) > 0
    # Another token, or an address without one, has a bucket of its own.
    assert limiter.take(caller_key("Bearer b", None)) == 0.0
    assert limiter.take(caller_key(None, "10.0.0.1")) == 0.0


def test_the_retry_after_is_whole_seconds_until_a_request_is_back() -> None:
    clock = Seconds()
    limiter = RateLimiter(rate=0.25, burst=1, clock=clock)
    limiter.check("Bearer a", None)
    with pytest.raises(RateLimited) as refused:
        limiter.check("Bearer a", None)
    assert refused.value.retry_after == 4 and refused.value.status == 429


def test_the_buckets_are_bounded() -> None:
    limiter = RateLimiter(rate=1.0, burst=1, clock=Seconds())
    for n in range(MAX_BUCKETS + 50):
        limiter.take(caller_key(f"Bearer made-up-{n}", None))
    assert len(limiter._buckets) == MAX_BUCKETS


@pytest.fixture
def limited(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    path = tmp_path_factory.mktemp("rate") / "rate.sqlite3"
    return Settings(
        database_url=f"sqlite:///{path}",
        api_tokens=TOKENS,
        insecure_dev=False,  # a caller without a token is refused, and counted
        rate_limit_per_s=0.001,  # nothing comes back within a test
        rate_limit_burst=3,
    )


def test_rest_answers_429_with_retry_after_per_token(limited: Settings) -> None:
    with TestClient(create_app(limited, background=False)) as client:
        a = {"Authorization": f"Bearer {TOKEN_A}"}
        b = {"Authorization": f"Bearer {TOKEN_B}"}
        assert [client.get("/v1/nodes", headers=a).status_code for _ in range(3)] == [200] * 3
        refused = client.get("/v1/nodes", headers=a)
        assert refused.status_code == 429
        assert int(refused.headers["Retry-After"]) >= 1
        error = refused.json()["error"]
        assert error["code"] == "rate_limited" and error["detail"]["burst"] == 3
        assert client.get("/v1/nodes", headers=b).status_code == 200  # its own bucket
        # The probes are never limited.
        assert all(client.get("/healthz").status_code == 200 for _ in range(10))
        assert all(client.get("/readyz").status_code == 200 for _ in range(10))


def test_rest_without_a_token_is_limited_per_address(limited: Settings) -> None:
    with TestClient(create_app(limited, background=False)) as client:
        # Refused by the token check, but counted: guessing tokens is limited too.
        assert [client.get("/v1/nodes").status_code for _ in range(3)] == [401] * 3
        assert client.get("/v1/nodes").status_code == 429


def test_no_limit_when_the_rate_is_zero(tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.mktemp("rate") / "off.sqlite3"
    settings = Settings(database_url=f"sqlite:///{path}", rate_limit_per_s=0, rate_limit_burst=1)
    with TestClient(create_app(settings, background=False)) as client:
        assert all(client.get("/v1/nodes").status_code == 200 for _ in range(20))


@pytest.fixture
def running(limited: Settings) -> Iterator[Running]:
    yield from start(limited, FakeClock())


def test_grpc_shares_the_limit_and_answers_resource_exhausted(running: Running) -> None:
    metadata = (("authorization", f"Bearer {TOKEN_A}"),)
    for _ in range(3):
        running.stub.ListNodes(pb.ListNodesRequest(), metadata=metadata)
    with pytest.raises(grpc.RpcError) as refused:
        running.stub.ListNodes(pb.ListNodesRequest(), metadata=metadata)
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert reason(refused.value) == "rate_limited"
    assert details(refused.value)["RetryInfo"].retry_delay.seconds >= 1  # type: ignore[attr-defined]
    # The same token over REST has used its bucket up too.
    limited = running.rest.get("/v1/nodes", headers={"Authorization": f"Bearer {TOKEN_A}"})
    assert limited.status_code == 429


def spellings(token: str) -> list[str]:
    """Spellings of one header the token check reads as the same token (as gRPC metadata
    may carry them too): the scheme in any case, any run of spaces before the token,
    spaces after it. There is no end to them: one more space is one more."""
    out = [f"{scheme} {token}" for scheme in ("Bearer", "bearer", "BEARER", "bEaReR")]
    out += [f"Bearer{' ' * n}{token}" for n in range(2, 8)]
    out += [f"Bearer {token}{' ' * n}" for n in range(1, 4)]
    return [*out, f"bearer   {token}  "]


def codes(client: TestClient, headers: list[str]) -> list[int]:
    return [client.get("/v1/nodes", headers={"Authorization": h}).status_code for h in headers]


def test_every_spelling_is_one_the_token_check_accepts(limited: Settings) -> None:
    unlimited = limited.model_copy(update={"rate_limit_per_s": 0})
    with TestClient(create_app(unlimited, background=False)) as client:
        ways = [*spellings(TOKEN_A), f"Bearer {TOKEN_A}\t"]
        assert codes(client, ways) == [200] * len(ways)


def test_rest_one_token_spelled_many_ways_shares_one_bucket(limited: Settings) -> None:
    """A token's rate is its rate, however its header is spelled: a client alternating
    spellings the token check accepts got a new bucket for each, without end."""
    with TestClient(create_app(limited, background=False)) as client:
        ways = [*spellings(TOKEN_A), f"Bearer {TOKEN_A}\t"]
        assert codes(client, ways[:3]) == [200] * 3  # the burst
        assert codes(client, ways) == [429] * len(ways)  # over it, however spelled
        # Another token keeps its own bucket, however spelled too.
        assert codes(client, [f"bearer  {TOKEN_B}", f"Bearer {TOKEN_B} "]) == [200, 200]


def test_rest_a_header_naming_no_token_counts_against_the_address(limited: Settings) -> None:
    """Headers the token check refuses unread (no Bearer token in them) are the address's,
    as no header is: a client making up a new one each time gets no new bucket."""
    with TestClient(create_app(limited, background=False)) as client:
        assert codes(client, ["Basic abc", "Bearer", "Token x"]) == [401] * 3
        assert codes(client, ["Basic abcd", "Bearer  "]) == [429] * 2
        assert client.get("/v1/nodes").status_code == 429  # no header: the same bucket
        assert codes(client, [f"Bearer {TOKEN_A}"]) == [200]  # a token: its own


def count_digests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every hash of a token by the rate limit or the token check, from now on."""
    hashed: list[str] = []
    digest = presented.digest

    def counting(token: str) -> bytes:
        hashed.append(token)
        return digest(token)

    # The token check's own name for it, and the one the rate limit's reading calls.
    monkeypatch.setattr(auth, "_digest", counting)
    monkeypatch.setattr(presented, "digest", counting)
    return hashed


def test_rest_a_known_token_is_hashed_once_a_request(
    limited: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rate limit and the token check key on one digest, made once: the limit costs
    the token check nothing more than it did."""
    with TestClient(create_app(limited, background=False)) as client:
        hashed = count_digests(monkeypatch)
        assert codes(client, [f"bearer  {TOKEN_A} "]) == [200]
        assert hashed == [TOKEN_A]
