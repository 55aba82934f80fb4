"""What a Pod asks of topoplace: GPUs or MIG instances from its resources, and how from annotations.

The count comes from the containers' ``nvidia.com/gpu`` limits (or a MIG
resource such as ``nvidia.com/mig-1g.10gb``), summed over containers and
sidecars (init containers with ``restartPolicy: Always``), or the largest
init container's (with the sidecars started before it) if that is more: the
scheduler's own rule for effective requests. Annotations shape the request:

| annotation | values |
|---|---|
| ``topoplace.io/locality`` (or ``gpu.request.locality``) | ``nvlink``, ``prefer``, ``any`` |
| ``topoplace.io/policy`` | ``pack``, ``spread`` |
| ``topoplace.io/numa`` | ``required``, ``preferred``, ``ignore`` |
| ``topoplace.io/objective`` | ``performance``, ``balanced`` |
| ``gpu.request.count`` | must equal the ``nvidia.com/gpu`` limit |
| ``topoplace.io/gang`` + ``topoplace.io/gang-size`` | gang name (per namespace) and member count |

A GPU pod's ``cpu`` and ``memory`` requests go with it as the engine's host
figures (``cpu_milli``, ``memory_mib`` per task), computed as kube-scheduler
computes a pod's effective request (:func:`host_requests`).

A value we cannot use raises :class:`BadPodRequest` whose message names the
annotation or resource, so ``kubectl describe pod`` says what to fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from placement import PlacementRequest
from placement.request import MAX_CPU_MILLI, MAX_GPU_MEMORY_MIB
from placement.text import forbidden_character
from service.k8s import quantity
from service.k8s.wire import Pod

GPU_RESOURCE = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
CPU = "cpu"
MEMORY = "memory"
HOST_RESOURCES = (CPU, MEMORY)

LOCALITY = "topoplace.io/locality"
LOCALITY_ALIAS = "gpu.request.locality"
COUNT_ALIAS = "gpu.request.count"
POLICY = "topoplace.io/policy"
NUMA = "topoplace.io/numa"
OBJECTIVE = "topoplace.io/objective"
GANG = "topoplace.io/gang"
GANG_SIZE = "topoplace.io/gang-size"

MAX_GANG = 4096  # PlacementRequest.tasks' limit
MAX_GPUS = 64  # PlacementRequest.gpus' limit
# The reservation's job id, owner and idempotency keys are built from the pod's UID,
# namespace, name and gang (bind.py, gang.py); their columns hold 256 characters.
STORED = 256
LAST_ATTEMPT = 99_999  # the largest N in a key 'k8s-pod:UID:N' this check allows for
MAX_DIGITS = 18  # a count of more digits is read as PAST_EVERY_BOUND
PAST_EVERY_BOUND = 10**MAX_DIGITS
SHOWN = 64  # characters of a value quoted back: its message is repeated for every node

_CHOICES: dict[str, tuple[str, ...]] = {
    "locality": ("nvlink", "prefer", "any"),
    "policy": ("pack", "spread"),
    "numa": ("required", "preferred", "ignore"),
    "objective": ("performance", "balanced"),
}


class BadPodRequest(ValueError):
    """The pod asks for something topoplace cannot read; the message names the annotation."""


@dataclass(frozen=True, slots=True)
class Gang:
    namespace: str
    name: str
    size: int

    @property
    def key(self) -> str:
        """The job id of the gang's reservation: one per gang name and namespace."""
        return f"k8s-gang:{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PodRequest:
    namespace: str
    name: str
    uid: str
    request: PlacementRequest | None  # None: the pod asks for no GPUs (topoplace has no say)
    gang: Gang | None = None

    @property
    def owner(self) -> str:
        return f"k8s-pod:{self.namespace}/{self.name}"

    @property
    def screened(self) -> bool:
        """Single-task whole-GPU requests are answered by the array screen."""
        r = self.request
        return r is not None and self.gang is None and r.mig_profile is None and r.tasks == 1

    def gang_request(self) -> PlacementRequest:
        assert self.request is not None and self.gang is not None
        # model_copy skips validation: tasks is bounded when the annotation is read.
        return self.request.model_copy(update={"tasks": self.gang.size})


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN else f"{text[: SHOWN - 3]}..."


def _whole(text: str) -> int | None:
    """``text`` as a whole number when it is ASCII digits, else None. (str.isdigit alone
    also takes '²', which int() refuses, and int() refuses more than 4,300 digits: a
    number that long is past every bound, so it is read as one that is.)"""
    if not (text.isascii() and text.isdigit()):
        return None
    digits = text.lstrip("0") or "0"
    return PAST_EVERY_BOUND if len(digits) > MAX_DIGITS else int(digits)


def _count(value: Any, resource: str) -> int:
    n = _whole(str(value).strip())
    if n is None:
        raise BadPodRequest(
            f"resource {resource}: {_shown(value)} is not a whole number of devices"
        )
    return n


def _object(value: Any, where: str) -> dict[str, Any]:
    """``value`` when it is a JSON object (or absent: empty); a pod of another shape is
    refused naming the place, rather than failing wherever it is read."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadPodRequest(f"{where} must be an object")
    return value


def _plain(value: str, where: str) -> str:
    # Pod names become job ids and owners in the database, which cannot hold NUL.
    if forbidden_character(value) is not None:
        raise BadPodRequest(f"{where} carries control characters")
    return value


def _container_counts(containers: Any, kind: str) -> list[tuple[dict[str, int], bool]]:
    """Each container's device counts, and whether it is a sidecar (an init container
    with ``restartPolicy: Always``)."""
    out: list[tuple[dict[str, int], bool]] = []
    if containers is not None and not isinstance(containers, list):
        raise BadPodRequest(f"spec {kind} must be a list")
    for container in containers or ():
        body = _object(container, "a container")
        resources = _object(body.get("resources"), "resources")
        # Extended resources must be set as limits; requests default to them.
        amounts = _object(resources.get("limits") or resources.get("requests"), "resources limits")
        counts = {
            name: _count(value, name)
            for name, value in amounts.items()
            if name == GPU_RESOURCE or name.startswith(MIG_PREFIX)
        }
        out.append((counts, body.get("restartPolicy") == "Always"))
    return out


def device_counts(spec: dict[str, Any]) -> dict[str, int]:
    """Effective device requests, as kube-scheduler counts them (``host_requests``' rule):
    the containers' sum plus the sidecars', or an init container's own plus the sidecars
    started before it if larger. The kubelet keeps a sidecar's devices for the pod's
    life (it never hands them on to the app containers as a plain init container's),
    so a pod counted without them is reserved fewer GPUs than it is given."""
    apps = [counts for counts, _ in _container_counts(spec.get("containers"), "containers")]
    init = _container_counts(spec.get("initContainers"), "initContainers")
    return {name: n for name, n in _pod_need(apps, init).items() if n > 0}


def _pod_need(
    containers: list[dict[str, int]], init: list[tuple[dict[str, int], bool]]
) -> dict[str, int]:
    """kube-scheduler's rule for a pod's need of each resource (k8s.io/component-helpers
    resource.PodRequests), from each app container's amounts and each init container's
    with whether it is a sidecar (``restartPolicy: Always``): the containers' sum, to
    which sidecars are added as they keep running; each init container needs its own
    amount plus the sidecars started before it, and the pod the largest of those if
    more than the sum."""
    total: dict[str, int] = {}
    for amounts in containers:
        _add(total, amounts)
    sidecars: dict[str, int] = {}
    init_need: dict[str, int] = {}
    for amounts, sidecar in init:
        if sidecar:
            _add(total, amounts)
            need = dict(_add(sidecars, amounts))
        else:
            need = _add(dict(amounts), sidecars)
        for name, n in need.items():
            init_need[name] = max(init_need.get(name, 0), n)
    for name, n in init_need.items():
        total[name] = max(total.get(name, 0), n)
    return total


def _amounts(resources: dict[str, Any], where: str) -> dict[str, int]:
    """A resources block's CPU and memory requests in milli-units. A resource with a
    limit and no request is requested at its limit: the API server's defaulting, done
    here too so that a pod not read from an API server is counted the same."""
    requests = _object(resources.get("requests"), f"{where} resources requests")
    limits = _object(resources.get("limits"), f"{where} resources limits")
    out: dict[str, int] = {}
    for name in HOST_RESOURCES:
        value = requests.get(name, limits.get(name))
        if value is None:
            continue
        try:
            out[name] = quantity.milli_units(value)
        except quantity.BadQuantity as exc:
            raise BadPodRequest(f"{where} resource {name}: {_shown(value)} {exc}") from None
    return out


def _named(container: Any, kind: str, index: int) -> tuple[dict[str, Any], str]:
    body = _object(container, f"a{'n init' if kind == 'initContainers' else ''} container")
    name = body.get("name")
    return body, (f"container {_shown(name)}" if isinstance(name, str) else f"{kind}[{index}]")


def _add(total: dict[str, int], amounts: dict[str, int]) -> dict[str, int]:
    for name, n in amounts.items():
        total[name] = total.get(name, 0) + n
    return total


def host_requests(spec: dict[str, Any]) -> dict[str, int]:
    """The pod's effective CPU and memory requests in milli-units, as kube-scheduler
    computes them (k8s.io/component-helpers resource.PodRequests): the containers' sum;
    each init container's need is its own request plus the sidecars (init containers
    with ``restartPolicy: Always``) started before it, and the pod needs the largest of
    those if more than the sum, to which sidecars are added as they keep running; the
    pod-level ``resources`` (where set) replace the containers' figures; ``overhead``
    (the RuntimeClass's) is added. Only resources some part names are in the result."""
    containers, init = spec.get("containers"), spec.get("initContainers")
    if containers is not None and not isinstance(containers, list):
        raise BadPodRequest("spec containers must be a list")
    if init is not None and not isinstance(init, list):
        raise BadPodRequest("spec initContainers must be a list")
    apps: list[dict[str, int]] = []
    for index, container in enumerate(containers or ()):
        body, where = _named(container, "containers", index)
        apps.append(_amounts(_object(body.get("resources"), f"{where} resources"), where))
    inits: list[tuple[dict[str, int], bool]] = []
    for index, container in enumerate(init or ()):
        body, where = _named(container, "initContainers", index)
        own = _amounts(_object(body.get("resources"), f"{where} resources"), where)
        inits.append((own, body.get("restartPolicy") == "Always"))
    total = _pod_need(apps, inits)
    pod_level = _object(spec.get("resources"), "spec resources")
    total.update(_amounts(pod_level, "spec"))
    overhead = _object(spec.get("overhead"), "spec overhead")
    return _add(total, _amounts({"requests": overhead}, "spec overhead"))


def _host_options(spec: dict[str, Any]) -> dict[str, int]:
    """The engine's ``cpu_milli`` and ``memory_mib`` per task from the pod's requests;
    a resource no part of the pod requests is left out (not counted)."""
    amounts = host_requests(spec)
    out: dict[str, int] = {}
    if CPU in amounts:
        out["cpu_milli"] = amounts[CPU]
        if out["cpu_milli"] > MAX_CPU_MILLI:
            raise BadPodRequest(
                f"resource {CPU}: the pod requests {out['cpu_milli']} milli-CPU, more than"
                f" topoplace counts ({MAX_CPU_MILLI})"
            )
    if MEMORY in amounts:
        out["memory_mib"] = quantity.mib(amounts[MEMORY])
        if out["memory_mib"] > MAX_GPU_MEMORY_MIB:
            raise BadPodRequest(
                f"resource {MEMORY}: the pod requests {out['memory_mib']} MiB, more than"
                f" topoplace counts ({MAX_GPU_MEMORY_MIB})"
            )
    return out


def _choice(annotations: dict[str, str], key: str, kind: str, alias: str | None = None) -> str:
    values = {k: annotations[k].strip().lower() for k in (key, alias) if k and k in annotations}
    if len(set(values.values())) > 1:
        raise BadPodRequest(f"annotations {key} and {alias} disagree: {_shown(values)}")
    if not values:
        return ""
    name, value = next(iter(values.items()))
    allowed = _CHOICES[kind]
    if value not in allowed:
        raise BadPodRequest(
            f"annotation {name}: {_shown(annotations[name])} is not one of {', '.join(allowed)}"
        )
    return value


def _positive(annotations: dict[str, str], key: str, upper: int) -> int:
    n = _whole(annotations[key].strip())
    if n is None or not 1 <= n <= upper:
        raise BadPodRequest(
            f"annotation {key}: {_shown(annotations[key])} is not a whole number from 1 to {upper}"
        )
    return n


def parse_pod(pod: Pod) -> PodRequest:
    meta = _object(pod.get("metadata"), "metadata")
    namespace = _plain(str(meta.get("namespace") or "default"), "metadata.namespace")
    name = _plain(str(meta.get("name") or ""), "metadata.name")
    uid = _plain(str(meta.get("uid") or ""), "metadata.uid")
    annotations = {
        str(k): str(v) for k, v in _object(meta.get("annotations"), "annotations").items()
    }
    spec = _object(pod.get("spec"), "spec")
    counts = device_counts(spec)
    gpus = counts.pop(GPU_RESOURCE, 0)
    if COUNT_ALIAS in annotations and _positive(annotations, COUNT_ALIAS, MAX_GPUS) != gpus:
        raise BadPodRequest(
            f"annotation {COUNT_ALIAS}: {_shown(annotations[COUNT_ALIAS])} differs from the"
            f" {GPU_RESOURCE} limit ({gpus})"
        )
    if len(counts) > 1 or (counts and gpus):
        asked = ", ".join(sorted([*counts, *([GPU_RESOURCE] if gpus else [])]))
        raise BadPodRequest(f"resources {asked}: a pod asks for one GPU resource kind only")
    gang = _gang(annotations, namespace)
    options: dict[str, Any] = {
        kind: value
        for kind, value in (
            ("locality", _choice(annotations, LOCALITY, "locality", LOCALITY_ALIAS)),
            ("policy", _choice(annotations, POLICY, "policy")),
            ("numa", _choice(annotations, NUMA, "numa")),
            ("objective", _choice(annotations, OBJECTIVE, "objective")),
        )
        if value
    }
    if not gpus and not counts:
        return PodRequest(namespace, name, uid, None, gang)
    _fits_its_reservation(namespace, name, uid, gang)
    options.update(_host_options(spec))
    if counts:
        ((resource, n),) = counts.items()
        if gang is not None and n != 1:
            raise BadPodRequest(f"resource {resource}: a gang member asks for one MIG instance")
        if options.get("locality") == "nvlink":
            raise BadPodRequest(f"annotation {LOCALITY}: 'nvlink' does not apply to MIG instances")
        options.update(mig_profile=resource[len(MIG_PREFIX) :], tasks=n)
    elif gpus > MAX_GPUS:
        raise BadPodRequest(f"resource {GPU_RESOURCE}: a pod can hold {MAX_GPUS} GPUs at most")
    else:
        options["gpus"] = gpus
    source = f"resource {next(iter(counts), GPU_RESOURCE)}"
    return PodRequest(namespace, name, uid, _placement(options, source), gang)


def _placement(options: dict[str, Any], source: str) -> PlacementRequest:
    """The engine's request; what it refuses (a MIG count past its limit, a profile name
    it cannot hold) is the pod's mistake, named after ``source``, not a fault."""
    try:
        return PlacementRequest(**options)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise BadPodRequest(f"{source}: {first['msg']} ({where})") from None


def _fits_its_reservation(namespace: str, name: str, uid: str, gang: Gang | None) -> None:
    """Refuse a pod whose reservation could not be named after it: its owner
    'k8s-pod:NS/NAME', its job id (the UID, or the gang's 'k8s-gang:NS/GANG') and the
    bind's idempotency keys ('k8s-pod:UID:N', 'k8s-gang:NS/GANG:UID:N') are stored in
    columns of STORED characters. Refused here, the pod fails its filter with the
    reason rather than its bind."""
    longest = {
        "metadata.namespace and metadata.name": f"k8s-pod:{namespace}/{name}",
        "metadata.uid": f"k8s-pod:{uid}:{LAST_ATTEMPT}",
    }
    if gang is not None:
        longest[f"annotation {GANG}"] = f"{gang.key}:{uid}:{LAST_ATTEMPT}"
    for where, text in longest.items():
        if len(text) > STORED:
            raise BadPodRequest(
                f"{where}: too long for topoplace to name the pod's reservation"
                f" ({_shown(text)} is {len(text)} characters, more than {STORED})"
            )


def _gang(annotations: dict[str, str], namespace: str) -> Gang | None:
    name = _plain(annotations.get(GANG, "").strip(), f"annotation {GANG}")
    if GANG_SIZE in annotations and not name:
        raise BadPodRequest(f"annotation {GANG_SIZE} needs {GANG} (the gang's name)")
    if not name:
        return None
    if GANG_SIZE not in annotations:
        raise BadPodRequest(
            f"annotation {GANG}: {_shown(name)} needs {GANG_SIZE} (its member count)"
        )
    size = _positive(annotations, GANG_SIZE, MAX_GANG)
    return Gang(namespace, name, size) if size > 1 else None


def gang_of(pod: Pod) -> Gang | None:
    """The gang a pod is a member of; None for a pod of no gang, or one whose annotations
    cannot be read (it never bound as a member)."""
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    if GANG not in notes or GANG_SIZE not in notes:
        return None
    try:
        return parse_pod(pod).gang
    except BadPodRequest:
        return None
