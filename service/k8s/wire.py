"""kube-scheduler's extender wire format (k8s.io/kube-scheduler/extender/v1), as plain data.

The Go types carry no JSON tags, so the top-level keys are PascalCase
(``Pod``, ``NodeNames``, ``FailedNodes``...), while the embedded Pod and Node
objects use Kubernetes' own camelCase JSON without ``apiVersion``/``kind``.
Go decodes replies case-insensitively; we answer in the exact PascalCase and
accept any case on the way in, as Go would.

Bodies are parsed with orjson into dicts and described by TypedDicts instead
of pydantic models: in the full-Node mode (``nodeCacheCapable: false``) a
filter call carries every candidate Node object, megabytes for a large
cluster, and validating all of it would cost more than the decision.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

# pydantic (the OpenAPI document) reads TypedDicts from typing_extensions on Python 3.11.
from typing_extensions import TypedDict

from placement.text import PLAIN_PATTERN, forbidden_character
from service.errors import BadRequest

Pod = dict[str, Any]  # a Kubernetes Pod object (camelCase JSON)
Node = dict[str, Any]  # a Kubernetes Node object (camelCase JSON)
# Kubernetes' longest object name (a DNS subdomain), and what a node's name column holds.
MAX_NAME = 253


class KubeNodeList(TypedDict):
    metadata: dict[str, Any]
    items: list[Node]


class ExtenderArgs(TypedDict):
    """Body of filter and prioritize: ``NodeNames`` when nodeCacheCapable, else ``Nodes``."""

    Pod: Pod
    Nodes: KubeNodeList | None
    NodeNames: list[str] | None


class ExtenderFilterResult(TypedDict):
    Nodes: KubeNodeList | None
    NodeNames: list[str] | None
    FailedNodes: dict[str, str]
    FailedAndUnresolvableNodes: dict[str, str]
    Error: str


class HostPriority(TypedDict):
    Host: str
    Score: int  # 0..MAX_PRIORITY


class ExtenderBindingArgs(TypedDict):
    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


class ExtenderBindingResult(TypedDict):
    Error: str


class MetaPod(TypedDict):
    UID: str


class MetaVictims(TypedDict):
    Pods: list[MetaPod]
    NumPDBViolations: int


class Victims(TypedDict):
    Pods: list[Pod]
    NumPDBViolations: int


class ExtenderPreemptionArgs(TypedDict):
    Pod: Pod
    NodeNameToVictims: dict[str, Victims] | None
    NodeNameToMetaVictims: dict[str, MetaVictims] | None


class ExtenderPreemptionResult(TypedDict):
    NodeNameToMetaVictims: dict[str, MetaVictims]


MAX_PRIORITY = 10  # extender v1 MaxExtenderPriority


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """No garbage collection while a large, acyclic JSON tree is built.

    A full-Node body for 10,000 nodes decodes into about two million dicts and
    lists, and a prioritize reply for 10,000 nodes is 10,000 dicts; every few
    hundred allocations would start a collection, which made decoding three
    times slower. JSON trees have no reference cycles, so those collections
    could find nothing. Only the caller that found collection on turns it
    back on, so concurrent callers never leave it off.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def loads(body: bytes) -> dict[str, Any]:
    """The request body as a dict with PascalCase top-level keys, or 400 naming the problem."""
    try:
        with no_collection():
            data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    return data


def field(data: dict[str, Any], name: str) -> Any:
    """``data[name]``, matched case-insensitively when the exact key is absent (Go's rule)."""
    if name in data:
        return data[name]
    lower = name.lower()
    for key, value in data.items():
        if key.lower() == lower:
            return value
    return None


def _all_strings(values: list[Any]) -> bool:
    # str.join checks every item's type in C, several times cheaper than any Python-level
    # test over 10,000 names; the joined text is dropped at once.
    try:
        "".join(values)
    except TypeError:
        return False
    return True


def extender_args(body: bytes) -> tuple[Pod, list[str], list[Node] | None]:
    """(pod, candidate node names, Node objects or None in names mode) from ExtenderArgs."""
    data = loads(body)
    pod = field(data, "Pod")
    if not isinstance(pod, dict):
        raise BadRequest("ExtenderArgs.Pod must be a Pod object", {"field": "Pod"})
    names = field(data, "NodeNames")
    nodes = field(data, "Nodes")
    if nodes is not None and not isinstance(nodes, dict):
        raise BadRequest("ExtenderArgs.Nodes must be a NodeList object", {"field": "Nodes"})
    # Nodes, when sent, is checked even beside NodeNames: what the document allows is
    # what is accepted.
    node_items, node_names = _node_items(nodes) if nodes is not None else (None, [])
    if names is not None:
        if not isinstance(names, list) or not _all_strings(names):
            raise BadRequest("ExtenderArgs.NodeNames must be a list of strings")
        return pod, names, None
    if node_items is None:
        raise BadRequest("ExtenderArgs needs NodeNames (nodeCacheCapable) or Nodes")
    return pod, node_names, node_items


def _node_items(nodes: dict[str, Any]) -> tuple[list[Node], list[str]]:
    items = nodes.get("items")
    if items is None:
        items = []
    if not isinstance(items, list):
        raise BadRequest("ExtenderArgs.Nodes.items must be a list of Node objects")
    try:
        node_names = [item["metadata"]["name"] for item in items]
    except (TypeError, KeyError):
        raise BadRequest("every item of ExtenderArgs.Nodes needs metadata.name") from None
    if not _all_strings(node_names):
        raise BadRequest("every item of ExtenderArgs.Nodes needs metadata.name")
    return items, node_names


def binding_args(body: bytes) -> ExtenderBindingArgs:
    data = loads(body)
    out: dict[str, str] = {}
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = field(data, key)
        if not isinstance(value, str) or (key != "PodUID" and not value):
            raise BadRequest(f"ExtenderBindingArgs.{key} must be a non-empty string")
        if forbidden_character(value) is not None:
            raise BadRequest(f"ExtenderBindingArgs.{key} carries control characters")
        if key != "PodUID" and len(value) > MAX_NAME:
            raise BadRequest(f"ExtenderBindingArgs.{key} is longer than {MAX_NAME} characters")
        out[key] = value
    return ExtenderBindingArgs(
        PodName=out["PodName"],
        PodNamespace=out["PodNamespace"],
        PodUID=out["PodUID"],
        Node=out["Node"],
    )


def filter_result(
    passing: list[str],
    nodes: list[Node] | None,
    failed: dict[str, str],
    unresolvable: dict[str, str],
    error: str = "",
) -> ExtenderFilterResult:
    """Answer in the mode the scheduler asked in: it reads ``Nodes.items`` in the full-Node
    mode and ``NodeNames`` only when nodeCacheCapable; the other key is null."""
    if nodes is None:
        return ExtenderFilterResult(
            Nodes=None,
            NodeNames=passing,
            FailedNodes=failed,
            FailedAndUnresolvableNodes=unresolvable,
            Error=error,
        )
    keep = set(passing)
    items = [n for n in nodes if n["metadata"]["name"] in keep]
    return ExtenderFilterResult(
        Nodes=KubeNodeList(metadata={}, items=items),
        NodeNames=None,
        FailedNodes=failed,
        FailedAndUnresolvableNodes=unresolvable,
        Error=error,
    )


def dumps(value: object) -> bytes:
    return orjson.dumps(value)


def host_priorities(names: list[str], scores: Iterable[int]) -> bytes:
    """A HostPriorityList as JSON. Plain dict literals: 10,000 TypedDicts made by call
    cost milliseconds."""
    with no_collection():
        return orjson.dumps([{"Host": n, "Score": s} for n, s in zip(names, scores, strict=True)])


def request_schema(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An OpenAPI requestBody for a route that reads its raw body (documented, not validated)."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "title": name,
                        "type": "object",
                        "properties": properties,
                        "required": required,
                    }
                }
            },
        }
    }


_OBJECT = {"type": "object", "additionalProperties": True}
_NULLABLE_OBJECT = {"anyOf": [_OBJECT, {"type": "null"}]}
_NAMES = {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]}
_NAME = {"type": "string", "minLength": 1, "maxLength": MAX_NAME, "pattern": PLAIN_PATTERN}
MAX_VIOLATIONS = 2**31 - 1  # Go's int32, as kube-scheduler counts them
_NODE_LIST = {
    "type": "object",
    "properties": {
        "items": {
            "anyOf": [
                {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["metadata"],
                        "properties": {
                            "metadata": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {"name": {"type": "string"}},
                            }
                        },
                    },
                },
                {"type": "null"},
            ]
        }
    },
}
_PLAIN = {"type": "string", "pattern": PLAIN_PATTERN}
# A victim as either form names it (MetaPod's UID, a Pod's metadata.uid): looked up in the
# database, so no control character (preempt refuses one with 400).
_VICTIM = {
    "type": "object",
    "additionalProperties": True,
    "properties": {
        "UID": _PLAIN,
        "metadata": {"type": "object", "additionalProperties": True, "properties": {"uid": _PLAIN}},
    },
}
_VICTIMS = {
    "anyOf": [
        {
            "type": "object",
            "propertyNames": {"pattern": PLAIN_PATTERN},
            "additionalProperties": {
                "type": "object",
                "properties": {
                    "Pods": {"anyOf": [{"type": "array", "items": _VICTIM}, {"type": "null"}]},
                    "NumPDBViolations": {
                        "type": "integer",
                        "minimum": 0,
                        "maximum": MAX_VIOLATIONS,
                    },
                },
            },
        },
        {"type": "null"},
    ]
}

EXTENDER_ARGS_SCHEMA = request_schema(
    "ExtenderArgs",
    {"Pod": _OBJECT, "Nodes": {"anyOf": [_NODE_LIST, {"type": "null"}]}, "NodeNames": _NAMES},
    ["Pod"],
)
# NodeNames (nodeCacheCapable) or Nodes: one of them is a list, not null.
_args_schema = EXTENDER_ARGS_SCHEMA["requestBody"]["content"]["application/json"]["schema"]
_args_schema["anyOf"] = [
    {"required": ["NodeNames"], "properties": {"NodeNames": {"type": "array"}}},
    {"required": ["Nodes"], "properties": {"Nodes": {"type": "object"}}},
]
BINDING_ARGS_SCHEMA = request_schema(
    "ExtenderBindingArgs",
    {
        "PodName": _NAME,
        "PodNamespace": _NAME,
        "PodUID": {"type": "string", "pattern": PLAIN_PATTERN},
        "Node": _NAME,
    },
    ["PodName", "PodNamespace", "PodUID", "Node"],
)
PREEMPTION_ARGS_SCHEMA = request_schema(
    "ExtenderPreemptionArgs",
    {"Pod": _OBJECT, "NodeNameToVictims": _VICTIMS, "NodeNameToMetaVictims": _VICTIMS},
    ["Pod"],
)
