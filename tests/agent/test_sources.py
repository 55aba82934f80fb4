"""--source values: which source each names, and what each reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.host import HostFacts
from agent.nvml_discovery import DiscoveryError
from agent.sources import Identity, NvmlSource, SimSource, SmiSource, SourceError, open_source
from placement.profiles import build_profile
from placement.topo_text import render_topo_matrix

IDENTITY = Identity("n1", "eu", {"rack": "r1"})


def test_open_source_kinds(tmp_path: Path) -> None:
    path = tmp_path / "topo.txt"
    path.write_text(render_topo_matrix(build_profile("dgx1-v100", "x")))
    assert isinstance(open_source("sim:hgx-h100", IDENTITY), SimSource)
    assert isinstance(open_source("fake:hgx-h100", IDENTITY), NvmlSource)
    assert isinstance(open_source(f"smi:{path}", IDENTITY), SmiSource)
    for bad, message in (
        ("sim:nope", "unknown profile"),
        ("smi:/nonexistent", "no such file"),
        ("sim:", "is not one of"),
        ("nvml:extra", "is not one of"),
    ):
        with pytest.raises(SourceError, match=message):
            open_source(bad, IDENTITY)


def test_sim_source_carries_the_identity() -> None:
    snap = SimSource("gb200-tray", IDENTITY).read()
    assert (snap.name, snap.region, snap.labels) == ("n1", "eu", {"rack": "r1"})
    assert snap.seq == 0 and snap.timestamp is None and snap.fabric is not None


def test_sim_source_numbers_device_files_as_the_indexes() -> None:
    snap = SimSource("hgx-h100", IDENTITY).read()
    assert [g.minor_number for g in snap.gpus] == list(range(8))


def test_smi_source_rereads_the_file_and_fills_host_facts(tmp_path: Path) -> None:
    path = tmp_path / "topo.txt"
    text = render_topo_matrix(build_profile("dgx1-v100", "x"))
    path.write_text(text)
    host = HostFacts(hostname="gpu-host-7", cpu_isa="riscv64")
    source = SmiSource(path, IDENTITY, "Tesla V100-SXM2-32GB", host)
    first = source.read()
    assert first.links[0][3] == "NV2" and first.gpus[0].model == "Tesla V100-SXM2-32GB"
    assert (first.hostname, first.cpu_isa, first.labels) == (
        "gpu-host-7",
        "riscv64",
        {"rack": "r1"},
    )
    path.write_text(text.replace("NV2", "NV1"))  # a changed wiring is seen on the next read
    assert source.read().links[0][3] == "NV1"
    path.write_text("GPU0\tGPU1\nGPU0\t X \tNV9\tjunk\n")
    with pytest.raises(DiscoveryError, match="line 2"):
        source.read()


def test_smi_source_keeps_a_snapshot_files_own_facts(tmp_path: Path) -> None:
    path = tmp_path / "snap.json"
    path.write_text(build_profile("gb200-tray", "other").model_dump_json())
    snap = SmiSource(path, IDENTITY, "unknown", HostFacts("here", "x86_64")).read()
    assert snap.name == "n1" and snap.cpu_isa == "aarch64" and snap.hostname == "other"


def test_a_snapshot_file_nested_past_the_json_readers_depth_is_bad_settings(
    tmp_path: Path,
) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"gpus": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(SourceError, match="nested too deeply"):
        open_source(f"smi:{path}", IDENTITY)
