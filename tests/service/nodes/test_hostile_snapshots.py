"""Hostile snapshots: each is answered 2xx or a clear 4xx, a refused one stores
nothing, and the other node keeps serving."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from fastapi.testclient import TestClient

from placement.profiles import build_profile
from tests.service.helpers import add_nodes

Snap = dict[str, Any]


def _mutations() -> list[tuple[str, Callable[[Snap], None]]]:
    def set_(path: list[Any], value: Any) -> Callable[[Snap], None]:
        def apply(s: Snap) -> None:
            target: Any = s
            for p in path[:-1]:
                target = target[p]
            target[path[-1]] = value

        return apply

    def dup_gpu(s: Snap) -> None:
        s["gpus"][1]["uuid"] = s["gpus"][0]["uuid"]

    def dup_index(s: Snap) -> None:
        s["gpus"][1]["index"] = 0

    def gpu_uuid_is_mig(s: Snap) -> None:
        s["gpus"][1]["uuid"] = s["mig_instances"][0]["uuid"]

    def drop_gpu(s: Snap) -> None:
        s["gpus"].pop()

    def shuffle_gpus(s: Snap) -> None:
        s["gpus"].reverse()

    def mig_unknown_parent(s: Snap) -> None:
        s["mig_instances"][0]["parent_gpu"] = 42

    def mig_dup_uuid(s: Snap) -> None:
        s["mig_instances"][1]["uuid"] = s["mig_instances"][0]["uuid"]

    def link_row_short(s: Snap) -> None:
        s["links"][0] = s["links"][0][:-1]

    def link_extra_row(s: Snap) -> None:
        s["links"].append(list(s["links"][0]))

    def asym(s: Snap) -> None:
        s["links"][0][1] = "SYS"

    def diag(s: Snap) -> None:
        s["links"][0][0] = "NV12"

    def nic_short(s: Snap) -> None:
        s["nics"][0]["links"] = s["nics"][0]["links"][:-1]

    def nic_long(s: Snap) -> None:
        s["nics"][0]["links"] = s["nics"][0]["links"] + ["SYS"]

    def nic_dup(s: Snap) -> None:
        s["nics"].append(copy.deepcopy(s["nics"][0]))

    def cpu_link_unknown(s: Snap) -> None:
        s["cpu_links"] = [{"gpu": 42, "kind": "c2c"}]

    def cpu_link_dup(s: Snap) -> None:
        s["cpu_links"] = [{"gpu": 0, "kind": "c2c"}, {"gpu": 0, "kind": "c2c"}]

    def cpu_link_nan(s: Snap) -> None:
        s["cpu_links"] = [{"gpu": 0, "kind": "c2c", "bandwidth_gbps": float("nan")}]

    def numa_unknown(s: Snap) -> None:
        s["gpus"][0]["numa_node"] = 99

    def numa_dup_id(s: Snap) -> None:
        s["numa_nodes"][1]["id"] = s["numa_nodes"][0]["id"]

    def numa_empty(s: Snap) -> None:
        s["numa_nodes"] = []

    def numa_cpus_empty(s: Snap) -> None:
        s["numa_nodes"][0]["cpus"] = ""

    def mig_off_parent(s: Snap) -> None:
        s["gpus"][0]["mig_enabled"] = False

    def mig_overlap(s: Snap) -> None:
        s["mig_instances"][1]["placement_start"] = s["mig_instances"][0]["placement_start"]

    def mig_size0(s: Snap) -> None:
        s["mig_instances"][0]["placement_size"] = 0

    def fabric_bad(s: Snap) -> None:
        s["fabric"] = {"cluster_uuid": "", "clique_id": -1}

    def labels_bad(s: Snap) -> None:
        s["labels"] = {"": "x"}

    def labels_unicode(s: Snap) -> None:
        s["labels"] = {"zone": "\u00e9t\u00e9"}

    def gpu_unicode(s: Snap) -> None:
        s["gpus"][0]["model"] = "NVIDIA \u2603 \U0001f600"

    def region_unicode(s: Snap) -> None:
        s["region"] = "r\u00e9gion"

    def region_slash(s: Snap) -> None:
        s["region"] = "a/b"

    def minor_dup(s: Snap) -> None:
        s["gpus"][0]["minor_number"] = 3
        s["gpus"][1]["minor_number"] = 3

    def pci_dup(s: Snap) -> None:
        s["gpus"][1]["pci_bus_id"] = s["gpus"][0]["pci_bus_id"]

    def index_gap(s: Snap) -> None:
        s["gpus"][-1]["index"] = 63

    def mem_huge(s: Snap) -> None:
        s["gpus"][0]["memory_mib"] = 2**63

    def numa_mem_huge(s: Snap) -> None:
        s["numa_nodes"][0]["memory_mib"] = 2**40

    def seq_neg(s: Snap) -> None:
        s["seq"] = -1

    def ts_bad(s: Snap) -> None:
        s["timestamp"] = "9999-99-99"

    def ts_far(s: Snap) -> None:
        s["timestamp"] = "9999-12-31T23:59:59Z"

    def ts_past_year_9999_in_utc(s: Snap) -> None:
        s["timestamp"] = "9999-12-31T23:59:59-14:00"

    def ts_before_year_1_in_utc(s: Snap) -> None:
        s["timestamp"] = "0001-01-01T00:00:00+14:00"

    def ts_naive(s: Snap) -> None:
        s["timestamp"] = "2026-01-01T00:00:00"

    def health_bad(s: Snap) -> None:
        s["gpus"][0]["health"] = "sick"

    return [
        (f.__name__, f)
        for f in (
            dup_gpu,
            dup_index,
            gpu_uuid_is_mig,
            drop_gpu,
            shuffle_gpus,
            mig_unknown_parent,
            mig_dup_uuid,
            link_row_short,
            link_extra_row,
            asym,
            diag,
            nic_short,
            nic_long,
            nic_dup,
            cpu_link_unknown,
            cpu_link_dup,
            cpu_link_nan,
            numa_unknown,
            numa_dup_id,
            numa_empty,
            numa_cpus_empty,
            mig_off_parent,
            mig_overlap,
            mig_size0,
            fabric_bad,
            labels_bad,
            labels_unicode,
            gpu_unicode,
            region_unicode,
            region_slash,
            minor_dup,
            pci_dup,
            index_gap,
            mem_huge,
            numa_mem_huge,
            seq_neg,
            ts_bad,
            ts_far,
            ts_past_year_9999_in_utc,
            ts_before_year_1_in_utc,
            ts_naive,
            health_bad,
        )
    ] + [("gpus_null", set_(["gpus"], None)), ("links_nan", set_(["links", 0, 1], float("nan")))]


def test_hostile_snapshots_harm_nothing(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"), ("dgx-a100-mig", "m0"))
    base = build_profile("dgx-a100-mig", "x0").model_dump(mode="json")
    for i, (name, mutate) in enumerate(_mutations()):
        for node in (f"n{i}", "m0"):
            snap = copy.deepcopy(base)
            snap["name"] = node
            snap["seq"] = 10 + i
            # Fresh UUIDs so that a new node's report does not meet m0's.
            if node != "m0":
                for g in snap["gpus"]:
                    g["uuid"] = g["uuid"][:-4] + f"{i:04x}"
                for m in snap["mig_instances"]:
                    m["uuid"] = m["uuid"][:-4] + f"{i:04x}"
            before = client.get(f"/v1/nodes/{node}")
            mutate(snap)
            body = json.dumps({"snapshot": snap}, allow_nan=True)
            r = client.put(
                f"/v1/nodes/{node}/snapshot",
                content=body,
                headers={"content-type": "application/json"},
            )
            assert r.status_code < 500, (name, node, r.text[:500])
            if r.status_code >= 400:
                err = r.json()["error"]
                assert err["code"] and err["message"], (name, err)
                after = client.get(f"/v1/nodes/{node}")
                assert after.status_code == before.status_code, (name, after.text[:300])
                if before.status_code == 200:
                    assert after.json() == before.json(), name
    # Whatever was accepted or refused, every node still reads and h0 still serves.
    for node in [n["name"] for n in client.get("/v1/nodes").json()["nodes"]]:
        for path in (f"/v1/nodes/{node}/topology", f"/v1/nodes/{node}/topology.svg"):
            got = client.get(path)
            assert got.status_code == 200, (path, got.text[:300])
    placed = client.post("/v1/place", json={"gpus": 8, "nodes": ["h0"]})
    assert placed.status_code == 201, placed.text
    assert client.post("/v1/score", json={"gpus": 1}).status_code == 200
    mig = client.post("/v1/score", json={"gpus": 1, "mig_profile": "1g.10gb"})
    assert mig.status_code == 200, mig.text[:300]
