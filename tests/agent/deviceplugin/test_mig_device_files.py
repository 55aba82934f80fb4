"""With --device-specs a MIG instance comes with the device files CUDA opens it through:
its GPU's /dev/nvidia<N> and its two /dev/nvidia-caps files, found in the driver's
mig-minors list by the GPU and compute instance ids NVML gives."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from agent.deviceplugin.gen.deviceplugin.v1beta1 import api_pb2 as pb
from agent.deviceplugin.mig_caps import MigCaps, mig_caps, read_mig_minors
from agent.nvml_mig import MigIds
from placement.profiles import build_profile
from tests.agent.deviceplugin.fake_kubelet import FakeKubelet
from tests.agent.deviceplugin.harness import Cluster, PluginProcess

NODE = "k8s-mig"
PROFILE = "dgx-a100-mig"  # GPU 3 holds the one 4g.40gb instance
RESOURCE = "nvidia.com/mig-4g.40gb"


def mig_minors(gpus: range, instances: int = 17) -> str:
    """The driver's list as it writes it: config, monitor, then every GPU instance's access
    file followed by those of its eight compute instances (gpu0/gi1/access is 12)."""
    lines = ["config 1", "monitor 2"]
    minor = 3
    for gpu in gpus:
        for gi in range(instances):
            lines.append(f"gpu{gpu}/gi{gi}/access {minor}")
            minor += 1
            for ci in range(8):
                lines.append(f"gpu{gpu}/gi{gi}/ci{ci}/access {minor}")
                minor += 1
    return "\n".join(lines) + "\n"


def test_the_list_is_read_by_capability_name(tmp_path: Path):
    path = tmp_path / "mig-minors"
    path.write_text(mig_minors(range(1)) + "garbage line here\n")
    minors = read_mig_minors(path)
    assert minors["gpu0/gi1/access"] == 12 and minors["gpu0/gi1/ci0/access"] == 13
    assert "garbage" not in minors
    assert read_mig_minors(tmp_path / "absent") == {}


def test_an_instance_without_ids_or_lines_says_why():
    snap = build_profile(PROFILE, NODE)
    snap = snap.model_copy(
        update={"gpus": [g.model_copy(update={"minor_number": g.index}) for g in snap.gpus]}
    )
    first, second, third = snap.mig_instances[:3]
    ids = {first.uuid: MigIds(1, (0,)), second.uuid: MigIds(2, (0,))}
    minors = {"gpu0/gi1/access": 12, "gpu0/gi1/ci0/access": 13, "gpu0/gi2/access": 21}
    found = mig_caps(snap, ids, minors, Path("/proc/driver/nvidia-caps/mig-minors"))
    assert found[first.uuid] == MigCaps(12, (13,))
    assert found[second.uuid] == (
        "/proc/driver/nvidia-caps/mig-minors has no line gpu0/gi2/ci0/access"
    )
    assert "ids are unknown" in str(found[third.uuid])


# What a container is given for GPU 3's 4g.40gb instance. NVML (the fake built from the
# profile) numbers its GPU instances 1.. over the node: the 4g.40gb one, the 14th, is
# gpu3/gi14, compute instance 0; gpu3/gi14/access: 3 + 3 GPUs of 17 * 9 lines + 14 * 9.
FILES_4G = [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia3",
    "/dev/nvidia-caps/nvidia-cap588",
    "/dev/nvidia-caps/nvidia-cap589",
]


def _start(cluster: Cluster, plugins: list[PluginProcess], listed: range) -> Path:
    """NODE and its plugin with --device-specs, whose mig-minors lists the GPUs ``listed``;
    the mig-minors file."""
    cluster.add_node(PROFILE, NODE)
    minors = cluster.folder / "mig-minors"
    minors.write_text(mig_minors(listed))
    plugin = PluginProcess(
        cluster, NODE, "--source", f"fake:{PROFILE}", "--device-specs", "--mig-minors", str(minors)
    ).start()
    plugins.append(plugin)
    return minors


def _admit_4g(cluster: Cluster, kubelet: FakeKubelet) -> list[tuple[str, str]]:
    """The 4g.40gb instance scheduled and admitted: its device files, each as (container
    path, host path)."""
    p = cluster.schedule("mig-0", 1, NODE, resource=RESOURCE)
    reserved = str(p["metadata"]["annotations"]["topoplace.io/gpus"]).split(",")
    admitted = kubelet.admit("ml-team", "mig-0", RESOURCE, 1)
    assert admitted.devices == reserved
    return [(d.container_path, d.host_path) for d in admitted.response.devices]


def test_a_mig_instance_gets_its_gpu_and_both_capability_files(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess]
):
    _start(cluster, plugins, range(8))
    specs = _admit_4g(cluster, kubelet)
    # Was: /dev/nvidia3 alone (and the control files): CUDA found no device.
    assert [host for _, host in specs] == FILES_4G


def test_a_driver_root_prefixes_the_host_paths_and_not_the_containers(
    cluster: Cluster,
    kubelet: FakeKubelet,
    plugins: list[PluginProcess],
    monkeypatch: pytest.MonkeyPatch,
):
    """The GPU operator's driver root, set as the plugin's other options are (its
    environment variable): the kubelet is told the host's files under it, the container
    still sees /dev/... (was: both /dev/..., which on such a host do not exist)."""
    root = cluster.folder / "driver"
    monkeypatch.setenv("TOPOPLACE_DEVICE_PLUGIN_DRIVER_ROOT", str(root))
    _start(cluster, plugins, range(8))
    specs = _admit_4g(cluster, kubelet)
    assert specs == [(c, f"{root}{c}") for c in FILES_4G]


def test_a_mig_instance_whose_capability_files_are_unknown_is_refused(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess]
):
    minors = _start(cluster, plugins, range(3))  # GPU 3's instances are not listed
    # Advertised Unhealthy, so the kubelet does not choose it (was: Healthy, chosen and
    # refused at every admission); one that chooses it all the same is refused.
    [device] = kubelet.plugin(RESOURCE).devices
    assert kubelet.health(RESOURCE) == {device: "Unhealthy"}
    assert kubelet.free(RESOURCE) == []
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.plugin(RESOURCE).stub.Allocate(
            pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=[device])]
            ),
            timeout=5,
        )
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"{minors} has no line gpu3/gi14/access" in str(refused.value.details())
