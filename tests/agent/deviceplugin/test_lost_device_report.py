"""A pod holding a GPU the node no longer has is left out of the device report, and the
rest of the report is taken: one dead GPU must not hide every other pod's truth."""

from __future__ import annotations

from tests.agent.deviceplugin.fake_kubelet import FakeKubelet
from tests.agent.deviceplugin.harness import Cluster, PluginProcess
from tests.waiting import wait_until

NODE = "k8s-lost"


def _moved(cluster: Cluster) -> int:
    return int(cluster.http.get("/v1/k8s/mismatches").json()["counts"]["moved"])


def test_a_pod_on_a_replaced_gpu_is_left_out_and_the_others_reported(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess]
):
    snap = cluster.add_node("hgx-h100", NODE)
    plugins.append(PluginProcess(cluster, NODE).start())
    cluster.schedule("trainer-0", 1, NODE)
    (gone,) = kubelet.admit("ml-team", "trainer-0", "nvidia.com/gpu", 1).devices
    # The board is replaced: the node's snapshot has another UUID where trainer-0's GPU
    # was, and the kubelet still lists the pod on the old one.
    gpus = [g.model_copy(update={"uuid": "GPU-replaced-0"}) if g.uuid == gone else g
            for g in snap.gpus]  # fmt: skip
    cluster.report(snap.model_copy(update={"gpus": gpus, "seq": 1}))
    reserved = cluster.schedule("trainer-1", 1, NODE)["metadata"]["annotations"][
        "topoplace.io/gpus"
    ]
    other = next(u for u in kubelet.free("nvidia.com/gpu") if u not in (reserved, gone))
    kubelet.admit("ml-team", "trainer-1", "nvidia.com/gpu", 1, choose=[other])
    # Was: every report refused (400, trainer-0's device is none of the node's), so
    # trainer-1's allocation never followed the kubelet's choice.
    wait_until(lambda: _moved(cluster) == 1, "trainer-1's truth taken")
    out = plugins[0].output()
    assert f"pod ml-team/trainer-0 holds {gone}, which the node no longer has" in out
