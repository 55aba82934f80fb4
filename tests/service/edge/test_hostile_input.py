"""Hostile input across the general REST API: never a 500, always the error shape."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.helpers import add_nodes

JSON = {"content-type": "application/json"}


def _check(response: Any, what: str) -> None:
    assert response.status_code < 500, (what, response.status_code, response.text[:400])
    if response.status_code >= 400:
        body = response.json()
        assert set(body["error"]) >= {"code", "message"}, (what, body)


BODIES: list[bytes] = [
    b"",
    b"null",
    b"[]",
    b'"x"',
    b"1",
    b"{",
    b'{"gpus": NaN}',
    b'{"gpus": Infinity}',
    b'{"gpus": -Infinity}',
    b'{"gpus": 1, "ttl_s": NaN}',
    b'{"gpus": 1, "ttl_s": Infinity}',
    b'{"gpus": 1, "gpus": 2}',
    b'{"gpus": 1e400}',
    b'{"gpus": 99999999999999999999999}',
    b'{"gpus": -1}',
    b'{"gpus": 0}',
    b'{"gpus": 1.5}',
    b'{"gpus": 2147483648}',
    b'{"tasks": 2147483647, "gpus": 1}',
    b'{"tasks": 100000, "gpus": 1}',
    b'{"gpus": 1, "job_id": "\xc3\xa9\xe2\x98\x83\xf0\x9f\x98\x80"}',
    b'{"gpus": 1, "job_id": "\xff\xfe"}',
    b'{"gpus": 1, "owner": {"a": 1}}',
    b'{"gpus": 1, "nodes": "h0"}',
    b'{"gpus": 1, "nodes": [1]}',
    b'{"gpus": 1, "nodes": [null]}',
    b'{"gpus": 1, "node_labels": {"a": 1}}',
    b'{"gpus": 1, "node_labels": []}',
    b'{"gpus": 1, "mig_profile": "1g.5gb", "gpu_fraction": 0.5}',
    b'{"gpus": 1, "gpu_fraction": NaN}',
    b'{"gpus": 1, "gpu_fraction": 0}',
    b'{"gpus": 1, "gpu_fraction": 1e-320}',
    b'{"gpus": 2, "gpu_fraction": 0.5}',
    b'{"gpus": 1, "min_gpu_memory_mib": 9223372036854775808}',
    b'{"gpus": 1, "ttl_s": 1e9}',
    b'{"gpus": 1, "ttl_s": 1e308}',
    b'{"gpus": 1, "cpus_per_task": 2147483647}',
    b'{"gpus": 1, "memory_mib": 2147483647}',
    b'{"gpus": 1, "cpu_milli": 2147483647}',
    b'{"gpus": 1, "x": 1}',
    b'{"\xc3\xa9": 1}',
    b'{"gpus": 1, "job_id": "' + b"a" * 5000 + b'"}',
    b'{"gpus": 1, "owner": "' + b"\\u202e" + b'"}',
    b'{"gpus": 1, "regions": [""]}',
    b'{"gpus": 1, "exclude_nodes": ["h0"], "nodes": ["h0"]}',
    b"[" * 70 + b"]" * 70,
    b'{"a":' * 60 + b"1" + b"}" * 60,
]


@pytest.fixture
def cluster(client: TestClient) -> TestClient:
    add_nodes(client, ("hgx-h100", "h0"), ("dgx-a100-mig", "m0"))
    return client


def test_place_and_score_bodies(cluster: TestClient) -> None:
    for body in BODIES:
        for path in ("/v1/place", "/v1/score", "/v1/federation/place", "/v1/federation/score"):
            _check(cluster.post(path, content=body, headers=JSON), f"{path} {body[:80]!r}")
        _check(
            cluster.post("/v1/place", content=body, headers={**JSON, "Idempotency-Key": "k1"}),
            f"idem {body[:80]!r}",
        )


def test_extend_bodies(cluster: TestClient) -> None:
    placed = cluster.post("/v1/place", json={"gpus": 1}).json()
    for body in [
        b'{"ttl_s": NaN}',
        b'{"ttl_s": Infinity}',
        b'{"ttl_s": 1e308}',
        b'{"ttl_s": 1e9}',
        b'{"ttl_s": 99999999999999999999999999}',
        b'{"ttl_s": -5}',
        b'{"ttl_s": 30, "ttl_s": 40}',
        b"{}",
        b"null",
        b"",
    ]:
        _check(
            cluster.post(f"/v1/allocations/{placed['id']}/extend", content=body, headers=JSON),
            repr(body),
        )


PATH_VALUES = [
    "0",
    "-1",
    "9223372036854775808",
    "18446744073709551616",
    "%C3%A9",
    "%F0%9F%98%80",
    "a" * 64,
    "a" * 65,
    "a" * 300,
    "%25",
    "%2F",
    "..",
    ".",
    "%20",
    "%FF",
    "%ED%A0%80",
    "null",
    "1e5",
]


def test_path_parameters(cluster: TestClient) -> None:
    for value in PATH_VALUES:
        for method, path in [
            ("GET", "/v1/allocations/{}"),
            ("POST", "/v1/allocations/{}/confirm"),
            ("POST", "/v1/allocations/{}/release"),
            ("POST", "/v1/jobs/{}/release"),
            ("GET", "/v1/nodes/{}"),
            ("DELETE", "/v1/nodes/{}"),
            ("GET", "/v1/nodes/{}/topology"),
            ("GET", "/v1/nodes/{}/topology.svg"),
            ("GET", "/v1/nodes/{}/snapshots"),
            ("GET", "/v1/nodes/{}/nvlink"),
            ("GET", "/v1/nodes/{}/key"),
            ("DELETE", "/v1/nodes/{}/key"),
            ("POST", "/v1/nodes/{}/cordon"),
            ("POST", "/v1/nodes/{}/uncordon"),
            ("POST", "/v1/nodes/{}/heartbeat"),
            ("GET", "/v1/regions/{}"),
            ("DELETE", "/v1/tokens/{}"),
        ]:
            url = path.format(value)
            _check(cluster.request(method, url), f"{method} {url}")
        _check(
            cluster.post(f"/v1/allocations/{value}/extend", json={"ttl_s": 30}),
            f"extend {value}",
        )


QUERIES = [
    "limit=0",
    "limit=-1",
    "limit=abc",
    "limit=1e3",
    "limit=99999999999999999999999",
    "limit=10001",
    "limit=",
    "limit=1&limit=2",
    "limit=NaN",
    "state=bogus",
    "state=",
    "state=pending&state=active",
    "job_id=",
    "node=",
    "job_id=%C3%A9",
    "node=%25",
    "job_id=" + "a" * 300,
    "node=%FF",
    "job_id=%ED%A0%80",
    "since=abc",
    "until=abc",
    "since=99999999999999999999",
    "cursor=abc",
    "cursor=%FF",
    "cursor=" + "a" * 500,
    "cursor=MQ",
    "cursor=eyJ4IjogMX0",
    "since=-1",
    "since=1e400",
    "offset=-1",
    "offset=99999999999999999999",
    "kind=%00",
    "since=9999-12-31T23:59:59-14:00",
    "until=0001-01-01T00:00:00%2B14:00",
    "since=9999-12-31T23:59:59Z&until=0001-01-01T00:00:00Z",
    "since=2026-01-01T00:00:00",
    "since=10000000000000",
]


def test_query_parameters(cluster: TestClient) -> None:
    for query in QUERIES:
        for path in (
            "/v1/allocations",
            "/v1/nodes",
            "/v1/audit",
            "/v1/cluster",
            "/v1/tokens",
            "/v1/regions",
            "/v1/nodes/h0/snapshots",
        ):
            _check(cluster.get(f"{path}?{query}"), f"{path}?{query}")
        _check(cluster.post(f"/v1/score?{query}", json={"gpus": 1}), f"score?{query}")


GENERIC = [
    b"",
    b"null",
    b"[]",
    b'"x"',
    b"{",
    b"{}",
    b'{"a": NaN}',
    b"[" * 70 + b"]" * 70,
]


H100 = b'{"gpu_model": "H100", "on_demand": 1}'


def _region(url: bytes, prices: bytes) -> bytes:
    return (
        b'{"name": "r1", "cloud": "aws", "url": "' + url + b'", "public_key": "AAAA", '
        b'"prices": [' + prices + b"]}"
    )


def test_other_write_bodies(cluster: TestClient) -> None:
    specific: dict[tuple[str, str], list[bytes]] = {
        ("POST", "/v1/tokens"): [
            b'{"role": "agent", "nodes": ["h0", "h0"]}',
            b'{"role": "agent", "nodes": [""]}',
            b'{"role": "agent", "region": ""}',
            b'{"role": "agent", "nodes": ["h0"], "region": "r"}',
            b'{"role": "region"}',
            b'{"role": "admin", "nodes": ["h0"]}',
            b'{"role": "admin", "name": NaN}',
            b'{"role": "bogus"}',
            b'{"role": "agent", "nodes": ["\xc3\xa9"]}',
            b'{"role": "agent", "nodes": ["a.b"], "role": "admin"}',
            b'{"role": 1}',
            b'{"role": "scheduler", "region": "x"}',
        ],
        ("PUT", "/v1/nodes/h0/key"): [
            b'{"algorithm": "ed25519", "public_key": "AAAA"}',
            b'{"algorithm": "ed25519", "public_key": "!!!"}',
            b'{"algorithm": "rsa", "public_key": "AAAA"}',
            b'{"algorithm": "ed25519", "public_key": ""}',
            b'{"algorithm": "ed25519", "public_key": "' + b"A" * 100000 + b'"}',
            b'{"algorithm": "ed25519", "public_key": "' + b"A" * 43 + b'="}',
            b'{"algorithm": "ed25519", "public_key": "' + b"A" * 43 + b'"}',
            b'{"algorithm": "ed25519", "public_key": "' + b"A" * 42 + b'=="}',
        ],
        ("POST", "/v1/nodes/h0/heartbeat"): [
            b'{"nvlink": [{"gpu": 0, "link": 0, "tx_bytes": 18446744073709551615}]}',
            b'{"nvlink": [{"gpu": 0, "link": 0, "tx_bytes": 18446744073709551616}]}',
            b'{"nvlink": [{"gpu": 99, "link": 0}]}',
            b'{"nvlink": [{"gpu": 7, "link": 17}]}',
            b'{"nvlink": [{"gpu": 0, "link": 0}, {"gpu": 0, "link": 0}]}',
            b'{"nvlink": [{"gpu": 0, "link": 0, "tx_bytes": NaN}]}',
            b'{"nvlink": [{"gpu": 0, "link": 0, "tx_bytes": 1.5}]}',
            b'{"nvlink": null}',
        ],
        ("POST", "/v1/regions"): [
            _region(b"http://x", b'{"gpu_model": "H100", "on_demand": NaN}'),
            _region(b"ftp://x", H100),
            _region(b"http://[::1", H100),
            _region(b"http://x:99999", H100),
            _region(b"http://x", H100 + b", " + H100),
        ],
        ("PATCH", "/v1/regions/r1"): [
            b'{"url": null}',
            b'{"url": "http://x:99999"}',
            b'{"forward_token": ""}',
        ],
        ("PUT", "/v1/regions/r1/summary"): [b'{"seq": -1}', b'{"seq": 1e400}'],
        ("POST", "/v1/regions/r1/retire"): [b'{"x": 1}'],
    }
    for (method, path), extra in specific.items():
        for body in GENERIC + extra:
            _check(
                cluster.request(method, path, content=body, headers=JSON),
                f"{method} {path} {body[:120]!r}",
            )


CONTENT_TYPES = [
    None,
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/json; charset=latin-1",
    "application/json; charset=utf-16",
    "application/merge-patch+json",
    "application/json, text/plain",
    "",
]


def test_content_types(cluster: TestClient) -> None:
    bodies = [b'{"gpus": 1, "owner": "\xe9"}', '{"gpus": 1}'.encode("utf-16"), b"gpus=1"]
    for content_type in CONTENT_TYPES:
        headers = {} if content_type is None else {"content-type": content_type}
        for body in bodies:
            for method, path in [
                ("POST", "/v1/place"),
                ("POST", "/v1/score"),
                ("POST", "/v1/tokens"),
                ("PUT", "/v1/nodes/h0/snapshot"),
                ("POST", "/v1/nodes/h0/heartbeat"),
                ("PUT", "/v1/nodes/h0/key"),
                ("POST", "/v1/regions"),
            ]:
                response = cluster.request(method, path, content=body, headers=headers)
                _check(response, f"{method} {path} {content_type} {body[:20]!r}")
