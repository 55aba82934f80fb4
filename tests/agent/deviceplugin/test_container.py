"""What a container is given: per strategy, with the CUDA order and the NCCL hint."""

from __future__ import annotations

from pathlib import Path

from agent.deviceplugin.container import CDI_ANNOTATION_PREFIX, ContainerOptions, Wiring, answer
from agent.deviceplugin.mig_caps import MigCaps

DEVICES = ["GPU-b", "GPU-a"]
INDEX = {"GPU-a": 0, "GPU-b": 3}


def test_envvar_keeps_the_reservations_order_for_cuda():
    out = answer(DEVICES, INDEX, Wiring(True, "alloc-1"), ContainerOptions())
    assert out.envs == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-b,GPU-a",
        "CUDA_VISIBLE_DEVICES": "GPU-b,GPU-a",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "NCCL_P2P_LEVEL": "NVL",
        "TOPOPLACE_ALLOCATION": "alloc-1",
    }
    assert out.cdi_devices == [] and out.annotations == {} and out.device_specs == []


def test_cdi_names_in_the_field_and_the_annotation():
    out = answer(
        DEVICES, INDEX, Wiring(), ContainerOptions(strategies=("cdi-cri", "cdi-annotations"))
    )
    assert out.cdi_devices == ["nvidia.com/gpu=GPU-b", "nvidia.com/gpu=GPU-a"]
    ((key, value),) = out.annotations.items()
    assert key.startswith(CDI_ANNOTATION_PREFIX) and len(key) <= 63 + len("cdi.k8s.io/")
    assert value == "nvidia.com/gpu=GPU-b,nvidia.com/gpu=GPU-a"
    assert "NVIDIA_VISIBLE_DEVICES" not in out.envs


def test_no_nvlink_no_hint_and_hints_switch_off():
    assert "NCCL_P2P_LEVEL" not in answer(DEVICES, INDEX, Wiring(False), ContainerOptions()).envs
    assert "NCCL_P2P_LEVEL" not in answer(DEVICES[:1], INDEX, Wiring(True), ContainerOptions()).envs
    off = answer(DEVICES, INDEX, Wiring(True), ContainerOptions(cuda_env=False, nccl_hints=False))
    assert set(off.envs) == {"NVIDIA_VISIBLE_DEVICES"}


def test_device_specs_name_the_control_nodes_and_each_gpu():
    out = answer(DEVICES, INDEX, Wiring(), ContainerOptions(device_specs=True))
    assert [p for p, _, _ in out.device_specs] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia0",
        "/dev/nvidia3",
    ]


def test_device_specs_of_a_mig_instance_add_its_capability_files():
    # MIG-b's GPU instance is split into two compute instances: the container gets both.
    caps = {"MIG-a": MigCaps(12, (13,)), "MIG-b": MigCaps(21, (22, 24))}
    out = answer(
        ["MIG-b", "MIG-a"],
        {"MIG-a": 0, "MIG-b": 0},
        Wiring(),
        ContainerOptions(device_specs=True),
        caps,
    )
    assert out.device_specs[3:] == [
        ("/dev/nvidia0", "/dev/nvidia0", "rw"),
        *[(f"/dev/nvidia-caps/nvidia-cap{n}",) * 2 + ("rw",) for n in (12, 13, 21, 22, 24)],
    ]


def test_a_driver_root_moves_the_host_paths_only(tmp_path: Path):
    """NVIDIA's GPU operator: the driver container's device nodes are on the host under
    its root; the container must still see /dev/nvidia<N> (was: host path = container
    path, so the kubelet found no /dev/nvidia0 on such a host)."""
    root = tmp_path / "run" / "nvidia" / "driver"
    caps = {"MIG-a": MigCaps(12, (13,))}
    for driver_root in (str(root), f"{root}/"):
        options = ContainerOptions(device_specs=True, driver_root=driver_root)
        out = answer(["MIG-a", "GPU-b"], {"MIG-a": 0, "GPU-b": 3}, Wiring(), options, caps)
        containers = [
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia0",
            "/dev/nvidia3",
            "/dev/nvidia-caps/nvidia-cap12",
            "/dev/nvidia-caps/nvidia-cap13",
        ]
        assert out.device_specs == [(c, f"{root}{c}", "rw") for c in containers]


def test_the_root_driver_root_is_the_host_itself():
    default = answer(DEVICES, INDEX, Wiring(), ContainerOptions(device_specs=True))
    rooted = answer(DEVICES, INDEX, Wiring(), ContainerOptions(device_specs=True, driver_root="/"))
    assert rooted.device_specs == default.device_specs
    assert all(host == path for path, host, _ in default.device_specs)
