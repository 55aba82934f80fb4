"""The service, a test kubelet and ``topoplace device-plugin`` as a subprocess, wired together.

The service runs for real (uvicorn on a loopback port, SQLite in a temporary
folder) with the in-memory Kubernetes API of the extender tests; the plugin
reads its node from a snapshot JSON file (``--source smi:FILE``, re-read
every round, so a test can make a GPU unhealthy or vanish) and talks to the
test kubelet over unix sockets in a short temporary folder (a unix socket
path has at most 107 bytes).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.deviceplugin.container import ContainerOptions
from agent.deviceplugin.daemon import DevicePluginDaemon, PluginSettings, ServiceLink
from agent.deviceplugin.mig_caps import MIG_MINORS
from agent.sources import Source
from bench.k8s_objects import binding_args, names_args, pod
from placement import NodeSnapshot
from placement.profiles import build_profile
from service.app import create_app
from service.k8s.settings import ExtenderSettings
from service.settings import Settings
from tests.agent.deviceplugin.fake_kubelet import FakeKubelet
from tests.live_server import live_server
from tests.service.k8s.fake_kube import FakeKubeApi
from topoplace_client.api import TopoplaceClient

ROOT = Path(__file__).resolve().parents[3]


class Cluster:
    def __init__(self, url: str, kube: FakeKubeApi, folder: Path) -> None:
        self.url = url
        self.kube = kube
        self.folder = folder
        self.http = httpx.Client(base_url=url, timeout=10, trust_env=False)
        self.snapshots: dict[str, NodeSnapshot] = {}

    def add_node(self, profile: str, name: str) -> NodeSnapshot:
        snap = build_profile(profile, name)
        self.report(snap)
        return snap

    def report(self, snap: NodeSnapshot) -> None:
        self.snapshots[snap.name] = snap
        body = {"snapshot": snap.model_dump(mode="json")}
        answer = self.http.put(f"/v1/nodes/{snap.name}/snapshot", json=body)
        assert answer.status_code == 200, answer.text

    def schedule(
        self, name: str, count: int, node: str, resource: str = "nvidia.com/gpu", **kw: Any
    ) -> dict[str, Any]:
        """kube-scheduler's calls for one pod: filter, prioritize, bind; the bound pod."""
        p = self.kube.add(pod(name, count, resource=resource, **kw))
        nodes = sorted(self.snapshots)
        passed = self.http.post("/k8s/v1/filter", json=names_args(p, nodes)).json()
        assert node in passed["NodeNames"], passed
        scores = self.http.post("/k8s/v1/prioritize", json=names_args(p, passed["NodeNames"]))
        assert scores.status_code == 200
        bound = self.http.post("/k8s/v1/bind", json=binding_args(p, node)).json()
        assert bound == {"Error": ""}, bound
        found = self.kube.get_pod(p["metadata"]["namespace"], name)
        assert found is not None
        return found

    def reservations(self, node: str) -> list[dict[str, Any]]:
        answer = self.http.get(f"/v1/nodes/{node}/k8s/reservations")
        assert answer.status_code == 200, answer.text
        found: list[dict[str, Any]] = answer.json()["reservations"]
        return found


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'topoplace.sqlite3'}",
        heartbeat_ttl_s=600,
        reservation_ttl_s=120,
    )
    app = create_app(settings)
    app.state.k8s_settings = ExtenderSettings(reconcile_interval_s=0)
    kube = FakeKubeApi()
    app.state.k8s_api = kube
    folder = Path(tempfile.mkdtemp(prefix="tpdp", dir="/tmp"))
    with live_server(app) as url:
        c = Cluster(url, kube, folder)
        yield c
        c.http.close()
    shutil.rmtree(folder, ignore_errors=True)


class PluginProcess:
    def __init__(self, cluster: Cluster, node: str, *extra: str) -> None:
        self.cluster = cluster
        self.node = node
        self.extra = extra
        self.source = cluster.folder / f"{node}.json"
        self.log = cluster.folder / f"{node}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def write_node(self, snap: NodeSnapshot) -> None:
        tmp = self.source.with_suffix(".tmp")
        tmp.write_text(json.dumps(snap.model_dump(mode="json")))
        tmp.replace(self.source)  # the plugin never reads half a file

    def start(self, server: str | None = None) -> PluginProcess:
        self.write_node(self.cluster.snapshots[self.node])
        args = [
            sys.executable, "-m", "topoplace", "device-plugin",
            "--server", server or self.cluster.url,
            "--node-name", self.node,
            "--source", f"smi:{self.source}",
            "--kubelet-dir", str(self.cluster.folder / "dp"),
            "--pod-resources-socket", str(self.cluster.folder / "pr.sock"),
            "--interval", "0.2",
            "--reconcile-interval", "0.5",
            "--timeout", "2",
            *self.extra,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@pytest.fixture
def kubelet(cluster: Cluster) -> Iterator[FakeKubelet]:
    (cluster.folder / "dp").mkdir()
    k = FakeKubelet(cluster.folder / "dp", cluster.folder / "pr.sock").start()

    def started(namespace: str, name: str) -> None:
        found = cluster.kube.pods.get((namespace, name))
        if found is not None and "startTime" not in found.get("status", {}):
            cluster.kube.start(namespace, name)

    k.on_admit = started
    yield k
    k.close()


@pytest.fixture
def plugins(cluster: Cluster) -> Iterator[list[PluginProcess]]:
    started: list[PluginProcess] = []
    yield started
    for p in started:
        p.stop()


def offline_daemon(
    node: str, source: Source, device_specs: bool, mig_minors: Path = MIG_MINORS
) -> DevicePluginDaemon:
    """The plugin's daemon in process, for its device reads only: no kubelet, and a
    service address nothing listens on (no truth round runs)."""
    client = TopoplaceClient("http://127.0.0.1:9")
    settings = PluginSettings(
        node=node,
        resources=(),
        whole_gpu_resource="nvidia.com/gpu",
        kubelet_dir=Path("/nonexistent"),
        pod_resources_socket=Path("/nonexistent.sock"),
        options=ContainerOptions(device_specs=device_specs),
        mig_minors=mig_minors,
    )
    return DevicePluginDaemon(settings, source, ServiceLink(node, client, client))
