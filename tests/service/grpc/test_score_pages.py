"""gRPC Score is bounded as REST /score is: too many nodes is refused unless paged."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from service.grpc.gen import topoplace_pb2 as pb
from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.grpc.conftest import Running, details, reason, snapshot_request, start

MAXIMUM = 3
FLEET = [("hgx-h100", f"h100-{n}") for n in range(4)] + [("pcie-8x-l40s", "l40s-0")]


@pytest.fixture
def bounded(settings: Settings, clock: FakeClock) -> Iterator[Running]:
    for running in start(settings.model_copy(update={"max_score_nodes": MAXIMUM}), clock):
        for profile, name in FLEET:
            running.stub.ReportSnapshot(snapshot_request(profile, name))
        yield running


def _refused(running: Running, request: pb.ScoreRequest) -> tuple[str, str]:
    with pytest.raises(grpc.RpcError) as refused:
        running.stub.Score(request)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    violations = details(refused.value)["BadRequest"].field_violations  # type: ignore[attr-defined]
    return reason(refused.value), violations[0].field


def test_an_answer_over_the_bound_is_refused(bounded: Running) -> None:
    assert _refused(bounded, pb.ScoreRequest(gpus=1)) == ("invalid_request", "limit")
    names = [name for _, name in FLEET] * 1000  # many names: refused, not answered
    request = pb.ScoreRequest(gpus=1, nodes=pb.NodeNames(names=names))
    assert _refused(bounded, request) == ("invalid_request", "limit")
    assert _refused(bounded, pb.ScoreRequest(gpus=1, limit=MAXIMUM + 1))[1] == "limit"
    assert _refused(bounded, pb.ScoreRequest(gpus=1, limit=0))[1] == "limit"
    assert _refused(bounded, pb.ScoreRequest(gpus=1, limit=2, offset=-1))[1] == "offset"


def test_within_the_bound_the_whole_answer_comes_at_once(bounded: Running) -> None:
    request = pb.ScoreRequest(gpus=1, nodes=pb.NodeNames(names=["h100-0", "l40s-0"]))
    answer = bounded.stub.Score(request)
    assert len(answer.nodes) == 2 and answer.total == 2 and answer.offset == 0
    assert not answer.HasField("next_offset")


def test_pages_are_slices_of_the_rest_ranking(bounded: Running) -> None:
    nodes: list[tuple[str, int, bool]] = []
    offset: int | None = 0
    while offset is not None:
        page = bounded.stub.Score(pb.ScoreRequest(gpus=8, limit=2, offset=offset))
        assert page.total == len(FLEET) and page.offset == offset and len(page.nodes) <= 2
        nodes += [(n.node, n.rank if n.HasField("rank") else -1, n.fits) for n in page.nodes]
        offset = page.next_offset if page.HasField("next_offset") else None
    rest = bounded.rest.post("/v1/score", params={"limit": MAXIMUM}, json={"gpus": 8}).json()
    rest_pages = rest["nodes"]
    rest_more = bounded.rest.post(
        "/v1/score", params={"limit": MAXIMUM, "offset": MAXIMUM}, json={"gpus": 8}
    ).json()
    rest_pages += rest_more["nodes"]
    want = [(n["node"], -1 if n["rank"] is None else n["rank"], n["fits"]) for n in rest_pages]
    assert nodes == want and len(nodes) == len(FLEET)
