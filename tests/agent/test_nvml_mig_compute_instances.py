"""A GPU instance split into several compute instances: placed once, as its first MIG
device, and each compute instance's own id reaches the device plugin's capability files."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from agent.deviceplugin.mig_caps import MigCaps, mig_caps
from agent.nvml_fake import FakeNvml, fake_host
from agent.nvml_mig import MigIds
from agent.sources import Identity, NvmlSource
from placement.profiles import build_profile

SIBLING = "MIG-0b1c2d3e-4f50-5617-8899-aabbccddeeff"


def test_each_compute_instance_of_a_split_gpu_instance_is_known() -> None:
    snap = build_profile("hgx-h100-mig", "n1")
    fake = FakeNvml.from_snapshot(snap)
    first, second = fake.gpus[3].migs
    # GPU instance `first` split into compute instances 0 and 2 (NVML numbers them by
    # placement, so 1 need not exist); its MIG devices are listed one after the other.
    fake.gpus[3].migs = [first, replace(first, uuid=SIBLING, compute_instance_id=2), second]
    fake.nvmlInit()
    source = NvmlSource(fake, fake_host(snap), Identity("n1"))
    got = source.read()
    # Placed once, as its first MIG device: the sibling is no instance of its own.
    assert got.mig_instances == snap.mig_instances
    ids = source.mig_ids()
    gi = first.gpu_instance_id
    # Was: MigIds(gi, 0) alone, and a container given the instance missed ci2's file.
    assert ids[first.uuid] == MigIds(gi, (0, 2))
    assert ids[second.uuid] == MigIds(second.gpu_instance_id, (0,))
    assert SIBLING not in ids
    minor = got.gpus[3].minor_number
    minors = {
        f"gpu{minor}/gi{gi}/access": 30,
        f"gpu{minor}/gi{gi}/ci0/access": 31,
        f"gpu{minor}/gi{gi}/ci2/access": 33,
    }
    caps = mig_caps(got, ids, minors, Path("mig-minors"))
    assert caps[first.uuid] == MigCaps(30, (31, 33))
    del minors[f"gpu{minor}/gi{gi}/ci2/access"]
    missing = mig_caps(got, ids, minors, Path("mig-minors"))[first.uuid]
    assert missing == f"mig-minors has no line gpu{minor}/gi{gi}/ci2/access"
