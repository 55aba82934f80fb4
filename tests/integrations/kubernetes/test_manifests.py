"""The Kubernetes manifests parse, hang together, and point the scheduler at real routes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from service.app import create_app
from service.k8s.kube_api import RBAC_RULES
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[3] / "integrations" / "kubernetes"


def _documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / name).read_text()) if d is not None]


def _kustomization() -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load((ROOT / "kustomization.yaml").read_text())
    return found


def _objects() -> list[dict[str, Any]]:
    return [d for name in _kustomization()["resources"] for d in _documents(name)]


def _one(kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in _objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _scheduler_config() -> dict[str, Any]:
    (config,) = _documents("kube-scheduler-config.yaml")
    return config


def _container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in spec["containers"] if c["name"] == name]
    return found


def test_every_manifest_parses_and_is_named():
    files = sorted(p.name for p in ROOT.glob("*.yaml"))
    assert files, "no manifests found"
    for name in files:
        for doc in _documents(name):
            assert doc.get("apiVersion") and doc.get("kind"), name
            if doc["kind"] not in ("Kustomization", "KubeSchedulerConfiguration"):
                assert doc["metadata"]["name"], name


def test_the_kustomization_uses_every_file_and_only_existing_ones():
    k = _kustomization()
    used = set(k["resources"]) | {f for g in k["configMapGenerator"] for f in g["files"]}
    on_disk = {p.name for p in ROOT.glob("*.yaml")} - {"kustomization.yaml"}
    assert used == on_disk
    # Everything lands in one namespace, which the kustomization also creates.
    assert k["namespace"] == "topoplace"
    assert _one("Namespace", "topoplace")


def test_the_extender_stanza_matches_the_service_routes():
    (extender,) = _scheduler_config()["extenders"]
    app = create_app(Settings(database_url="sqlite://"), background=False)
    routes = {(path, m.upper()) for path, ops in app.openapi()["paths"].items() for m in ops}
    prefix = "/" + extender["urlPrefix"].split("://", 1)[1].split("/", 1)[1]
    for key in ("filterVerb", "prioritizeVerb", "bindVerb", "preemptVerb"):
        assert (f"{prefix}/{extender[key]}", "POST") in routes, key
    assert extender["nodeCacheCapable"] is True
    assert {"name": "nvidia.com/gpu", "ignoredByScheduler": False} in extender["managedResources"]
    assert all(r["name"].startswith("nvidia.com/") for r in extender["managedResources"])
    assert extender["httpTimeout"].endswith("s") and 0 < float(extender["httpTimeout"][:-1]) <= 5
    assert extender["weight"] >= 1 and extender["ignorable"] is False
    assert set(extender) <= {
        "urlPrefix",
        "filterVerb",
        "prioritizeVerb",
        "bindVerb",
        "preemptVerb",
        "weight",
        "enableHTTPS",
        "tlsConfig",
        "httpTimeout",
        "nodeCacheCapable",
        "managedResources",
        "ignorable",
    }


def test_the_extender_url_reaches_the_service():
    (extender,) = _scheduler_config()["extenders"]
    host_port = extender["urlPrefix"].split("://", 1)[1].split("/", 1)[0]
    host, port = host_port.split(":")
    service_name, namespace = host.split(".")[:2]
    service = _one("Service", service_name)
    assert service["metadata"]["namespace"] == namespace
    assert int(port) in {p["port"] for p in service["spec"]["ports"]}
    # One active scheduler sticks to one replica: filter, prioritize and bind meet there.
    assert service["spec"]["sessionAffinity"] == "ClientIP"


def test_the_scheduler_profile_and_deployment_agree():
    config = _scheduler_config()
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    (profile,) = config["profiles"]
    deployment = _one("Deployment", "topoplace-scheduler")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    (flag,) = [a for a in container["command"] if a.startswith("--config=")]
    mount = container["volumeMounts"][0]
    assert flag == f"--config={mount['mountPath']}/kube-scheduler-config.yaml"
    volume = deployment["spec"]["template"]["spec"]["volumes"][0]
    assert volume["configMap"]["name"] == _kustomization()["configMapGenerator"][0]["name"]
    assert profile["schedulerName"] == "topoplace-scheduler"


def test_the_service_runs_two_replicas_with_the_extender_open():
    deployment = _one("Deployment", "topoplace")
    assert deployment["spec"]["replicas"] == 2
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["TOPOPLACE_K8S_EXTENDER_OPEN"]["value"] == "true"
    assert env["TOPOPLACE_MIGRATE_ON_START"]["value"] == "false"
    assert env["TOPOPLACE_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "topoplace-db-app"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # Postgres is the CloudNativePG cluster whose app Secret the service reads.
    cluster = _one("Cluster", "topoplace-db")
    assert cluster["apiVersion"] == "postgresql.cnpg.io/v1"
    assert cluster["spec"]["bootstrap"]["initdb"]["database"] == "topoplace"


def test_rbac_grants_exactly_what_the_client_uses():
    role = _one("ClusterRole", "topoplace-extender")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    used = {(g, r, v) for g, r, verbs in RBAC_RULES for v in verbs}
    assert granted == used
    binding = _one("ClusterRoleBinding", "topoplace-extender")
    deployment = _one("Deployment", "topoplace")
    (subject,) = binding["subjects"]
    assert subject["name"] == deployment["spec"]["template"]["spec"]["serviceAccountName"]


def test_the_agent_runs_on_gpu_nodes_with_nvml():
    agent = _one("DaemonSet", "topoplace-agent")
    spec = agent["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["runtimeClassName"] == "nvidia"
    container = _container(spec, "agent")
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]
    assert "nvidia.com/gpu" not in str(container.get("resources"))  # reads NVML, holds no GPU


def test_the_agent_command_is_one_the_agent_accepts():
    """The DaemonSet's args parse with the real `topoplace agent` parser, and the key
    the init container makes on the node is the one the agent signs with."""
    from topoplace.cli import build_parser

    spec = _one("DaemonSet", "topoplace-agent")["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    container = _container(spec, "agent")
    args = build_parser().parse_args(container["args"][1:])
    assert args.server.startswith("https://topoplace.") and args.ca_bundle
    key_file = str(args.key_file)
    assert key_file in init["command"] and args.token_file
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert key_file.startswith(mounts["node-key"])
    assert {m["name"] for m in init["volumeMounts"]} == {"node-key"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["node-key"]["hostPath"]["path"] == mounts["node-key"]


def test_the_init_container_keeps_the_node_key_across_restarts(tmp_path: Path) -> None:
    """The init container's command as shipped, run twice on one node directory: the
    second start keeps the key the first made (the service refuses any other)."""
    import subprocess
    import sys

    spec = _one("DaemonSet", "topoplace-agent")["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    (mount,) = [m["mountPath"] for m in init["volumeMounts"] if m["name"] == "node-key"]
    command = [a.replace(mount, str(tmp_path)) for a in init["command"]]
    assert command[0] == "topoplace"
    run = [sys.executable, "-m", "topoplace", *command[1:]]
    public = tmp_path / "node.key.pub"
    subprocess.run(run, check=True, capture_output=True)
    first = public.read_text()
    subprocess.run(run, check=True, capture_output=True)
    assert public.read_text() == first
    assert first.strip() in subprocess.run(run, check=True, capture_output=True, text=True).stdout


@pytest.mark.parametrize("name", ["topoplace-scheduler", "topoplace-agent"])
def test_the_network_policy_admits_the_callers(name: str):
    policy = _one("NetworkPolicy", "topoplace")
    allowed = [
        p["podSelector"]["matchLabels"] for r in policy["spec"]["ingress"] for p in r["from"]
    ]
    assert {"app.kubernetes.io/name": name} in allowed


def test_the_device_plugin_runs_beside_the_agent_with_the_kubelets_folders():
    from topoplace.cli import build_parser

    spec = _one("DaemonSet", "topoplace-agent")["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["agent", "device-plugin"]
    plugin = _container(spec, "device-plugin")
    args = build_parser().parse_args(plugin["args"][1:])
    assert args.command == "device-plugin" and args.publish_topology
    mounts = {m["name"]: m["mountPath"] for m in plugin["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert str(args.kubelet_dir) == mounts["device-plugins"]
    assert volumes["device-plugins"]["hostPath"]["path"] == "/var/lib/kubelet/device-plugins"
    assert str(args.pod_resources_socket).startswith(mounts["pod-resources"])
    assert volumes["pod-resources"]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert mounts["kube-api"] == "/var/run/secrets/kubernetes.io/serviceaccount"
    assert "kube-api" not in {m["name"] for m in _container(spec, "agent")["volumeMounts"]}
    assert "nvidia.com/gpu" not in str(plugin.get("resources"))


def test_the_device_plugin_may_keep_only_node_resource_topologies():
    role = _one("ClusterRole", "topoplace-device-plugin")
    (rule,) = role["rules"]
    assert rule["resources"] == ["noderesourcetopologies"]
    assert sorted(rule["verbs"]) == ["create", "get", "update"]
    crd = _one("CustomResourceDefinition", "noderesourcetopologies.topology.node.k8s.io")
    assert crd["spec"]["group"] == rule["apiGroups"][0]
