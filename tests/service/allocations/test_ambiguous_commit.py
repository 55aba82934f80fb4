"""A commit whose answer is lost: Postgres committed, the service's connection died before
it heard so. The reservation exists; the caller and memory must say so too."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from placement.profiles import build_profile
from service import migrate, schema
from service.allocations import api
from service.allocations.group_commit import GroupCommitter
from service.app import create_app
from service.settings import Settings
from tests.service.allocations.test_group_commit import _holders, _row
from tests.service.commit_cut import CommitCut
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes, report


@pytest.fixture
def cut_app(doomed_database: tuple[str, sa.Engine]) -> Iterator[tuple[TestClient, CommitCut, str]]:
    url = sa.make_url(doomed_database[0])
    with CommitCut(url.host or "127.0.0.1", url.port or 5432) as cut:
        through = url.set(host="127.0.0.1", port=cut.port).render_as_string(hide_password=False)
        settings = Settings(database_url=through, heartbeat_ttl_s=60, reservation_ttl_s=120)
        app = create_app(settings, clock=FakeClock(), background=False)
        with TestClient(app) as client:
            add_nodes(client, ("hgx-h100", "h0"))
            yield client, cut, doomed_database[0]


def _live(url: str) -> list[tuple[str, int]]:
    """(allocation id, GPUs it holds) of every live allocation, read past the proxy."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.select(schema.gpu_holds.c.allocation_id, sa.func.count())
                .where(schema.gpu_holds.c.allocation_id.is_not(None))
                .group_by(schema.gpu_holds.c.allocation_id)
            ).all()
    finally:
        engine.dispose()
    return sorted((str(a), int(n)) for a, n in rows)


def _landed_unanswered_once(
    monkeypatch: pytest.MonkeyPatch, committer: GroupCommitter
) -> list[int]:
    """The committer's look-up of whether a batch landed fails once (the database gone a
    moment), then answers; the sizes of the batches it was asked about."""
    landed = committer.writer.landed
    asked: list[int] = []

    def unreachable_once(ids: list[str]) -> bool:
        asked.append(len(ids))
        if len(asked) == 1:
            raise sa.exc.OperationalError("SELECT", {}, Exception("gone a moment"))
        return bool(landed(ids))

    monkeypatch.setattr(committer.writer, "landed", unreachable_once)
    return asked


def _free(client: TestClient) -> int:
    return len(client.get("/v1/nodes/h0").json()["free_gpus"])


@pytest.mark.parametrize("key", [None, "job-7-try"])
def test_a_reservation_whose_commit_answer_was_lost_is_answered_as_made(
    cut_app: tuple[TestClient, CommitCut, str], key: str | None
) -> None:
    """Was: 503 database_unavailable while the database held all 8 GPUs for the
    reservation, and memory showed the 8 free (until the next resync, 30 s); the client's
    retry without a key reserved again, 2 reservations for one job."""
    client, cut, url = cut_app
    cut.arm()
    headers = {} if key is None else {"Idempotency-Key": key}
    response = client.post("/v1/place", json={"gpus": 8, "job_id": "j7"}, headers=headers)
    assert cut.dropped == 1
    live = _live(url)
    assert response.status_code == 201, response.text
    assert live == [(response.json()["id"], 8)]
    assert _free(client) == 0  # memory says what the database holds


def test_a_write_at_once_whose_commit_answer_was_lost_is_not_written_again(
    doomed_database: tuple[str, sa.Engine],
) -> None:
    """The Kubernetes bind's write on its worker thread, through the kept connection. Was:
    the lost connection sent the reservation to the queue, whose write met its own
    committed rows and raised IntegrityError for a reservation that was made."""
    url = sa.make_url(doomed_database[0])
    migrate.upgrade(doomed_database[0])
    with CommitCut(url.host or "127.0.0.1", url.port or 5432) as cut:
        through = url.set(host="127.0.0.1", port=cut.port).render_as_string(hide_password=False)
        engine = sa.create_engine(through)
        committer = GroupCommitter(engine)
        try:
            committer.commit(_row("g0"), [("n0", "g0", "gpu")], ["n0"], at_once=True)
            cut.arm()
            row = _row("g1")
            committer.commit(row, [("n0", "g1", "gpu")], ["n0"], at_once=True)
            assert cut.dropped == 1
            assert committer.at_once == 2 and committer._thread is None  # never queued
            assert str(row["id"]) in [a for a, _ in _live(doomed_database[0])]
            assert _holders(engine) == ["g0", "g1"]
        finally:
            committer.stop()
            engine.dispose()


def test_a_release_whose_commit_answer_was_lost_frees_the_gpus_in_memory_too(
    cut_app: tuple[TestClient, CommitCut, str],
) -> None:
    """Was: 503, the database had released all 8 GPUs while memory still held them, and
    the client's retry (200, nothing more to release) left them so: /place of 8 GPUs
    answered 409 nothing fits until the next resync (30 s). And no `released` event
    ever: the release answered 503, its retry changed nothing."""
    client, cut, url = cut_app
    placed = client.post("/v1/place", json={"gpus": 8})
    assert placed.status_code == 201, placed.text
    allocation = placed.json()["id"]
    cut.arm()
    released = client.post(f"/v1/allocations/{allocation}/release")
    assert cut.dropped == 1
    assert _live(url) == []
    assert released.status_code == 200, released.text
    assert released.json()["released"] == [allocation]
    retried = client.post(f"/v1/allocations/{allocation}/release")
    assert retried.status_code == 200, retried.text
    assert retried.json()["released"] == []
    assert _free(client) == 8
    again = client.post("/v1/place", json={"gpus": 8})
    assert again.status_code == 201, again.text


def test_an_uncordon_whose_commit_answer_was_lost_lets_placements_in(
    cut_app: tuple[TestClient, CommitCut, str],
) -> None:
    """Was: 503, the node stored uncordoned, memory still cordoned: /place answered 409
    until a retried uncordon or the next resync (30 s)."""
    client, cut, _ = cut_app
    assert client.post("/v1/nodes/h0/cordon").status_code == 200
    cut.arm()
    uncordoned = client.post("/v1/nodes/h0/uncordon")
    assert cut.dropped == 1
    assert uncordoned.status_code in (200, 503), uncordoned.text
    assert client.get("/v1/nodes/h0").json()["state"] == "ready"
    placed = client.post("/v1/place", json={"gpus": 8})
    assert placed.status_code == 201, placed.text


def test_a_snapshot_whose_commit_answer_was_lost_is_what_memory_shows(
    cut_app: tuple[TestClient, CommitCut, str],
) -> None:
    """Was: 503, the database stored the new snapshot (GPU 0 unhealthy) while memory kept
    the old one and listed GPU 0 free until a retried report or the next resync (30 s)."""
    client, cut, _ = cut_app
    snap = build_profile("hgx-h100", "h0")
    gpus = [g.model_copy(update={"health": "unhealthy"}) if g.index == 0 else g for g in snap.gpus]
    cut.arm()
    reported = report(client, snap.model_copy(update={"seq": snap.seq + 1, "gpus": gpus}))
    assert cut.dropped == 1
    assert reported.status_code in (200, 503), reported.text
    assert 0 not in client.get("/v1/nodes/h0").json()["free_gpus"]


def test_a_write_at_once_of_unknown_outcome_meeting_its_own_rows_in_the_queue_is_made(
    doomed_database: tuple[str, sa.Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The COMMIT answer lost and the database unable to say at once whether the rows
    landed: the queue writes the reservation again and meets its own rows. Was:
    IntegrityError, a lost race, for the reservation that was made (a keyless caller
    then reserved again)."""
    url = sa.make_url(doomed_database[0])
    migrate.upgrade(doomed_database[0])
    with CommitCut(url.host or "127.0.0.1", url.port or 5432) as cut:
        through = url.set(host="127.0.0.1", port=cut.port).render_as_string(hide_password=False)
        engine = sa.create_engine(through)
        committer = GroupCommitter(engine)
        asked = _landed_unanswered_once(monkeypatch, committer)
        try:
            cut.arm()
            row = _row("g0")
            committer.commit(row, [("n0", "g0", "gpu")], ["n0"], at_once=True)
            assert cut.dropped == 1 and asked == [1, 1]
            assert [a for a, _ in _live(doomed_database[0])] == [str(row["id"])]
        finally:
            committer.stop()
            engine.dispose()


def test_a_confirm_whose_commit_answer_was_lost_is_answered_as_made(
    cut_app: tuple[TestClient, CommitCut, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: 503 for a confirm that had happened; the retry answered it confirmed before,
    unchanged, so no `confirmed` event was ever published."""
    client, cut, _ = cut_app
    placed = client.post("/v1/place", json={"gpus": 8})
    assert placed.status_code == 201, placed.text
    allocation = placed.json()["id"]
    hub = client.app.state.service.events  # type: ignore[attr-defined]
    published: list[str] = []
    monkeypatch.setattr(hub, "publish", lambda kind, type_, **_: published.append(type_))
    cut.arm()
    confirmed = client.post(f"/v1/allocations/{allocation}/confirm")
    assert cut.dropped == 1
    assert confirmed.status_code == 200, confirmed.text
    assert confirmed.json()["state"] == "active"
    again = client.post(f"/v1/allocations/{allocation}/confirm")
    assert again.status_code == 200 and again.json()["state"] == "active"
    assert published == ["confirmed"]


def test_a_job_release_whose_commit_answer_was_lost_is_answered_as_made(
    cut_app: tuple[TestClient, CommitCut, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Slurm epilog's release of its job (POST /v1/jobs/{id}/release), as for the release
    of one allocation. Was: 503 for a release that had happened; the epilog's retry
    answered released: [] and no `released` event was ever published."""
    client, cut, url = cut_app
    placed = client.post("/v1/place", json={"gpus": 8, "job_id": "j7"})
    assert placed.status_code == 201, placed.text
    hub = client.app.state.service.events  # type: ignore[attr-defined]
    published: list[str] = []
    monkeypatch.setattr(
        hub, "unwatched", lambda kind, type_, count, ended=(): published.extend([type_] * count)
    )
    cut.arm()
    released = client.post("/v1/jobs/j7/release")
    assert cut.dropped == 1
    assert _live(url) == []
    assert released.status_code == 200, released.text
    assert released.json()["released"] == [placed.json()["id"]]
    retried = client.post("/v1/jobs/j7/release")
    assert retried.status_code == 200 and retried.json()["released"] == []
    assert published == ["released"]
    assert _free(client) == 8


def test_an_attach_whose_commit_answer_was_lost_is_answered_as_made(
    cut_app: tuple[TestClient, CommitCut, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job id given to a reservation (a pending Slurm job naming it, the reconcile
    loop). Was: the lost answer raised for a change that had committed, and the next
    try found the job id there already: attached nothing, and no `attached` event was
    ever published."""
    client, cut, _ = cut_app
    placed = client.post("/v1/place", json={"gpus": 8})
    assert placed.status_code == 201, placed.text
    allocation = placed.json()["id"]
    state = client.app.state.service  # type: ignore[attr-defined]
    published: list[str] = []
    monkeypatch.setattr(
        state.events,
        "unwatched",
        lambda kind, type_, count, ended=(): published.extend([type_] * count),
    )
    cut.arm()
    attached = api.attach(state, [allocation], "j9")
    assert cut.dropped == 1
    assert attached == (allocation,)
    assert api.attach(state, [allocation], "j9") == ()
    assert published == ["attached"]
    assert client.get(f"/v1/allocations/{allocation}").json()["job_id"] == "j9"


def test_a_queued_reservation_of_unknown_outcome_is_written_again_not_refused(
    cut_app: tuple[TestClient, CommitCut, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group committer's write (REST /place) whose COMMIT answer was lost, the
    database unable to say at once whether it landed: written again, it meets its own
    rows and is answered as made, as a write at once is. Was: 503 while the database
    held all 8 GPUs for it, and the client's retry without a key found nothing free: a
    second reservation wherever it fitted, the first pending for its TTL."""
    client, cut, url = cut_app
    committer = client.app.state.service.committer  # type: ignore[attr-defined]
    _landed_unanswered_once(monkeypatch, committer)
    cut.arm()
    response = client.post("/v1/place", json={"gpus": 8, "job_id": "j8"})
    assert cut.dropped == 1
    assert response.status_code == 201, response.text
    assert _live(url) == [(response.json()["id"], 8)]
    assert _free(client) == 0


@pytest.mark.parametrize("verb", ["confirm", "extend"])
def test_a_late_confirm_whose_expiry_commit_answer_was_lost_is_answered_expired(
    cut_app: tuple[TestClient, CommitCut, str], monkeypatch: pytest.MonkeyPatch, verb: str
) -> None:
    """A confirm or extend that found the TTL passed expires the reservation in its own
    transaction; that commit's answer lost. Was: 503, and the retry answered 409 expired
    for an expiry nobody was told of: no `expired` event was ever published."""
    client, cut, url = cut_app
    state = client.app.state.service  # type: ignore[attr-defined]
    placed = client.post("/v1/place", json={"gpus": 8, "ttl_s": 10})
    assert placed.status_code == 201, placed.text
    allocation = placed.json()["id"]
    published: list[str] = []
    monkeypatch.setattr(state.events, "publish", lambda kind, type_, **_: published.append(type_))
    state.clock.advance(11)
    cut.arm()
    body = {"ttl_s": 30} if verb == "extend" else None
    late = client.post(f"/v1/allocations/{allocation}/{verb}", json=body)
    assert cut.dropped == 1
    assert _live(url) == []
    assert late.status_code == 409, late.text
    assert "expired" in late.json()["error"]["message"]
    assert published == ["expired"]
    assert _free(client) == 8
