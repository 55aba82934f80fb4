"""The pod watch gives GPUs back as soon as a pod is deleted or finishes, with no reconcile.

Every test runs the service's extender against the fake API server over
HTTP with the reconciler off (``reconcile_interval_s=0``): a release can
only come from the watch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, pod
from placement.profiles import build_profile
from service.k8s import pod_watch
from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_api_server import FakeApiServer
from tests.service.k8s.fixtures import live_app
from tests.waiting import wait_until


@pytest.fixture
def client(settings: Settings, clock: FakeClock, api: FakeApiServer) -> Iterator[TestClient]:
    with live_app(settings, clock, api) as client:
        add_nodes(client, ("hgx-h100", "h100-a"))
        _following(client)
        yield client


def _watcher(client: TestClient) -> Any:
    return client.app.state.k8s.watcher  # type: ignore[attr-defined]


def _following(client: TestClient) -> None:
    wait_until(lambda: _watcher(client).following, "the pod watch follows pods")


def _bind(client: TestClient, p: dict[str, Any], node: str = "h100-a") -> None:
    assert client.post("/k8s/v1/bind", json=binding_args(p, node)).json() == {"Error": ""}


def _state(client: TestClient, p: dict[str, Any]) -> str:
    (allocation,) = client.get("/v1/allocations", params={"job_id": p["metadata"]["uid"]}).json()[
        "allocations"
    ]
    state: str = allocation["state"]
    return state


def _released(client: TestClient, p: dict[str, Any]) -> None:
    wait_until(lambda: _state(client, p) == "released", f"{p['metadata']['name']} released")


def test_a_deleted_pod_gives_its_gpus_back(client: TestClient, api: FakeApiServer):
    p = api.add(pod("trainer", 4))
    _bind(client, p)
    assert _state(client, p) == "active"
    api.delete("ml-team", "trainer")
    _released(client, p)
    assert len(client.get("/v1/nodes/h100-a").json()["free_gpus"]) == 8


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_pod_gives_its_gpus_back(client: TestClient, api: FakeApiServer, phase: str):
    p = api.add(pod("job", 2))
    _bind(client, p)
    api.set_phase("ml-team", "job", "Running")
    api.set_phase("ml-team", "job", phase)
    _released(client, p)


def test_a_pod_the_kubelets_truth_gave_gpus_gives_them_back_when_deleted(
    client: TestClient, api: FakeApiServer
):
    # Bound by hand (no extender, no topoplace annotation): its allocation comes from
    # the device plugin's report of what the kubelet gave it.
    manual = pod("manual", 2)
    manual["spec"]["nodeName"] = "h100-a"
    manual["status"]["startTime"] = "2026-11-29T10:21:09Z"  # its kubelet started it
    api.add(manual)
    devices = [g.uuid for g in build_profile("hgx-h100", "h100-a").gpus][:2]
    report = {"namespace": "ml-team", "name": "manual", "devices": devices}
    answer = client.post(
        "/v1/nodes/h100-a/k8s/devices", json={"resource": "nvidia.com/gpu", "pods": [report]}
    )
    assert answer.json()["outcomes"][0]["action"] == "created", answer.text
    assert _state(client, manual) == "active"
    api.delete("ml-team", "manual")
    _released(client, manual)


def test_pods_that_hold_nothing_are_not_followed(client: TestClient, api: FakeApiServer):
    api.add(pod("web", 0))
    keep = api.add(pod("kept", 2))
    _bind(client, keep)
    wait_until(lambda: len(_watcher(client).pods) == 1, "the bound pod followed")
    api.delete("ml-team", "web")
    assert _state(client, keep) == "active"


def test_a_watch_broken_off_and_expired_lists_again(client: TestClient, api: FakeApiServer):
    p = api.add(pod("trainer", 4))
    _bind(client, p)
    wait_until(lambda: len(_watcher(client).pods) == 1, "the bound pod followed")
    api.refuse = True
    api.break_watches()  # mid-stream: the watcher tries again, and is refused
    wait_until(lambda: _watcher(client).error, "the watcher notices")
    api.delete("ml-team", "trainer")  # while nobody watches ...
    api.compact()  # ... and the history it would resume from is gone
    api.refuse = False
    _released(client, p)  # found gone by the second list
    assert api.count("GET", "/api/v1/pods?limit=") == 2
    assert _watcher(client).lists == 2


@pytest.mark.parametrize(
    ("kind", "garbage"),
    [
        ("MODIFIED", "not a pod"),
        ("ADDED", ["a", "list"]),
        ("DELETED", {"metadata": "a string"}),
        ("", ["not", "an", "event"]),
    ],
)
def test_a_malformed_event_does_not_stop_the_watch(
    client: TestClient, api: FakeApiServer, kind: str, garbage: Any
):
    p = api.add(pod("trainer", 4))
    _bind(client, p)
    wait_until(lambda: len(_watcher(client).pods) == 1, "the bound pod followed")
    api.send_raw(kind, garbage)
    api.delete("ml-team", "trainer")
    _released(client, p)
    assert client.get("/readyz").json()["kubernetes"]["watch"] == "following"


def test_a_failure_on_an_event_lists_again_and_follows_on(
    client: TestClient, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch
):
    p = api.add(pod("trainer", 4))
    _bind(client, p)
    wait_until(lambda: len(_watcher(client).pods) == 1, "the bound pod followed")
    failed: list[dict[str, Any]] = []

    def fails_once(obj: dict[str, Any]) -> pod_watch.Followed | None:
        if not failed:
            failed.append(obj)
            raise RuntimeError("nothing this module expected")
        return real(obj)

    real = pod_watch.followed
    monkeypatch.setattr(pod_watch, "followed", fails_once)
    api.add(pod("web", 0))  # the event the watcher fails on
    wait_until(lambda: _watcher(client).lists == 2, "the watcher listed again")
    api.delete("ml-team", "trainer")
    _released(client, p)


def test_bookmarks_keep_a_resumed_watch_from_listing_again(client: TestClient, api: FakeApiServer):
    p = api.add(pod("trainer", 4))
    _bind(client, p)
    api.bump(50)  # other objects changed: no pod event carries the version
    api.bookmark()
    wait_until(
        lambda: _watcher(client).resource_version == str(api.version), "the bookmark's version"
    )
    api.compact()
    api.break_watches()
    wait_until(lambda: api.count("GET", "/api/v1/pods?watch=") >= 2, "the watch resumed")
    api.delete("ml-team", "trainer")
    _released(client, p)
    assert _watcher(client).lists == 1  # resumed from the bookmark, not listed again


def test_an_unreachable_api_server_shows_on_readyz(client: TestClient, api: FakeApiServer):
    assert client.get("/readyz").json()["kubernetes"]["watch"] == "following"
    api.refuse = True
    api.break_watches()
    detail = wait_until(
        lambda: (d := client.get("/readyz").json()["kubernetes"])["watch"] == "unreachable" and d,
        "readyz says the API server is unreachable",
    )
    assert detail["error"] == "HTTP 503: the server is shutting down"
    api.refuse = False
    wait_until(lambda: client.get("/readyz").json()["kubernetes"]["watch"] == "following", "back")


RING = {"topoplace.io/gang": "ring", "topoplace.io/gang-size": "2"}


def test_a_gang_is_released_when_its_last_member_is_gone(client: TestClient, api: FakeApiServer):
    members = [api.add(pod(f"ring-{i}", 4, annotations=RING)) for i in range(2)]
    for m in members:
        _bind(client, m)
    gang = {"job_id": "k8s-gang:ml-team/ring"}
    (reserved,) = client.get("/v1/allocations", params=gang).json()["allocations"]
    api.delete("ml-team", "ring-0")
    wait_until(lambda: len(_watcher(client).pods) == 1, "ring-0 gone")
    assert client.get(f"/v1/allocations/{reserved['id']}").json()["state"] == "active"
    api.set_phase("ml-team", "ring-1", "Succeeded")
    wait_until(
        lambda: client.get(f"/v1/allocations/{reserved['id']}").json()["state"] == "released",
        "the gang's reservation released",
    )


def test_a_gang_member_deleted_and_recreated_takes_its_task_again(
    client: TestClient, api: FakeApiServer
):
    first = api.add(pod("ring-0", 4, annotations=RING))
    api.add(pod("ring-1", 4, annotations=RING))
    _bind(client, first)
    api.delete("ml-team", "ring-0")
    wait_until(lambda: len(_watcher(client).pods) == 1, "ring-0 gone")
    again = api.add(pod("ring-0", 4, annotations=RING))  # a new UID: the controller made it again
    _bind(client, again)
    assert api.pod("ml-team", "ring-0")["metadata"]["annotations"]["topoplace.io/gang-task"]


def test_a_member_bound_while_the_watch_lags_keeps_its_gang(client: TestClient, api: FakeApiServer):
    # The watch is behind the API server: ring-0's DELETED reaches it after ring-1,
    # made after that deletion, has already bound onto the gang's reservation.
    first = api.add(pod("ring-0", 4, annotations=RING))
    _bind(client, first)
    gang = {"job_id": "k8s-gang:ml-team/ring"}
    (reserved,) = client.get("/v1/allocations", params=gang).json()["allocations"]
    wait_until(lambda: len(_watcher(client).pods) == 1, "ring-0 followed")
    api.stall_watches()
    api.delete("ml-team", "ring-0")
    late = api.add(pod("ring-1", 4, annotations=RING))
    _bind(client, late)
    assert (
        api.pod("ml-team", "ring-1")["metadata"]["annotations"]["topoplace.io/allocation"]
        == reserved["id"]
    )
    api.resume_watches()
    wait_until(
        lambda: _watcher(client).resource_version == str(api.version) and _watcher(client).ends,
        "the watch caught up",
    )
    state = client.get(f"/v1/allocations/{reserved['id']}").json()["state"]
    assert state == "active", "ring-1 runs on the gang's GPUs: they stay held"
    api.delete("ml-team", "ring-1")
    wait_until(
        lambda: client.get(f"/v1/allocations/{reserved['id']}").json()["state"] == "released",
        "released with its last member",
    )


def test_two_replicas_release_once(
    settings: Settings, clock: FakeClock, api: FakeApiServer
) -> None:
    with live_app(settings, clock, api) as one, live_app(settings, clock, api) as two:
        add_nodes(one, ("hgx-h100", "h100-a"))
        _following(one)
        _following(two)
        p = api.add(pod("trainer", 4))
        _bind(one, p)
        wait_until(lambda: len(_watcher(two).pods) == 1, "both replicas follow the pod")
        api.delete("ml-team", "trainer")
        _released(one, p)
        wait_until(
            lambda: _watcher(one).ends == _watcher(two).ends == 1,
            "both replicas saw it end",
        )
        assert _watcher(one).released + _watcher(two).released == 1


def test_the_reconciler_counts_what_the_watch_missed(
    settings: Settings, clock: FakeClock, api: FakeApiServer
) -> None:
    # A reservation whose pod no watch ever saw (its bind never reached the pod).
    with live_app(settings, clock, api, reconcile_interval_s=0.1, reconcile_grace_s=0) as client:
        add_nodes(client, ("hgx-h100", "h100-a"))
        orphan = {"gpus": 2, "owner": "k8s-pod:ml-team/lost", "job_id": "no-such-uid"}
        assert client.post("/v1/place", json=orphan).status_code == 201
        fixed = wait_until(
            lambda: client.get("/readyz").json()["kubernetes"]["reconciled"]["fixed"],
            "the reconciler fixed it",
        )
        assert fixed == 1
        assert _watcher(client).released == 0
