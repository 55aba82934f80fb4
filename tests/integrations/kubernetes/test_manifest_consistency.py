"""The shipped manifests hang together: every Secret a pod mounts or reads is made by the
manifests (cert-manager, CloudNativePG) or by a command they document; every mount names a
volume of its pod; every file a setting points at lies under a mount that provides it; and
every URL to the service is https, verified with the CA of the service's own certificate."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3] / "integrations" / "kubernetes"
TLS_SECRET = "topoplace-tls"
SERVICE_HOST = "topoplace.topoplace.svc"


def _objects() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((ROOT / "kustomization.yaml").read_text())
    return [
        d
        for name in kustomization["resources"]
        for d in yaml.safe_load_all((ROOT / name).read_text())
        if d is not None
    ]


def _pods() -> list[tuple[str, dict[str, Any]]]:
    """(workload name, pod spec) of every workload."""
    out = []
    for o in _objects():
        spec = o.get("spec", {})
        template = spec.get("template") or spec.get("jobTemplate", {}).get("spec", {}).get(
            "template"
        )
        if template is not None:
            out.append((o["metadata"]["name"], template["spec"]))
    return out


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def _made_secrets() -> set[str]:
    """Secrets the manifests have made: by cert-manager (a Certificate's secretName), by
    CloudNativePG (``<cluster>-app``), or by a ``kubectl create secret`` they document."""
    made = set()
    for o in _objects():
        if o["kind"] == "Certificate":
            made.add(o["spec"]["secretName"])
        if o["kind"] == "Cluster" and o["apiVersion"].startswith("postgresql.cnpg.io/"):
            made.add(f"{o['metadata']['name']}-app")
    for path in ROOT.glob("*.yaml"):
        made |= set(re.findall(r"create secret generic ([a-z0-9-]+)", path.read_text()))
    return made


def _used_secrets() -> set[tuple[str, str]]:
    used = set()
    for name, pod in _pods():
        for volume in pod.get("volumes", []):
            if "secret" in volume:
                used.add((name, volume["secret"]["secretName"]))
        for container in _containers(pod):
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None:
                    used.add((name, ref["name"]))
    return used


def test_every_secret_a_pod_uses_is_made():
    made = _made_secrets()
    missing = sorted((workload, s) for workload, s in _used_secrets() if s not in made)
    assert missing == []
    assert TLS_SECRET in made


def test_every_mount_names_a_volume_of_its_pod():
    for name, pod in _pods():
        volumes = {v["name"] for v in pod.get("volumes", [])}
        for container in _containers(pod):
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, (name, container["name"], mount["name"])


def _provided_files(pod: dict[str, Any], container: dict[str, Any]) -> set[str]:
    """The files a container sees from Secret volumes whose keys the manifests know: a
    cert-manager Secret holds tls.crt, tls.key and ca.crt (or the items selected)."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    files = set()
    for mount in container.get("volumeMounts", []):
        secret = volumes[mount["name"]].get("secret")
        if secret is None or secret["secretName"] != TLS_SECRET:
            continue
        items = secret.get("items")
        keys = [i["path"] for i in items] if items else ["tls.crt", "tls.key", "ca.crt"]
        files |= {f"{mount['mountPath']}/{key}" for key in keys}
    return files


def _service() -> tuple[dict[str, Any], dict[str, Any]]:
    (pod,) = [p for name, p in _pods() if name == "topoplace"]
    (container,) = pod["containers"]
    return pod, container


def test_the_service_serves_tls_from_the_certificate():
    pod, container = _service()
    env = {e["name"]: e.get("value") for e in container["env"]}
    files = _provided_files(pod, container)
    assert env["TOPOPLACE_TLS_CERT"] in files and env["TOPOPLACE_TLS_CERT"].endswith("tls.crt")
    assert env["TOPOPLACE_TLS_KEY"] in files and env["TOPOPLACE_TLS_KEY"].endswith("tls.key")
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS", probe
    (certificate,) = [
        o
        for o in _objects()
        if o["kind"] == "Certificate" and o["spec"]["secretName"] == TLS_SECRET
    ]
    assert SERVICE_HOST in certificate["spec"]["dnsNames"]
    issuers = {o["metadata"]["name"] for o in _objects() if o["kind"] == "Issuer"}
    assert certificate["spec"]["issuerRef"]["name"] in issuers


def _urls(value: Any) -> list[str]:
    text = yaml.safe_dump(value)
    return re.findall(rf"[a-z]+://{re.escape(SERVICE_HOST)}[^\s'\"]*", text)


@pytest.mark.parametrize("workload", ["topoplace-agent", "topoplace-scheduler"])
def test_clients_reach_the_service_over_https_only(workload: str):
    (pod,) = [p for name, p in _pods() if name == workload]
    urls = _urls(pod)
    if workload == "topoplace-scheduler":  # its URL is in the scheduler's configuration
        urls += _urls(yaml.safe_load((ROOT / "kube-scheduler-config.yaml").read_text()))
    assert urls and all(u.startswith("https://") for u in urls), urls


def test_the_agent_and_its_device_plugin_verify_the_service_with_the_mounted_ca():
    (pod,) = [p for name, p in _pods() if name == "topoplace-agent"]
    assert [c["name"] for c in pod["containers"]] == ["agent", "device-plugin"]
    for container in pod["containers"]:
        args = container["args"]
        ca = args[args.index("--ca-bundle") + 1]
        assert ca in _provided_files(pod, container) and ca.endswith("ca.crt")
        assert not any(f.endswith("tls.key") for f in _provided_files(pod, container))


def test_the_scheduler_verifies_the_extender_with_the_mounted_ca():
    (config,) = yaml.safe_load_all((ROOT / "kube-scheduler-config.yaml").read_text())
    (extender,) = config["extenders"]
    assert extender["enableHTTPS"] is True
    tls = extender["tlsConfig"]
    assert not tls.get("insecure", False)
    (pod,) = [p for name, p in _pods() if name == "topoplace-scheduler"]
    (container,) = pod["containers"]
    files = _provided_files(pod, container)
    assert tls["caFile"] in files
    assert not any(f.endswith("tls.key") for f in files)  # the CA only, never the key
    assert tls["serverName"] == SERVICE_HOST
