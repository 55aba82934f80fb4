"""A region's summary of its in-memory cluster: designs, islands, cliques, stale nodes."""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa

from agent.signing import MESSAGE_PREFIX, NodeKey
from placement.profiles import build_profile, gb200_nvl72_rack
from service.federation.schemas import RegionSummary
from service.federation.signing import sign_summary, summary_message, verify_summary
from service.federation.summary import change_key, content_of, summarize
from service.settings import Settings
from service.state import ServiceState


def cluster() -> ServiceState:
    state = ServiceState(Settings(database_url="sqlite://"), sa.create_engine("sqlite://"))
    snapshots = [build_profile("hgx-h100", "h1"), build_profile("hgx-h100", "h2")]
    snapshots += gb200_nvl72_rack("rack", clique_id=3)[:3]
    now = state.clock()
    for snapshot in snapshots:
        state.cluster.upsert(snapshot)
        state.heartbeats[snapshot.name] = now
    state.refresh_availability()
    return state


def test_free_gpus_islands_and_cliques() -> None:
    state = cluster()
    h1 = state.cluster.node("h1").snapshot
    state.cluster.allocate("h1", tuple(g.uuid for g in h1.gpus[:3]))
    tray = next(v.name for v in state.cluster.nodes() if v.snapshot.fabric is not None)
    tray_gpus = state.cluster.node(tray).snapshot.gpus
    state.cluster.allocate(tray, (tray_gpus[0].uuid,))
    body = summarize(state, "aws-east", 7, state.clock(), live=2)
    RegionSummary.model_validate(body)  # what the region sends, the global service takes
    h100 = next(d for d in body["designs"] if "H100" in d["gpu_model"])
    assert h100["nodes"] == 2 and h100["free_gpus"] == 13
    assert h100["by_island"] == {"5": 1, "8": 1} and h100["island_gbps"] == 450.0
    (clique,) = body["cliques"]
    assert clique["nodes"] == 3 and clique["free_nodes"] == 2
    assert body["live_allocations"] == 2 and body["stale_nodes"] == 0


def test_gpus_without_nvlink_offer_islands_of_one() -> None:
    # PCIe groups (placement/islands.py) are no NVLink islands: a task of 2 fits none.
    state = ServiceState(Settings(database_url="sqlite://"), sa.create_engine("sqlite://"))
    state.cluster.upsert(build_profile("pcie-8x-l40s", "l1"))
    state.heartbeats["l1"] = state.clock()
    state.refresh_availability()
    (design,) = summarize(state, "aws-east", 1, state.clock(), live=0)["designs"]
    assert design["design"].endswith("x8 nvl[1+1+1+1+1+1+1+1]")
    assert design["by_island"] == {"1": 1}


def test_a_stale_node_is_counted_and_offers_nothing() -> None:
    state = cluster()
    state.heartbeats["h2"] = state.clock() - timedelta(seconds=3600)
    state.refresh_availability()
    body = summarize(state, "aws-east", 1, state.clock(), live=0)
    h100 = next(d for d in body["designs"] if "H100" in d["gpu_model"])
    assert body["stale_nodes"] == 1 and h100["free_gpus"] == 8 and h100["by_island"] == {"8": 1}


def test_the_content_ignores_seq_and_time() -> None:
    state = cluster()
    first = summarize(state, "r", 1, state.clock(), 0)
    again = summarize(state, "r", 2, state.clock() + timedelta(seconds=5), 0)
    assert first != again and content_of(first) == content_of(again)


def test_a_summary_signature_is_not_a_snapshot_signature() -> None:
    key = NodeKey.generate()
    body = RegionSummary.model_validate(summarize(cluster(), "r", 1, cluster().clock(), 0))
    summary = body.model_dump(mode="json")
    signature = sign_summary(key, summary)
    assert verify_summary(key.public_key, summary, signature)
    assert not verify_summary(key.public_key, {**summary, "seq": 2}, signature)
    assert not verify_summary(NodeKey.generate().public_key, summary, signature)
    assert not summary_message(summary).startswith(MESSAGE_PREFIX)
    assert not verify_summary(key.public_key, summary, key.sign(summary))  # a snapshot's


def test_the_change_key_moves_with_holds_and_availability() -> None:
    state = cluster()
    before = change_key(state)
    assert change_key(state) == before
    h1 = state.cluster.node("h1").snapshot
    state.cluster.allocate("h1", (h1.gpus[0].uuid,))
    held = change_key(state)
    assert held != before
    state.heartbeats["h2"] = state.clock() - timedelta(seconds=3600)
    state.refresh_availability()
    assert change_key(state) != held
