"""GET /v1/nodes/{name}/topology.svg: the picture, its holders, its refusals."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from placement.profiles import build_profile
from service.app import create_app
from service.settings import Settings
from tests.service.conftest import ADMIN_TOKEN, secured
from tests.service.helpers import add_nodes

SVG = "{http://www.w3.org/2000/svg}"


def _tree(response: object) -> ET.Element:
    return ET.fromstring(response.text)  # type: ignore[attr-defined]


def _by_data(root: ET.Element, attribute: str) -> dict[str, ET.Element]:
    return {e.attrib[attribute]: e for e in root.iter() if attribute in e.attrib}


def test_the_picture_is_svg_with_every_gpu_link_and_nic(client: TestClient) -> None:
    add_nodes(client, ("dgx1-v100", "v100-a"))
    response = client.get("/v1/nodes/v100-a/topology.svg")
    assert response.status_code == 200
    assert response.headers["content-type"] == "image/svg+xml"
    root = _tree(response)
    assert root.tag == f"{SVG}svg" and root.attrib["data-node"] == "v100-a"
    assert sorted(_by_data(root, "data-gpu"), key=int) == [str(g) for g in range(8)]
    links = _by_data(root, "data-nvlink")
    assert len(links) == 16 and links["0-3"].attrib["data-lanes"] == "2"
    assert set(_by_data(root, "data-nic")) == {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}
    assert {e.attrib["data-island"] for e in _by_data(root, "data-gpu").values()} == {"nvl0"}


def test_gpus_are_coloured_by_the_allocation_that_holds_them(client: TestClient) -> None:
    add_nodes(client, ("dgx1-v100", "v100-a"))
    placed = client.post("/v1/place", json={"gpus": 2, "job_id": "train-<7>", "owner": "ann"})
    assert placed.status_code == 201, placed.text
    allocation = placed.json()
    held = allocation["tasks"][0]["gpu_indices"]
    root = _tree(client.get("/v1/nodes/v100-a/topology.svg"))
    gpus = _by_data(root, "data-gpu")
    holders = {int(g): e.attrib.get("data-allocation") for g, e in gpus.items()}
    assert {g for g, a in holders.items() if a == allocation["id"]} == set(held)
    assert all(a is None for g, a in holders.items() if g not in held)
    # The job id is text in the document, escaped, not markup.
    assert "train-&lt;7&gt;" in client.get("/v1/nodes/v100-a/topology.svg").text

    released = client.post(f"/v1/allocations/{allocation['id']}/release")
    assert released.status_code == 200
    root = _tree(client.get("/v1/nodes/v100-a/topology.svg"))
    assert not any("data-allocation" in e.attrib for e in _by_data(root, "data-gpu").values())


def test_an_unknown_node_is_a_json_404(client: TestClient) -> None:
    response = client.get("/v1/nodes/no-such-node/topology.svg")
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error"]["code"] == "not_found"
    assert "no-such-node" in response.json()["error"]["message"]


@pytest.fixture
def open_app(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(secured(settings), background=False)) as test_client:
        yield test_client


def test_the_picture_needs_a_token_and_a_viewer_may_read_it(open_app: TestClient) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    for name in ("v100-a",):
        add_nodes(TestClient(open_app.app, headers=admin), ("dgx1-v100", name))
    refused = open_app.get("/v1/nodes/v100-a/topology.svg")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
    made = open_app.post("/v1/tokens", json={"role": "viewer", "name": "wall"}, headers=admin)
    assert made.status_code == 201, made.text
    viewer = {"Authorization": f"Bearer {made.json()['token']}"}
    assert open_app.get("/v1/nodes/v100-a/topology.svg", headers=viewer).status_code == 200


def test_the_legend_names_pcie_groups_as_such() -> None:
    from service.console.topology_svg import render_svg
    from service.console.wiring import lay_out
    from tests.service.console.test_wiring import _island_of

    pcie = build_profile("pcie-8x-l40s", "l40s-a")
    svg = render_svg(lay_out(pcie, _island_of(pcie), {}))
    assert "PCIe groups: pcie0: GPU 0, 1, 2, 3; pcie1: GPU 4, 5, 6, 7" in svg
    assert "NVLink islands" not in svg
    pair = build_profile("dgx1-v100", "d")
    assert "NVLink islands: nvl0" in render_svg(lay_out(pair, _island_of(pair), {}))


@pytest.mark.parametrize("job_id", ["job-\ufffe", "job-\uffff", "job-\u2028<x>"])
def test_a_job_id_xml_cannot_carry_leaves_the_picture_well_formed(
    client: TestClient, job_id: str
) -> None:
    """A job id is any text without control characters, and any caller who may place
    names one: U+FFFE and U+FFFF are no XML characters, and written as they are they
    made the node's picture unreadable for every reader, the console's included."""
    add_nodes(client, ("dgx1-v100", "v100-a"))
    placed = client.post("/v1/place", json={"gpus": 2, "job_id": job_id})
    assert placed.status_code == 201, placed.text
    response = client.get("/v1/nodes/v100-a/topology.svg")
    root = _tree(response)
    held = [e for e in _by_data(root, "data-gpu").values() if "data-allocation" in e.attrib]
    assert len(held) == 2
