"""filter -> prioritize -> bind -> the kubelet admits the pod -> the container sees the
reservation's GPUs, with the plugin as a subprocess speaking the kubelet's protocol."""

from __future__ import annotations

from typing import Any

import pytest

from agent.deviceplugin.gen.deviceplugin.v1beta1 import api_pb2 as pb
from tests.agent.deviceplugin.fake_kubelet import FakeKubelet
from tests.agent.deviceplugin.harness import Cluster, PluginProcess
from tests.waiting import wait_until
from topoplace.cli import main

NODE = "k8s-h100"


def _annotated(p: dict[str, Any]) -> list[str]:
    return str(p["metadata"]["annotations"]["topoplace.io/gpus"]).split(",")


def _start(cluster: Cluster, plugins: list[PluginProcess], *extra: str) -> PluginProcess:
    p = PluginProcess(cluster, NODE, *extra).start()
    plugins.append(p)
    return p


def test_the_container_gets_exactly_the_reserved_gpus(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess]
):
    snap = cluster.add_node("hgx-h100", NODE)
    _start(cluster, plugins, "--strategy", "envvar", "--strategy", "cdi-cri")
    plugin = kubelet.plugin("nvidia.com/gpu")
    (registration,) = kubelet.registrations
    assert registration.version == "v1beta1"
    assert registration.endpoint == "topoplace-nvidia.com-gpu.sock"
    assert registration.options.get_preferred_allocation_available
    assert plugin.options.pre_start_required
    # One device per GPU UUID, each with its NUMA node.
    assert sorted(plugin.devices) == sorted(g.uuid for g in snap.gpus)
    for g in snap.gpus:
        assert [n.ID for n in plugin.devices[g.uuid].topology.nodes] == [g.numa_node]

    p = cluster.schedule("trainer-0", 4, NODE, annotations={"topoplace.io/locality": "nvlink"})
    reserved = _annotated(p)
    admitted = kubelet.admit("ml-team", "trainer-0", "nvidia.com/gpu", 4)
    assert admitted.preferred == reserved
    env = dict(admitted.response.envs)
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(reserved)
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(reserved)  # the reservation's order
    assert env["NCCL_P2P_LEVEL"] == "NVL"  # NVSwitch: every pair on NVLink
    assert env["TOPOPLACE_ALLOCATION"] == p["metadata"]["annotations"]["topoplace.io/allocation"]
    assert [c.name for c in admitted.response.cdi_devices] == [
        f"nvidia.com/gpu={u}" for u in reserved
    ]
    # The truth the plugin reports matches: nothing moved.
    wait_until(
        lambda: (
            cluster.http.get("/v1/k8s/mismatches").json()["counts"]["moved"] == 0
            and _reported(cluster, "trainer-0")
        ),
        "the plugin reported the pod's devices",
    )


def _reported(cluster: Cluster, pod: str) -> bool:
    allocations = cluster.http.get("/v1/allocations", params={"node": NODE}).json()["allocations"]
    return any(a["owner"] == f"k8s-pod:ml-team/{pod}" for a in allocations)


def test_mig_instances_are_their_own_resource(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess]
):
    snap = cluster.add_node("dgx-a100-mig", NODE)
    profiles = sorted({m.profile for m in snap.mig_instances})
    _start(cluster, plugins, "--strategy", "cdi-annotations")
    profile = profiles[0]
    resource = f"nvidia.com/mig-{profile}"
    plugin = kubelet.plugin(resource)
    assert sorted(plugin.devices) == sorted(
        m.uuid for m in snap.mig_instances if m.profile == profile
    )
    p = cluster.schedule("mig-0", 1, NODE, resource=resource)
    reserved = _annotated(p)
    admitted = kubelet.admit("ml-team", "mig-0", resource, 1)
    assert admitted.devices == reserved
    (value,) = admitted.response.annotations.values()
    assert value == f"nvidia.com/gpu={reserved[0]}"
    assert "NVIDIA_VISIBLE_DEVICES" not in admitted.response.envs
    assert admitted.response.envs["CUDA_VISIBLE_DEVICES"] == reserved[0]


def test_other_mig_instances_than_reserved_move_the_allocation(
    cluster: Cluster,
    kubelet: FakeKubelet,
    plugins: list[PluginProcess],
    capsys: pytest.CaptureFixture[str],
):
    snap = cluster.add_node("dgx-a100-mig", NODE)
    profile = sorted({m.profile for m in snap.mig_instances})[0]
    resource = f"nvidia.com/mig-{profile}"
    _start(cluster, plugins)
    kubelet.plugin(resource)
    reserved = _annotated(cluster.schedule("mig-0", 1, NODE, resource=resource))
    taken = _annotated(cluster.schedule("mig-1", 1, NODE, resource=resource))
    # The kubelet gives mig-0 the instance reserved for mig-1, against the advice.
    admitted = kubelet.admit("ml-team", "mig-0", resource, 1, choose=taken)
    assert admitted.preferred == reserved
    assert admitted.response.envs["CUDA_VISIBLE_DEVICES"] == taken[0]

    def pods_of(instance: str) -> list[str]:
        return [r["pod"] for r in cluster.reservations(NODE) if instance in r["devices"]]

    wait_until(lambda: pods_of(taken[0]) == ["mig-0"], "mig-0's allocation followed the truth")
    assert pods_of(reserved[0]) == []  # given up: free again
    counts = cluster.http.get("/v1/k8s/mismatches").json()["counts"]
    assert (counts["moved"], counts["unmatched"], counts["superseded"]) == (1, 0, 1)
    assert main(["k8s", "reconcile", "--server", cluster.url]) == 0
    text = capsys.readouterr().out
    assert text.startswith("moved 1, created 0, not moved 0")
    assert f"ml-team/mig-0  moved   {reserved[0]}  {taken[0]}" in text


def test_nccl_and_cuda_hints_can_be_switched_off(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess]
):
    cluster.add_node("hgx-h100", NODE)
    _start(cluster, plugins, "--no-cuda-env", "--no-nccl-hints", "--device-specs")
    p = cluster.schedule("trainer-1", 2, NODE)
    admitted = kubelet.admit("ml-team", "trainer-1", "nvidia.com/gpu", 2)
    env = dict(admitted.response.envs)
    assert "CUDA_VISIBLE_DEVICES" not in env and "NCCL_P2P_LEVEL" not in env
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(_annotated(p))
    paths = [d.container_path for d in admitted.response.devices]
    indices = p["metadata"]["annotations"]["topoplace.io/gpu-indices"].split(",")
    assert paths[:3] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert sorted(paths[3:]) == sorted(f"/dev/nvidia{i}" for i in indices)
    assert all(
        isinstance(d, pb.DeviceSpec) and d.permissions == "rw" for d in admitted.response.devices
    )
