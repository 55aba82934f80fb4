"""A global topoplace and three regions, each its own `topoplace serve` and SQLite file.

Ports come from 27000-27999 (a region's URL is registered before it starts,
so it cannot take any free port); each is checked free before use.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from agent.signing import NodeKey
from placement.profiles import build_profile
from service.federation.schemas import RegionSummary
from service.federation.signing import sign_summary
from tests.service.replica_processes import stop, wait_ready

GLOBAL_ADMIN = "global-admin-token-0123456789abcdef"
PORTS = range(27100, 27999)
STALE_S = 3.0


def loopback_port(taken: set[int]) -> int:
    for port in PORTS:
        if port in taken:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        taken.add(port)
        return port
    raise RuntimeError("no free port in 27100-27999")


@dataclass
class RegionSpec:
    name: str
    cloud: str
    nodes: tuple[tuple[str, str], ...]  # (profile, node name)
    prices: list[dict[str, Any]]
    egress: dict[str, float]


REGIONS = (
    RegionSpec(
        "onprem-dgx",
        "onprem",
        (("dgx-a100", "a100-1"), ("dgx-a100", "a100-2")),
        [{"gpu_model": "A100", "on_demand": 1.0}],
        {"region_gb": 0.0, "internet_gb": 0.05},
    ),
    RegionSpec(
        "aws-east",
        "aws",
        (("hgx-h100", "p5-1"), ("hgx-h100", "p5-2")),
        [{"gpu_model": "H100", "on_demand": 4.0, "spot": 1.5}],
        {"region_gb": 0.02, "internet_gb": 0.09},
    ),
    RegionSpec(
        "gcp-central",
        "gcp",
        (("hgx-h100", "a3-1"), ("pcie-8x-l40s", "g2-1")),
        [{"gpu_model": "H100", "on_demand": 3.0}, {"gpu_model": "L40S", "on_demand": 0.8}],
        {"region_gb": 0.01, "internet_gb": 0.12},
    ),
)


@dataclass
class Region:
    spec: RegionSpec
    url: str
    admin: str
    key: NodeKey
    token: str
    args: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin}"}

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.args, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None


@dataclass
class Federation:
    url: str
    proc: subprocess.Popen[bytes]
    regions: dict[str, Region] = field(default_factory=dict)
    headers: dict[str, str] = field(
        default_factory=lambda: {"Authorization": f"Bearer {GLOBAL_ADMIN}"}
    )

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", headers=self.headers, trust_env=False, **kwargs)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> httpx.Response:
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return httpx.post(
            f"{self.url}{path}", json=body, headers=headers, trust_env=False, timeout=30, **kwargs
        )

    def push(
        self, region: str, summary: dict[str, Any], key: NodeKey, token: str
    ) -> httpx.Response:
        summary = RegionSummary.model_validate(summary).model_dump(mode="json")
        body = {"summary": summary, "signature": sign_summary(key, summary)}
        return httpx.put(
            f"{self.url}/v1/regions/{region}/summary",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            trust_env=False,
        )


def _serve(port: int, database: Path, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "topoplace",
        "serve",
        "--port",
        str(port),
        "--no-grpc",
        "--database-url",
        f"sqlite:///{database}",
        *extra,
    ]


def load_nodes(region: Region) -> None:
    """The region's nodes, reported by its admin (nodes without keys), with heartbeats."""
    for profile, name in region.spec.nodes:
        snapshot = build_profile(profile, name).model_dump(mode="json")
        put = httpx.put(
            f"{region.url}/v1/nodes/{name}/snapshot",
            json={"snapshot": snapshot},
            headers=region.headers,
            trust_env=False,
        )
        assert put.status_code in (200, 201), put.text
        beat = httpx.post(
            f"{region.url}/v1/nodes/{name}/heartbeat", headers=region.headers, trust_env=False
        )
        assert beat.status_code in (200, 204), beat.text


def registration(spec: RegionSpec, url: str, key: NodeKey, forward: str) -> dict[str, Any]:
    return {
        "name": spec.name,
        "cloud": spec.cloud,
        "location": f"{spec.cloud}-site",
        "url": url,
        "public_key": key.public_key,
        "forward_token": forward,
        "prices": spec.prices,
        "egress": spec.egress,
        "labels": {"interconnect": "infiniband"},
    }


@contextlib.contextmanager
def federation(tmp: Path) -> Iterator[Federation]:
    taken: set[int] = set()
    port = loopback_port(taken)
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOPOPLACE_")}
    proc = subprocess.Popen(
        _serve(port, tmp / "global.sqlite3", ["--federation-stale-s", str(STALE_S)]),
        env={**base, "TOPOPLACE_BOOTSTRAP_ADMIN_TOKEN": GLOBAL_ADMIN},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    fed = Federation(f"http://127.0.0.1:{port}", proc)
    try:
        wait_ready(fed.url, proc, 90)
        for spec in REGIONS:
            region_port = loopback_port(taken)
            url = f"http://127.0.0.1:{region_port}"
            admin = f"{spec.name}-admin-token-0123456789"
            key = NodeKey.generate()
            key_file = tmp / f"{spec.name}.pem"
            key.save(key_file)
            created = fed.post("/v1/regions", registration(spec, url, key, admin))
            assert created.status_code == 201, created.text
            token_file = tmp / f"{spec.name}.token"
            token_file.write_text(created.json()["token"])
            args = _serve(
                region_port,
                tmp / f"{spec.name}.sqlite3",
                [
                    "--federation-global",
                    fed.url,
                    "--region-name",
                    spec.name,
                    "--region-token-file",
                    str(token_file),
                    "--region-key",
                    str(key_file),
                    "--federation-push-s",
                    "1",
                ],
            )
            env = {
                **base,
                "TOPOPLACE_BOOTSTRAP_ADMIN_TOKEN": admin,
                "TOPOPLACE_FEDERATION_CHECK_S": "0.2",
            }
            region = Region(spec, url, admin, key, created.json()["token"], args, env)
            region.start()
            fed.regions[spec.name] = region
        for region in fed.regions.values():
            assert region.proc is not None
            wait_ready(region.url, region.proc, 90)
            load_nodes(region)
        yield fed
    finally:
        for region in fed.regions.values():
            region.stop()
        stop(proc)


def summary_body(region: str, designs: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A summary as a region sends it, with a seq above any the region sent so far."""
    return {
        "region": region,
        "seq": time.time_ns() + extra.pop("ahead_ns", 0),
        "sent_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "designs": designs,
        "cliques": [],
        "stale_nodes": 0,
        "live_allocations": extra.pop("live_allocations", 0),
        "network_gbps": 25.0,
    }
