"""Failed token checks per client address: a guessing flood is answered 429 for free.

Each made-up token used to cost a database read, and one scrypt hash when its id
named a real token (ids are not secret), and the request rate is per presented
token, so a client changing its token on each request was never limited. Now each
refused token takes one from its address's budget, and while that is spent a token
this process has not verified is answered 429 before any read or hash; tokens
already verified keep working from the same address.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from service import migrate
from service.access import Role
from service.app import create_app
from service.db import make_engine
from service.edge.failed_token_budget import MAX_ADDRESSES, FailedTokenBudget, address_key
from service.errors import RateLimited
from service.settings import Settings
from service.tokens import secrets, store

BURST = 5


@dataclass
class Costs:
    """What the token checks spent: scrypt verifications, and reads of a token's hash."""

    hashes: int = 0
    reads: int = 0


def count_costs(engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> Costs:
    costs = Costs()
    real = secrets.verify_secret

    def counted(secret: str, stored: str) -> bool:
        costs.hashes += 1
        return real(secret, stored)

    def on_statement(*args: Any) -> None:
        statement = args[2]
        if "secret_hash" in statement and "api_tokens" in statement:
            costs.reads += 1

    monkeypatch.setattr(secrets, "verify_secret", counted)
    sa.event.listen(engine, "before_cursor_execute", on_statement)
    return costs


@dataclass
class Guarded:
    client: TestClient
    engine: sa.Engine
    costs: Costs
    token_id: str
    token: str


def guarded(database_url: str, monkeypatch: pytest.MonkeyPatch, **limits: Any) -> Iterator[Guarded]:
    migrate.upgrade(database_url)
    engine = make_engine(database_url)
    record, token = store.create(engine, Role.VIEWER, name="dashboard")
    settings = Settings(database_url=database_url, insecure_dev=False, **limits)
    app = create_app(settings, background=False)
    with TestClient(app) as client:
        costs = count_costs(app.state.token_check.engine, monkeypatch)
        yield Guarded(client, engine, costs, record.id, token)
    engine.dispose()


@pytest.fixture
def service(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Guarded]:
    # Nothing comes back within a test.
    yield from guarded(
        database_url, monkeypatch, auth_failure_burst=BURST, auth_failures_per_s=0.001
    )


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_flood_of_made_up_tokens_is_answered_429_without_reads_or_hashes(
    service: Guarded,
) -> None:
    client, costs = service.client, service.costs
    assert client.get("/v1/nodes", headers=bearer(service.token)).status_code == 200
    costs.hashes = costs.reads = 0
    # A real id (ids are listed and audited) with a new secret each time: each one a read
    # and a hash before, and a new rate-limit bucket each time.
    answers = [
        client.get("/v1/nodes", headers=bearer(f"tpp_{service.token_id}_guess{n}"))
        for n in range(BURST + 20)
    ]
    assert [a.status_code for a in answers] == [401] * BURST + [429] * 20
    assert (costs.hashes, costs.reads) == (BURST, BURST)
    refused = answers[-1]
    assert refused.json()["error"]["code"] == "rate_limited"
    assert int(refused.headers["Retry-After"]) >= 1
    # Made-up ids and tokens of no known form are refused for free as well.
    for made_up in ["tpp_0123456789ab_x", "not-a-token-at-all-0123456789"]:
        assert client.get("/v1/nodes", headers=bearer(made_up)).status_code == 429
    assert (costs.hashes, costs.reads) == (BURST, BURST)


def test_a_verified_token_keeps_working_from_the_flooding_address(service: Guarded) -> None:
    client = service.client
    assert client.get("/v1/nodes", headers=bearer(service.token)).status_code == 200
    for n in range(BURST + 3):
        client.get("/v1/nodes", headers=bearer(f"tpp_{service.token_id}_guess{n}"))
    assert client.get("/v1/nodes", headers=bearer(service.token)).status_code == 200
    # A token not yet verified waits for the address's budget, as a guess would: the
    # process cannot tell it from one without a read and a hash.
    _, fresh = store.create(service.engine, Role.VIEWER, name="another")
    assert client.get("/v1/nodes", headers=bearer(fresh)).status_code == 429
    # Another address has a budget of its own.
    elsewhere = TestClient(client.app, client=("10.0.0.9", 40000))
    assert elsewhere.get("/v1/nodes", headers=bearer(fresh)).status_code == 200


def test_a_refused_token_presented_again_costs_nothing_more(service: Guarded) -> None:
    # A stale agent retrying its revoked token is told 401 from memory: not a new guess.
    wrong = bearer(f"tpp_{service.token_id}_stale")
    answers = [service.client.get("/v1/nodes", headers=wrong).status_code for _ in range(30)]
    assert answers == [401] * 30
    assert service.costs.hashes == 1
    assert service.client.get("/v1/nodes", headers=bearer(service.token)).status_code == 200


class Seconds:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_budget_refills(service: Guarded) -> None:
    clock = Seconds()
    check = service.client.app.state.token_check  # type: ignore[attr-defined]
    check.failures = FailedTokenBudget(rate=0.5, burst=2, clock=clock)
    guesses = [bearer(f"tpp_{service.token_id}_guess{n}") for n in range(6)]
    statuses = [service.client.get("/v1/nodes", headers=g).status_code for g in guesses[:3]]
    assert statuses == [401, 401, 429]
    assert service.client.get("/v1/nodes", headers=guesses[3]).headers["Retry-After"] == "2"
    clock.now += 2.0  # one failure back, at 0.5 a second
    statuses = [service.client.get("/v1/nodes", headers=g).status_code for g in guesses[4:]]
    assert statuses == [401, 429]
    assert service.costs.hashes == 3


def test_no_budget_when_the_rate_is_zero(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    limits = {"auth_failure_burst": 1, "auth_failures_per_s": 0}
    for service in guarded(database_url, monkeypatch, **limits):
        guesses = [bearer(f"tpp_{service.token_id}_guess{n}") for n in range(3)]
        assert [service.client.get("/v1/nodes", headers=g).status_code for g in guesses] == [
            401
        ] * 3


def test_the_budget_takes_refills_gives_back_and_says_when() -> None:
    clock = Seconds()
    budget = FailedTokenBudget(rate=0.5, burst=2, clock=clock)
    budget.take("10.0.0.1")
    budget.take("10.0.0.1")
    with pytest.raises(RateLimited) as refused:
        budget.take("10.0.0.1")
    assert refused.value.retry_after == 2 and refused.value.detail["burst"] == 2
    budget.take("10.0.0.2")  # another address
    clock.now += 2.0
    budget.take("10.0.0.1")  # one back after 2 s
    budget.give_back("10.0.0.1")  # its token was good after all
    budget.take("10.0.0.1")
    with pytest.raises(RateLimited):
        budget.take("10.0.0.1")


def test_an_ipv6_client_is_one_address_per_64() -> None:
    # One host holds a whole /64: counting each of its addresses apart would let it
    # guess on with a new one each time.
    assert address_key("2001:db8:1:2::1") == address_key("2001:db8:1:2:ffff::9")
    assert address_key("2001:db8:1:2::1") != address_key("2001:db8:1:3::1")
    assert address_key("10.0.0.1") != address_key("10.0.0.2")
    assert address_key("::ffff:10.0.0.1") == address_key("10.0.0.1")
    assert address_key(None) == address_key(None)
    assert address_key("testclient") != address_key(None)


def test_the_addresses_tracked_are_bounded() -> None:
    budget = FailedTokenBudget(rate=1.0, burst=1, clock=Seconds())
    for n in range(MAX_ADDRESSES + 50):
        budget.take(f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}")
    assert budget.tracked() == MAX_ADDRESSES
