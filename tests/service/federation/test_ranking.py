"""The ranking over summaries: fit, bandwidth, cost, and the order (pure, no service)."""

from __future__ import annotations

import pytest

from service.federation.ranking import (
    CliqueFree,
    DesignFree,
    Egress,
    Job,
    Price,
    Region,
    Summary,
    rank,
)

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
L40S = "NVIDIA L40S"
AWS_EGRESS = Egress(0.02, 0.09)


def design(model: str, gbps: float, free: dict[int, int], per_node: int = 8) -> DesignFree:
    return DesignFree(
        design=f"{model} x{per_node}",
        gpu_model=model,
        gpus_per_node=per_node,
        nodes=sum(free.values()),
        free_gpus=sum(k * v for k, v in free.items()),
        island_gbps=gbps,
        by_island=free,
    )


def region(
    name: str,
    cloud: str,
    designs: tuple[DesignFree, ...],
    prices: tuple[Price, ...],
    cliques: tuple[CliqueFree, ...] = (),
    stale: bool = False,
    egress: Egress = AWS_EGRESS,
) -> Region:
    return Region(name, cloud, prices, egress, Summary(name, 1, designs, cliques), stale)


ONPREM = region("onprem", "onprem", (design(A100, 300, {8: 2}),), (Price("A100", 1.0),))
AWS = region("aws", "aws", (design(H100, 450, {8: 2}),), (Price("H100", 4.0, 1.5),))
GCP = region(
    "gcp",
    "gcp",
    (design(H100, 450, {8: 1}), design(L40S, 24, {1: 2})),
    (Price("H100", 3.0), Price("L40S", 0.8)),
    egress=Egress(0.01, 0.12),
)
ALL = [ONPREM, AWS, GCP]


def order(job: Job, regions: list[Region] = ALL) -> list[str]:
    return [c.region for c in rank(job, regions) if c.fits]


def test_the_cheapest_that_fits_comes_first() -> None:
    assert order(Job(gpus=4)) == ["onprem", "gcp", "aws"]


def test_a_bandwidth_floor_leaves_only_the_fast_designs() -> None:
    assert order(Job(gpus=4, floor_gbps=400)) == ["gcp", "aws"]


def test_an_island_floor_needs_a_free_island_that_big() -> None:
    # One GPU, but it must sit in a free island of 8: the L40S singletons do not count.
    found = {c.region: c for c in rank(Job(gpus=1, floor_island=8), ALL)}
    assert found["gcp"].design == f"{H100} x8"


def test_egress_of_large_data_outweighs_price() -> None:
    job = Job(gpus=4, floor_gbps=400, data_region="aws", data_gb=2000)
    ranked = rank(job, ALL)
    assert ranked[0].region == "aws"
    gcp = next(c for c in ranked if c.region == "gcp")
    assert gcp.cost is not None and gcp.cost.egress == pytest.approx(2000 * 0.09)


def test_in_cloud_egress_is_the_region_rate() -> None:
    aws_west = region("aws-west", "aws", (design(H100, 450, {8: 1}),), (Price("H100", 3.5),))
    job = Job(gpus=8, data_region="aws", data_gb=100)
    ranked = {c.region: c for c in rank(job, [AWS, aws_west])}
    assert ranked["aws-west"].cost is not None
    assert ranked["aws-west"].cost.egress == pytest.approx(100 * 0.02)


def test_spot_is_used_only_when_allowed() -> None:
    assert order(Job(gpus=8, floor_gbps=400)) == ["gcp", "aws"]
    assert order(Job(gpus=8, floor_gbps=400, spot=True)) == ["aws", "gcp"]


def test_a_budget_per_hour_excludes_dear_regions() -> None:
    ranked = rank(Job(gpus=8, floor_gbps=400, budget_per_hour=30), ALL)
    assert [c.region for c in ranked if c.fits] == ["gcp"]
    aws = next(c for c in ranked if c.region == "aws")
    assert "over budget" in aws.reason


def test_a_cost_weight_of_zero_is_the_fastest() -> None:
    assert order(Job(gpus=4, cost_weight=0.0))[0] in ("aws", "gcp")
    assert order(Job(gpus=4, cost_weight=0.0))[-1] == "onprem"


def test_allowed_regions_clouds_and_models() -> None:
    assert order(Job(gpus=4, regions=frozenset({"aws"}))) == ["aws"]
    assert order(Job(gpus=4, clouds=frozenset({"gcp", "aws"}))) == ["gcp", "aws"]
    assert order(Job(gpus=4, gpu_models=("A100",))) == ["onprem"]


def test_stale_and_silent_regions_are_shown_not_chosen() -> None:
    stale = region("old", "aws", AWS.summary.designs, AWS.prices, stale=True)  # type: ignore[union-attr]
    silent = Region("new", "aws", AWS.prices, AWS.egress, None)
    ranked = rank(Job(gpus=4), [stale, silent, ONPREM])
    assert [c.region for c in ranked] == ["onprem", "new", "old"]
    assert "stale" in ranked[2].reason and "no summary" in ranked[1].reason


def test_a_gang_stays_in_one_region_and_prefers_a_free_clique() -> None:
    gb200 = "NVIDIA GB200"
    tray = design(gb200, 900, {4: 18}, per_node=4)
    rack = region(
        "rack", "onprem", (tray,), (Price("GB200", 6.0),), (CliqueFree("c/1", tray.design, 18, 18),)
    )
    loose = region("loose", "onprem", (tray,), (Price("GB200", 5.0),))
    job = Job(gpus=4, tasks=16)
    ranked = {c.region: c for c in rank(job, [rack, loose])}
    assert ranked["rack"].predicted_gbps == 900
    assert ranked["loose"].predicted_gbps == 25.0  # between nodes over the network
    assert order(Job(gpus=4, tasks=16, floor_gbps=400), [rack, loose]) == ["rack"]
    # 20 tasks of 4 need 20 trays: no region has them, and none splits the gang.
    assert order(Job(gpus=4, tasks=20), [rack, loose]) == []


def test_an_unpriced_model_is_not_chosen() -> None:
    unpriced = region("x", "aws", (design(H100, 450, {8: 1}),), (Price("A100", 0.1),))
    found = rank(Job(gpus=1), [unpriced])[0]
    assert not found.fits and "no price" in found.reason


def test_required_labels_leave_only_the_regions_that_have_them() -> None:
    ib = Region("ib", "onprem", ONPREM.prices, ONPREM.egress, ONPREM.summary, labels={"ib": "yes"})
    ranked = rank(Job(gpus=4, labels={"ib": "yes"}), [ib, ONPREM])
    assert [c.region for c in ranked if c.fits] == ["ib"]
    assert "lacks the label(s) ib" in ranked[1].reason


class CountedCliques(tuple[CliqueFree, ...]):
    """A summary's cliques that count how often they are walked."""

    walks = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        type(self).walks += 1
        return super().__iter__()


def test_a_gang_does_not_walk_every_clique_for_every_design() -> None:
    """A summary may hold 1,000 designs and 10,000 cliques (under 1 MB): walking the
    cliques for each fitting design took 0.16 s of the event loop per gang request.
    They are counted per design once, when the summary is taken."""
    designs = tuple(
        DesignFree(f"{H100} x8 #{i}", H100, 8, 10, 80, 450.0, {8: 10}) for i in range(1000)
    )
    cliques = CountedCliques(
        CliqueFree(f"c/{i}", f"{H100} x8 #{i % 1000}", 18, i % 3) for i in range(10_000)
    )
    many = Region(
        "many", "aws", (Price("H100", 4.0),), AWS_EGRESS, Summary("many", 1, designs, cliques)
    )
    before = CountedCliques.walks
    (found,) = rank(Job(gpus=8, tasks=2), [many])
    assert found.fits and found.predicted_gbps == 450.0  # a clique of two free nodes
    assert CountedCliques.walks == before, "the cliques were walked per request"
    assert rank(Job(gpus=8, tasks=3), [many])[0].predicted_gbps == 25.0  # none has three
