"""The httpx client of the Kubernetes API against a fake API server on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.k8s_objects import pod
from service.k8s import kube_api
from service.k8s.kube_api import HttpKubeApi, KubeApiError, KubeConfigError, from_kubeconfig
from tests.service.k8s.fake_api_server import FakeApiServer

TOKEN = "t0ken"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer(TOKEN).start()
    yield server
    server.stop()


def _kubeconfig(tmp_path: Path, server: str, user: str) -> Path:
    path = tmp_path / "config"
    path.write_text(
        f"""apiVersion: v1
kind: Config
current-context: c
clusters: [{{name: k, cluster: {{server: "{server}"}}}}]
users: [{{name: u, user: {user}}}]
contexts: [{{name: c, context: {{cluster: k, user: u}}}}]
"""
    )
    return path


def test_list_pods_follows_continue_tokens_and_skips_finished_pods(
    api: FakeApiServer, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(kube_api, "LIST_PAGE", 2)
    for i in range(5):
        api.add(pod(f"p{i}", 1))
    done = pod("done", 1)
    done["status"]["phase"] = "Succeeded"
    api.add(done)
    client = HttpKubeApi(api.url, token=lambda: TOKEN)
    names = sorted(p["metadata"]["name"] for p in client.list_pods())
    assert names == ["p0", "p1", "p2", "p3", "p4"]
    assert len(client.list_pods("elsewhere")) == 0


def test_errors_carry_the_status_and_the_api_servers_message(api: FakeApiServer):
    client = HttpKubeApi(api.url, token=lambda: TOKEN)
    with pytest.raises(KubeApiError) as refused:
        client.bind("ml-team", "missing", "", "n1", {})
    assert refused.value.status == 404 and refused.value.message == 'pods "missing" not found'
    assert client.get_pod("ml-team", "missing") is None
    anonymous = HttpKubeApi(api.url)
    with pytest.raises(KubeApiError) as unauthorized:
        anonymous.list_pods()
    assert unauthorized.value.status == 401


def test_an_unreachable_server_is_status_0():
    client = HttpKubeApi("http://127.0.0.1:9", timeout_s=0.5)
    with pytest.raises(KubeApiError) as failed:
        client.get_pod("a", "b")
    assert failed.value.status == 0


def test_kubeconfig_token_file_is_read_relative_to_the_file(api: FakeApiServer, tmp_path: Path):
    (tmp_path / "token").write_text(TOKEN + "\n")
    config = _kubeconfig(tmp_path, api.url, "{tokenFile: token}")
    api.add(pod("p0", 1))
    assert [p["metadata"]["name"] for p in from_kubeconfig(config).list_pods()] == ["p0"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("apiVersion: v1\nkind: Config\n", "no current-context"),
        ("current-context: c\ncontexts: []\n", "no context named 'c'"),
        ("{not: [yaml", "cannot read kubeconfig"),
    ],
)
def test_bad_kubeconfigs_say_what_is_wrong(tmp_path: Path, text: str, problem: str):
    path = tmp_path / "config"
    path.write_text(text)
    with pytest.raises(KubeConfigError, match=problem):
        from_kubeconfig(path)


def test_outside_a_cluster_in_cluster_config_is_refused(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError, match="TOPOPLACE_K8S_KUBECONFIG"):
        kube_api.in_cluster()
