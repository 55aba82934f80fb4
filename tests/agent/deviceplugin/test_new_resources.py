"""A resource that appears while the plugin runs (MIG instances created later) is served
and registered then, not only those the node had when the plugin started."""

from __future__ import annotations

from tests.agent.deviceplugin.fake_kubelet import FakeKubelet
from tests.agent.deviceplugin.harness import Cluster, PluginProcess

NODE = "k8s-mig"


def test_mig_instances_created_after_start_are_registered(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess]
):
    snap = cluster.add_node("dgx-a100-mig", NODE)
    first, later = sorted({m.profile for m in snap.mig_instances})[:2]
    before = snap.model_copy(
        update={"mig_instances": [m for m in snap.mig_instances if m.profile != later]}
    )
    cluster.snapshots[NODE] = before  # what the plugin reads at start: no `later` instance
    p = PluginProcess(cluster, NODE).start()
    plugins.append(p)
    kubelet.plugin(f"nvidia.com/mig-{first}")
    assert f"nvidia.com/mig-{later}" not in kubelet.plugins
    p.write_node(snap)  # the operator creates them
    # Was: never registered; the kubelet could not admit a pod asking for them.
    plugin = kubelet.plugin(f"nvidia.com/mig-{later}")
    assert sorted(plugin.devices) == sorted(
        m.uuid for m in snap.mig_instances if m.profile == later
    )
    assert "new resource(s) on this node: nvidia.com/mig-" + later in p.output()
