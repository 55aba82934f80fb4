"""What is advertised per resource, from the agent's snapshot of the node."""

from __future__ import annotations

from agent.deviceplugin.devices import Device, advertised, merge, resources_of
from placement.profiles import build_profile


def test_whole_gpus_carry_their_numa_node():
    snap = build_profile("hgx-h100", "n")
    devices = advertised(snap, "nvidia.com/gpu")
    assert [(d.id, d.numa_node, d.healthy) for d in devices] == [
        (g.uuid, g.numa_node, True) for g in snap.gpus
    ]
    assert resources_of(snap, "nvidia.com/gpu") == ["nvidia.com/gpu"]


def test_mig_profiles_are_resources_of_their_own():
    snap = build_profile("dgx-a100-mig", "n")
    resources = resources_of(snap, "nvidia.com/gpu")
    profiles = sorted({m.profile for m in snap.mig_instances})
    assert [r for r in resources if r.startswith("nvidia.com/mig-")] == [
        f"nvidia.com/mig-{p}" for p in profiles
    ]
    for p in profiles:
        ids = [d.id for d in advertised(snap, f"nvidia.com/mig-{p}")]
        assert ids == [m.uuid for m in snap.mig_instances if m.profile == p]
    whole = {d.id for d in advertised(snap, "nvidia.com/gpu")}
    assert whole == {g.uuid for g in snap.gpus if not g.mig_enabled}


def test_a_lost_device_stays_listed_as_unhealthy():
    before = [Device("a", True, 0, 0), Device("b", True, 1, 1)]
    assert merge(before, before[:1]) == [before[0], Device("b", False, 1, 1)]
