"""Follow pods with list-and-watch and give back their GPUs the moment they end.

The watcher lists every pod (paged) and watches from the list's
resourceVersion, with bookmarks (the version moves even when no pod does),
so it resumes where it was after a watch ends or breaks off; a 410 Gone
(the version is compacted away) means list again; a failure (the server
unreachable, an error status) means try again after a backoff that doubles
from ``BACKOFF_MIN_S`` to ``BACKOFF_MAX_S``, and says so in the log and on
/readyz. It keeps only the pods that
matter here: those bound with a topoplace reservation
(``topoplace.io/allocation``), those bound with GPUs by other means (the
device plugin's truth gives them an allocation), and gang members
(``topoplace.io/gang``, bound or not: a gang is alive while any member is).
The API server cannot select on annotations, so this filter runs here.

A pod is gone when it is deleted or its phase turns Succeeded or Failed:
its reservation (job id = its UID) is released at once, through the
allocations API. A gang member that is gone gives up its task claim (a
recreated member can take it), and the gang's reservation is released when
its last member is gone. After a re-list, pods it knew that are no longer
there, or finished meanwhile, are gone too.

Several replicas each run a watcher: the first release of an allocation
ends it, a second one finds it ended and changes nothing (the guarded
transitions of service/allocations/lifecycle.py). The periodic reconciler
stays as a backstop for what no watch could see (a pod deleted while no
replica was watching, a reservation whose bind never reached the pod) and
counts what it had to fix.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, TypeGuard

from service.allocations import api as allocations
from service.event_loop import off_loop
from service.k8s.gang import ALLOCATION_ANNOTATION, GangCoordinator
from service.k8s.kube_api import KubeApiError, PodStream, WatchBroken, WatchExpired
from service.k8s.pod_request import BadPodRequest, Gang, device_counts, gang_of
from service.state import ServiceState

log = logging.getLogger("topoplace.k8s")

BACKOFF_MIN_S = 0.2
BACKOFF_MAX_S = 30.0
FINISHED = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class Followed:
    """What the watcher keeps of a pod: enough to release what it holds."""

    gang: Gang | None  # a gang member's gang
    name: str  # NS/NAME, for the log


def followed(pod: dict[str, Any]) -> Followed | None:
    """The pod as the watcher keeps it; None for a pod that holds nothing of topoplace's."""
    meta = pod.get("metadata") or {}
    notes = meta.get("annotations") or {}
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    gang = gang_of(pod)
    if gang is not None:
        return Followed(gang, name)
    if ALLOCATION_ANNOTATION in notes or _runs_on_gpus(pod):
        return Followed(None, name)
    return None


def _runs_on_gpus(pod: dict[str, Any]) -> bool:
    """A pod bound to a node with GPUs or MIG instances among its limits: one the device
    plugin's truth may have given an allocation (node_devices.py) although no bind of
    topoplace's annotated it, bound by hand or by another scheduler."""
    spec = pod.get("spec")
    if not isinstance(spec, dict) or not spec.get("nodeName"):
        return False
    try:
        return bool(device_counts(spec))
    except BadPodRequest:
        return False


def _shaped(pod: Any) -> TypeGuard[dict[str, Any]]:
    """A pod object whose parts this module reads are what it reads them as: anything else
    (a proxy's garbage, another version's object) is passed over, not followed."""
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
        return False
    parts = (pod.get("spec"), pod.get("status"), pod["metadata"].get("annotations"))
    return all(part is None or isinstance(part, dict) for part in parts)


def _uid(pod: dict[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def _finished(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in FINISHED


class PodWatcher:
    def __init__(self, state: ServiceState, gangs: GangCoordinator, stream: PodStream) -> None:
        self.state = state
        self.gangs = gangs
        self.stream = stream
        self.pods: dict[str, Followed] = {}  # uid -> what it holds
        self.members: dict[str, set[str]] = {}  # gang key -> uids of live members
        self.resource_version = ""
        self.following = False  # a watch is open and its list was read
        self.error: str | None = None  # why the API server cannot be followed now
        self.lists = 0
        self.released = 0  # allocations ended by this watcher
        self.ends = 0  # pods seen to end, their releases done
        self.last_event_at = 0.0

    def health(self) -> dict[str, Any]:
        """For /readyz: whether pods are followed, and why not."""
        out: dict[str, Any] = {
            "watch": "following" if self.following else "unreachable" if self.error else "starting",
            "pods_followed": len(self.pods),
            "released": self.released,
        }
        if self.error:
            out["error"] = self.error
        return out

    async def run(self) -> None:
        backoff = BACKOFF_MIN_S
        listed = False
        while True:
            try:
                if not listed:
                    await self._list()
                    listed = True
                # Resume from the last version seen, each time a watch ends or breaks off.
                async for event in self.stream.watch(self.resource_version, self._opened):
                    backoff = BACKOFF_MIN_S
                    await self._event(event)
            except WatchBroken as exc:  # not yet a sign of trouble: resume after a pause
                log.info("pod watch: %s; resuming", exc.message)
                await asyncio.sleep(backoff)
                backoff = min(BACKOFF_MAX_S, backoff * 2)
            except WatchExpired:
                log.info("pod watch: version %s is gone; listing again", self.resource_version)
                listed = False
            except KubeApiError as exc:
                status = f"HTTP {exc.status}: " if exc.status else ""
                self._unreachable(status + exc.message)
                await asyncio.sleep(backoff)
                backoff = min(BACKOFF_MAX_S, backoff * 2)
            except Exception as exc:  # the task must outlive what it cannot read, and say so
                log.exception("pod watch: failed on what the API server sent; listing again")
                self._unreachable(f"failed on what the API server sent: {exc!r}")
                listed = False  # what that event said is not known: the list says it again
                await asyncio.sleep(backoff)
                backoff = min(BACKOFF_MAX_S, backoff * 2)

    def _opened(self) -> None:
        if self.error is not None:
            log.info("pod watch: following pods again")
        self.following, self.error = True, None

    def _unreachable(self, message: str) -> None:
        if self.error != message:
            log.warning("pod watch: cannot follow pods on the Kubernetes API: %s", message)
        self.following, self.error = False, message

    async def _list(self) -> None:
        pods, version = await self.stream.list_all()
        self.lists += 1
        seen: dict[str, Followed] = {}
        gone: list[tuple[str, Followed]] = []
        for pod in pods:
            if not _shaped(pod):
                log.warning("pod watch: the list holds something that is not a pod; passed over")
                continue
            uid, kept = _uid(pod), followed(pod)
            if kept is None or not uid:
                continue
            if _finished(pod):
                gone.append((uid, kept))
            else:
                seen[uid] = kept
        gone += [(uid, kept) for uid, kept in self.pods.items() if uid not in seen]
        self.pods = seen
        self.members = {}
        for uid, kept in seen.items():
            if kept.gang is not None:
                self.members.setdefault(kept.gang.key, set()).add(uid)
        self.resource_version = version
        self.following, self.error = True, None
        for uid, kept in gone:
            await self._gone(uid, kept)

    async def _event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        pod = event.get("object")
        if not _shaped(pod):
            log.warning("pod watch: a %s event whose object is not a pod; passed over", kind)
            return
        version = pod["metadata"].get("resourceVersion")
        if version:
            self.resource_version = str(version)
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return  # BOOKMARK: only the version moves
        self.last_event_at = time.monotonic()
        uid = _uid(pod)
        kept = self.pods.get(uid) or followed(pod)
        if kept is None or not uid:
            return
        if kind == "DELETED" or _finished(pod):
            self.pods.pop(uid, None)
            if kept.gang is not None:
                self.members.get(kept.gang.key, set()).discard(uid)
            await self._gone(uid, kept)
            return
        now = followed(pod) or kept
        self.pods[uid] = now
        if now.gang is not None:
            self.members.setdefault(now.gang.key, set()).add(uid)

    async def _gone(self, uid: str, kept: Followed) -> None:
        """The pod ended: release what it held, and its gang's reservation if it was the last."""
        try:
            await self._release(uid, kept)
        except Exception:  # the database blinked: the reconciler releases it on its pass
            log.exception(
                "pod watch: releasing what %s held failed; left to the reconciler", kept.name
            )
        self.ends += 1

    async def _release(self, uid: str, kept: Followed) -> None:
        if kept.gang is None:
            # Said as the pod's end (a UID never runs again): a device report read while
            # it ran and taken after this then writes nothing for it (node_devices.py).
            ended = await off_loop(allocations.release_job, self.state, uid, ended=True)
            self._count(ended.ids, f"pod {kept.name} ended")
            return
        key = kept.gang.key
        self.gangs.member_gone(key, uid)
        if self.members.get(key):
            return
        self.members.pop(key, None)
        # The last member this watch knows of: the API server may know a later one.
        ids = await off_loop(self.gangs.release_if_ended, kept.gang, uid)
        self._count(ids, f"the last member of gang {key} ended")

    def _count(self, ids: tuple[str, ...], why: str) -> None:
        if ids:
            self.released += len(ids)
            log.info("released %s: %s", ", ".join(ids), why)
