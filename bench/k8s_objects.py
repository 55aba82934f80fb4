"""Pod and Node objects as kube-scheduler sends them to an extender (benchmark and tests).

Shaped after what an API server returns (and the scheduler forwards without
apiVersion/kind): managedFields, requests filled from limits, default
tolerations, a projected service-account volume, node conditions,
capacity/allocatable with nvidia.com/gpu, images.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

_POD: dict[str, Any] = {
    "metadata": {
        "name": "",
        "namespace": "ml-team",
        "uid": "",
        "resourceVersion": "184467",
        "creationTimestamp": "2026-11-29T10:21:07Z",
        "labels": {"app": "trainer", "batch.kubernetes.io/job-name": "trainer"},
        "annotations": {},
        "ownerReferences": [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": "trainer",
                "uid": "5b1c7e0a-3a55-4a5e-9d61-0d8c1f0a9e11",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
        "managedFields": [
            {
                "manager": "kube-controller-manager",
                "operation": "Update",
                "apiVersion": "v1",
                "time": "2026-11-29T10:21:07Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {
                    "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                    "f:spec": {"f:containers": {'k:{"name":"trainer"}': {".": {}, "f:image": {}}}},
                },
            }
        ],
    },
    "spec": {
        "volumes": [
            {
                "name": "kube-api-access-7xk2p",
                "projected": {
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {
                            "configMap": {
                                "name": "kube-root-ca.crt",
                                "items": [{"key": "ca.crt", "path": "ca.crt"}],
                            }
                        },
                    ],
                    "defaultMode": 420,
                },
            }
        ],
        "containers": [
            {
                "name": "trainer",
                "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                "command": ["torchrun", "--nproc-per-node=4", "train.py"],
                "resources": {"limits": {}, "requests": {}},
                "volumeMounts": [
                    {
                        "name": "kube-api-access-7xk2p",
                        "readOnly": True,
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                    }
                ],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            },
            {
                "name": "metrics",
                "image": "prom/statsd-exporter:v0.26.0",
                "resources": {
                    "limits": {"cpu": "100m", "memory": "64Mi"},
                    "requests": {"cpu": "100m", "memory": "64Mi"},
                },
            },
        ],
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "securityContext": {},
        "schedulerName": "default-scheduler",
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        ],
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    },
    "status": {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "lastProbeTime": None,
                "lastTransitionTime": "2026-11-29T10:21:07Z",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            }
        ],
        "qosClass": "Burstable",
    },
}


def pod(
    name: str,
    gpus: int = 0,
    *,
    annotations: dict[str, str] | None = None,
    resource: str = "nvidia.com/gpu",
    namespace: str = "ml-team",
    uid: str | None = None,
) -> dict[str, Any]:
    body = copy.deepcopy(_POD)
    meta = body["metadata"]
    meta.update(name=name, namespace=namespace, uid=uid or str(uuid.uuid4()))
    meta["annotations"] = dict(annotations or {})
    if gpus:
        trainer = body["spec"]["containers"][0]["resources"]
        # The API server fills requests from limits for extended resources.
        trainer["limits"] = {resource: str(gpus), "cpu": "8", "memory": "64Gi"}
        trainer["requests"] = {resource: str(gpus), "cpu": "8", "memory": "64Gi"}
    return body


def node(name: str, gpus: int = 8) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
            "resourceVersion": "183990",
            "creationTimestamp": "2026-10-02T08:00:00Z",
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": "p5.48xlarge",
                "nvidia.com/gpu.present": "true",
                "topology.kubernetes.io/zone": "us-east-1a",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
            "managedFields": [
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-29T10:20:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:allocatable": {"f:nvidia.com/gpu": {}}}},
                    "subresource": "status",
                }
            ],
        },
        "spec": {
            "podCIDR": "10.244.3.0/24",
            "providerID": f"aws:///us-east-1a/i-{uuid.uuid5(uuid.NAMESPACE_DNS, name).hex[:17]}",
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        },
        "status": {
            "capacity": {
                "cpu": "192",
                "ephemeral-storage": "3749716968Ki",
                "memory": "2097152000Ki",
                "nvidia.com/gpu": str(gpus),
                "pods": "110",
            },
            "allocatable": {
                "cpu": "191450m",
                "ephemeral-storage": "3455717394223",
                "memory": "2095948800Ki",
                "nvidia.com/gpu": str(gpus),
                "pods": "110",
            },
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "lastHeartbeatTime": "2026-11-29T10:20:00Z",
                    "lastTransitionTime": "2026-10-02T08:01:00Z",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": "10.0.3.17"},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "kubeletVersion": "v1.30.4",
                "containerRuntimeVersion": "containerd://1.7.20",
                "kernelVersion": "6.1.102",
                "osImage": "Ubuntu 22.04.4 LTS",
                "architecture": "amd64",
                "operatingSystem": "linux",
            },
            "images": [
                {
                    "names": [
                        "nvcr.io/nvidia/pytorch@sha256:5c1f",
                        "nvcr.io/nvidia/pytorch:24.05-py3",
                    ],
                    "sizeBytes": 9876543210,
                }
            ],
        },
    }


def binding_args(p: dict[str, Any], node: str) -> dict[str, str]:
    """ExtenderBindingArgs for pod ``p`` on ``node``, as kube-scheduler sends them."""
    meta = p["metadata"]
    return {
        "PodName": meta["name"],
        "PodNamespace": meta["namespace"],
        "PodUID": meta["uid"],
        "Node": node,
    }


def names_args(p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """ExtenderArgs of a nodeCacheCapable scheduler: NodeNames filled, Nodes null."""
    return {"Pod": p, "Nodes": None, "NodeNames": names}


def nodes_args(p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """ExtenderArgs of a scheduler without nodeCacheCapable: full Node objects, NodeNames null."""
    return {
        "Pod": p,
        "Nodes": {"metadata": {}, "items": [node(n) for n in names]},
        "NodeNames": None,
    }
