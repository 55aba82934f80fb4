"""The wiring layout: what the picture of each node design holds, from the snapshot alone."""

from __future__ import annotations

from placement import NodeSnapshot, islands
from placement.links import LinkKind
from placement.profiles import build_profile
from service.console.wiring import Holder, lay_out


def _island_of(snap: NodeSnapshot) -> list[str]:
    names = {g: island.name for island in islands(snap) for g in island.gpus}
    return [names[g] for g in range(snap.gpu_count)]


def test_a_dgx1_draws_each_nvlink_pair_with_its_lanes() -> None:
    snap = build_profile("dgx1-v100", "v100-a")
    picture = lay_out(snap, _island_of(snap), {})
    expected = {
        (i, j): snap.link(i, j).lanes
        for i in range(8)
        for j in range(i + 1, 8)
        if snap.link(i, j).kind is LinkKind.NVLINK
    }
    assert len(expected) == 16  # the hybrid cube-mesh: two quads and four links across
    assert {(e.a, e.b): e.lanes for e in picture.edges} == expected
    assert picture.switches == ()
    assert picture.islands == (("nvl0", tuple(range(8))),)


def test_a_dgx1_has_two_numa_bands_of_two_pcie_switches_with_a_nic_each() -> None:
    snap = build_profile("dgx1-v100", "v100-a")
    picture = lay_out(snap, _island_of(snap), {})
    assert [band.numa for band in picture.bands] == [0, 1]
    groups = [(g.gpus, g.nics) for band in picture.bands for g in band.groups]
    assert groups == [
        ((0, 1), ("mlx5_0",)),
        ((2, 3), ("mlx5_1",)),
        ((4, 5), ("mlx5_2",)),
        ((6, 7), ("mlx5_3",)),
    ]


def test_an_nvswitch_island_is_one_switch_bar_not_every_pair() -> None:
    snap = build_profile("hgx-h100", "h100-a")
    picture = lay_out(snap, _island_of(snap), {})
    assert picture.edges == ()
    [switch] = picture.switches
    assert switch.island == "nvl0"
    assert switch.ports == tuple((g, 18) for g in range(8))


def test_pcie_only_gpus_are_pcie_groups_without_nvlink() -> None:
    snap = build_profile("pcie-8x-l40s", "l40s-a")
    picture = lay_out(snap, _island_of(snap), {})
    assert picture.edges == () and picture.switches == ()
    assert picture.islands == (("pcie0", (0, 1, 2, 3)), ("pcie1", (4, 5, 6, 7)))
    # Its NIC is behind the CPUs' interconnect from every GPU: a band of its own.
    assert picture.bands[-1].numa == -1
    assert [n.name for n in picture.nics] == ["mlx5_0"]


def test_each_holding_allocation_has_its_own_colour_and_legend_row() -> None:
    snap = build_profile("dgx1-v100", "v100-a")
    one, two = Holder("a-1", "train", "active"), Holder("a-2", None, "pending")
    picture = lay_out(snap, _island_of(snap), {0: one, 1: one, 5: two})
    colours = {g.index: g.colour for g in picture.gpus}
    assert colours[0] == colours[1] != colours[5]
    assert all(colours[g] is None for g in (2, 3, 4, 6, 7))
    assert [(e.holder, e.gpus) for e in picture.legend] == [(one, (0, 1)), (two, (5,))]


def test_boxes_do_not_overlap_and_stay_inside_the_picture() -> None:
    for profile in ("dgx1-v100", "hgx-h100", "dgx-a100", "pcie-8x-l40s", "riscv-nvlfusion-4"):
        snap = build_profile(profile, "n")
        picture = lay_out(snap, _island_of(snap), {})
        boxes = [g.box for g in picture.gpus] + [n.box for n in picture.nics]
        for k, a in enumerate(boxes):
            assert a.x >= 0 and a.x + a.w <= picture.width, profile
            assert a.y >= 0 and a.y + a.h <= picture.height, profile
            for b in boxes[k + 1 :]:
                apart = a.x + a.w <= b.x or b.x + b.w <= a.x or a.y + a.h <= b.y or b.y + b.h <= a.y
                assert apart, (profile, a, b)
