"""The kubelet's truth, reported to a replica whose memory of the node is behind.

Another replica may have stored a newer snapshot of the node (a GPU replaced by
another card, a GPU's MIG instances made again): a device report naming a device
the database no longer has is refused as on any replica, never recorded as a hold
on a device that is gone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from fastapi.testclient import TestClient

from bench.k8s_objects import pod
from placement import NodeSnapshot
from service import schema
from service.app import create_app
from service.k8s.settings import ExtenderSettings
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes, report
from tests.service.k8s.fake_kube import FakeKubeApi

NODE = "h100-a"
NEW = "GPU-00000000-0000-0000-0000-0000000000aa"
MIG_NODE = "mig-b"
MIG_NEW = "MIG-00000000-0000-0000-0000-0000000000cc"


def _on_node(p: dict[str, Any], node: str) -> dict[str, Any]:
    """``p`` as bound to ``node`` by hand and started by its kubelet."""
    p["spec"]["nodeName"] = node
    p["status"]["startTime"] = "2026-11-29T10:21:09Z"
    return p


@contextlib.contextmanager
def _replica(settings: Settings, clock: FakeClock, kube: FakeKubeApi) -> Iterator[TestClient]:
    """A second replica on the same database, without a background loop: it hears of
    no other replica's change."""
    app = create_app(settings, clock=clock, background=False)
    app.state.k8s_settings = ExtenderSettings(reconcile_interval_s=0)
    app.state.k8s_api = kube
    with TestClient(app) as client:
        yield client


def _held(client: TestClient) -> set[str]:
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    with state.engine.connect() as conn:
        rows = conn.execute(sa.select(schema.gpu_holds.c.device)).all()
    return {str(device) for (device,) in rows}


def test_a_gpu_gone_from_the_stored_snapshot_is_not_held_through_a_replica_behind(
    k8s_client: TestClient, settings: Settings, clock: FakeClock, kube: FakeKubeApi
) -> None:
    (snap,) = add_nodes(k8s_client, ("hgx-h100", NODE))
    with _replica(settings, clock, kube) as behind:
        _refused_behind(k8s_client, behind, kube, snap)


def _refused_behind(
    k8s_client: TestClient, behind: TestClient, kube: FakeKubeApi, snap: NodeSnapshot
) -> None:
    old = snap.gpus[0].uuid
    gpus = [g.model_copy(update={"uuid": NEW}) if g.index == 0 else g for g in snap.gpus]
    replaced: NodeSnapshot = snap.model_copy(update={"seq": snap.seq + 1, "gpus": gpus})
    answer = report(k8s_client, replaced)  # through the first replica
    assert answer.status_code == 200, answer.text
    kube.add(_on_node(pod("manual", 1), NODE))
    body = {
        "resource": "nvidia.com/gpu",
        "pods": [{"namespace": "ml-team", "name": "manual", "devices": [old]}],
    }
    answer = behind.post(f"/v1/nodes/{NODE}/k8s/devices", json=body)
    assert answer.status_code == 400, answer.text
    assert old in answer.json()["error"]["message"]
    assert _held(behind) == set()


def test_a_mig_instance_gone_from_the_stored_snapshot_is_not_held_through_a_replica_behind(
    k8s_client: TestClient, settings: Settings, clock: FakeClock, kube: FakeKubeApi
) -> None:
    (snap,) = add_nodes(k8s_client, ("dgx-a100-mig", MIG_NODE))
    with _replica(settings, clock, kube) as behind:
        gone = snap.mig_instances[0]
        # The GPU's MIG layout was made again: the instance has another UUID now.
        migs = [
            m.model_copy(update={"uuid": MIG_NEW}) if m == gone else m for m in snap.mig_instances
        ]
        remade: NodeSnapshot = snap.model_copy(update={"seq": snap.seq + 1, "mig_instances": migs})
        answer = report(k8s_client, remade)  # through the first replica
        assert answer.status_code == 200, answer.text
        kube.add(_on_node(pod("mig-pod", 1), MIG_NODE))
        body = {
            "resource": f"nvidia.com/mig-{gone.profile}",
            "pods": [{"namespace": "ml-team", "name": "mig-pod", "devices": [gone.uuid]}],
        }
        answer = behind.post(f"/v1/nodes/{MIG_NODE}/k8s/devices", json=body)
        assert answer.status_code == 400, answer.text
        assert gone.uuid in answer.json()["error"]["message"]
        assert _held(behind) == set()
