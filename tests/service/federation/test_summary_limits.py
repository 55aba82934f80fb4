"""A region's summary cut to the global service's limits: a region past one stays routable.

A summary past a limit was refused whole, and every later one built from
the same cluster too: the region stale for good. Cut to fit by the region,
it is taken, and says what it left out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from agent.signing import NodeKey
from placement.profiles._common import (
    GpuSpec,
    Identity,
    Machine,
    NumaSpec,
    assemble,
    bus_ids,
    cpus,
    uniform_links,
)
from placement.snapshot import Fabric, NodeSnapshot
from service import schema
from service.federation.pusher import SummaryPusher
from service.federation.schemas import (
    MAX_DESIGN_NAME,
    MAX_SUMMARY_CLIQUES,
    MAX_SUMMARY_DESIGNS,
    MAX_SUMMARY_MODELS,
    RegionSummary,
)
from service.federation.summary_limits import fit, shortened
from service.settings import Settings
from service.state import ServiceState

H100 = "NVIDIA H100 80GB HBM3"
LONG_MODEL = (H100 + " " + "x" * 128)[:128]  # as long as a GPU's model may be


def design(name: str, model: str = H100, free: int = 1, nodes: int = 1) -> dict[str, Any]:
    return {
        "design": name,
        "gpu_model": model,
        "gpus_per_node": 8,
        "nodes": nodes,
        "free_gpus": free,
        "island_gbps": 450.0,
        "by_island": {"1": nodes} if free else {},
    }


def clique(domain: str, design_name: str, free: int = 1) -> dict[str, Any]:
    return {"domain": domain, "design": design_name, "nodes": 18, "free_nodes": free}


def summary(designs: list[dict[str, Any]], cliques: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "region": "big",
        "seq": 1,
        "sent_at": "2026-12-01T00:00:00+00:00",
        "designs": designs,
        "cliques": cliques,
        "stale_nodes": 0,
        "live_allocations": 0,
        "network_gbps": 25.0,
    }


def test_a_summary_within_the_limits_is_sent_as_it_is() -> None:
    body = summary([design("a")], [clique("c/1", "a")])
    assert fit(body) is body and "cut" not in RegionSummary.model_validate(body).model_dump()


def test_a_long_design_name_is_shortened_the_same_wherever_it_is_named() -> None:
    long = LONG_MODEL + " x63 nvl[" + "+".join(["1"] * 63) + "]"
    assert len(long) > MAX_DESIGN_NAME
    body = fit(summary([design(long)], [clique("c/1", long)]))
    ((kept,), (kept_clique,)) = body["designs"], body["cliques"]
    assert len(kept["design"]) == MAX_DESIGN_NAME and kept["design"].startswith(LONG_MODEL)
    assert kept_clique["design"] == kept["design"] == shortened(long, MAX_DESIGN_NAME)
    other = long[:-1] + "+1]"  # the same start: the hash keeps them apart
    assert shortened(other, MAX_DESIGN_NAME) != kept["design"]
    assert body["cut"] == {"designs": 0, "free_gpus": 0, "cliques": 0, "names": 1}
    RegionSummary.model_validate(body)


def test_past_the_models_limit_the_models_with_the_fewest_free_gpus_go() -> None:
    # Model i has i free GPUs: models 0-3 have the fewest.
    designs = [design(f"d{i}", f"GPU {i}", free=i) for i in range(MAX_SUMMARY_MODELS + 4)]
    body = fit(summary(designs, [clique("c/0", "d0"), clique("c/9", "d9")]))
    assert {d["gpu_model"] for d in body["designs"]} == {
        f"GPU {i}" for i in range(4, MAX_SUMMARY_MODELS + 4)
    }
    assert [c["domain"] for c in body["cliques"]] == ["c/9"]  # d0's clique went with it
    assert body["cut"] == {"designs": 4, "free_gpus": 0 + 1 + 2 + 3, "cliques": 1, "names": 0}
    RegionSummary.model_validate(body)


def test_past_the_designs_limit_the_designs_with_the_fewest_free_gpus_go() -> None:
    count = MAX_SUMMARY_DESIGNS + 10
    designs = [design(f"d{i:04}", free=i % 50, nodes=1) for i in range(count)]
    body = fit(summary(designs, []))
    assert len(body["designs"]) == MAX_SUMMARY_DESIGNS
    gone = {d["design"] for d in designs} - {d["design"] for d in body["designs"]}
    assert {int(name[1:]) % 50 for name in gone} == {0}  # none free
    assert body["designs"] == sorted(body["designs"], key=lambda d: d["design"])
    assert body["cut"]["designs"] == 10 and body["cut"]["free_gpus"] == 0
    RegionSummary.model_validate(body)


def test_past_the_cliques_limit_the_cliques_with_the_fewest_free_nodes_go() -> None:
    cliques = [clique(f"c/{i:05}", "a", free=i % 7) for i in range(MAX_SUMMARY_CLIQUES + 3)]
    body = fit(summary([design("a")], cliques))
    assert len(body["cliques"]) == MAX_SUMMARY_CLIQUES
    assert min(c["free_nodes"] for c in body["cliques"]) == 0  # 3 of the empty ones went
    assert sum(c["free_nodes"] == 0 for c in body["cliques"]) == (len(cliques) + 6) // 7 - 3
    assert body["cut"] == {"designs": 0, "free_gpus": 0, "cliques": 3, "names": 0}
    RegionSummary.model_validate(body)


# -- a region over each limit, pushing to a real global service ------------------------


def node(name: str, model: str, gpus: int = 1, fabric: Fabric | None = None) -> NodeSnapshot:
    """A box of ``gpus`` GPUs of ``model`` on PCIe (no NVLink: islands of one)."""
    buses = bus_ids(0, range(1, gpus + 1))
    machine = Machine(
        gpus=tuple(GpuSpec(model, 81559, buses[i], 0) for i in range(gpus)),
        links=uniform_links(gpus, "SYS"),
        numa_nodes=(NumaSpec(0, cpus((0, 63)), 262144),),
    )
    return assemble(machine, Identity(name, fabric=fabric))


def long_names() -> list[NodeSnapshot]:
    fabric = Fabric(cluster_uuid="rack", clique_id=1)
    return [node(f"n{i}", LONG_MODEL, 63, fabric) for i in range(2)]  # a 263-character design


def many_models() -> list[NodeSnapshot]:
    return [node(f"n{i}", f"NVIDIA H100 v{i}") for i in range(MAX_SUMMARY_MODELS + 1)]


def many_designs() -> list[NodeSnapshot]:
    # 63 models x 1-16 GPUs: 1,008 designs among 63 models.
    return [node(f"n{m}-{n}", f"NVIDIA H100 v{m}", n) for m in range(63) for n in range(1, 17)]


def many_cliques() -> list[NodeSnapshot]:
    count = MAX_SUMMARY_CLIQUES + 1
    return [node(f"n{i}", H100, 1, Fabric(cluster_uuid="c", clique_id=i)) for i in range(count)]


@pytest.mark.parametrize(
    ("nodes", "cut"),
    [
        pytest.param(long_names, {"names": 1}, id="a-long-design-name"),
        pytest.param(many_models, {"designs": 1, "free_gpus": 1}, id="65-models"),
        pytest.param(many_designs, {"designs": 8, "free_gpus": 8}, id="1008-designs"),
        pytest.param(many_cliques, {"cliques": 1}, id="10001-cliques"),
    ],
)
def test_a_region_past_a_limit_stays_fresh_and_routable(
    client: TestClient,
    tmp_path: Path,
    nodes: Callable[[], list[NodeSnapshot]],
    cut: dict[str, int],
) -> None:
    key = NodeKey.generate()
    key.save(tmp_path / "region.pem")
    created = client.post(
        "/v1/regions",
        json={
            "name": "big",
            "cloud": "aws",
            "url": "http://big.example",
            "public_key": key.public_key,
            "prices": [{"gpu_model": "H100", "on_demand": 2.0}],
            "egress": {"region_gb": 0.0, "internet_gb": 0.0},
        },
    )
    assert created.status_code == 201, created.text
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'region.db'}",
        federation_global="http://global.example",
        region_name="big",
        region_token=created.json()["token"],
        region_key=str(tmp_path / "region.pem"),
    )
    engine = sa.create_engine(settings.database_url)
    schema.metadata.create_all(engine)
    state = ServiceState(settings, engine)
    for snapshot in nodes():
        state.cluster.upsert(snapshot)
        state.heartbeats[snapshot.name] = state.clock()
    state.refresh_availability()
    region = SummaryPusher(state, settings)

    def to_global(request: httpx.Request) -> httpx.Response:
        answer = client.put(
            request.url.path,
            content=request.content,
            headers={
                "Authorization": request.headers["authorization"],
                "Content-Type": "application/json",
            },
        )
        return httpx.Response(answer.status_code, content=answer.content)

    async def push() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(to_global)) as to:
            await region.tick(to)

    asyncio.run(push())
    engine.dispose()
    assert region.pushed == 1
    shown = client.get("/v1/regions/big").json()["summary"]
    assert shown["stale"] is False
    assert shown["cut"] == {"designs": 0, "free_gpus": 0, "cliques": 0, "names": 0} | cut
    score = client.post("/v1/federation/score", json={"gpus": 1})
    assert score.status_code == 200, score.text
    (candidate,) = score.json()["candidates"]
    assert candidate["region"] == "big" and candidate["fits"] is True, candidate
