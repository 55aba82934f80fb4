"""HTTP routes of the kube-scheduler extender: POST /k8s/v1/{filter,prioritize,bind,preempt}.

Handlers read the raw body and answer plain JSON bytes (see wire.py for why).
They follow service/event_loop.py: filter and prioritize answer from memory
in well under a millisecond for a few hundred nodes, so they run on the
event loop, except for a gang member's first sight (its reservation read
from the database, its members from the API server), which goes to a worker
thread. A pod's bind runs on the event loop too: its reservation is written
as the Slurm filter's (at once on SQLite, else awaited from the group
committer) and its Binding POST is awaited (service/k8s/binding_post.py);
a gang member's bind, a pod not seen by this process's filter, and preempt
run on a worker thread.

The router's lifespan builds the :class:`Extender` (settings from
``TOPOPLACE_K8S_*``, or ``app.state.k8s_settings`` / ``app.state.k8s_api``
when a caller set them), opens ``/k8s/`` to callers without a token when
``TOPOPLACE_K8S_EXTENDER_OPEN`` says so, and runs the pod watch
(pod_watch.py), the reconciler behind it and the wake-up (wake.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import APIRouter, FastAPI, Request, Response

from service.event_loop import off_loop
from service.k8s.extender import Extender
from service.k8s.kube_api import KubeConfigError, PodStream
from service.k8s.pod_watch import PodWatcher
from service.k8s.reconcile import reconcile_forever
from service.k8s.settings import ExtenderSettings
from service.k8s.wake import WakeUp
from service.k8s.wire import (
    BINDING_ARGS_SCHEMA,
    EXTENDER_ARGS_SCHEMA,
    PREEMPTION_ARGS_SCHEMA,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionResult,
    HostPriority,
)

log = logging.getLogger("topoplace.k8s")
PREFIX = "/k8s/v1"


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: ExtenderSettings = getattr(app.state, "k8s_settings", None) or ExtenderSettings()
    extender = Extender(app.state.service, settings, getattr(app.state, "k8s_api", None))
    app.state.k8s = extender
    if settings.extender_open:
        app.state.token_check.open_prefix("/k8s/")
        log.warning("the /k8s/ extender routes accept callers without a token")
    tasks: list[asyncio.Task[None]] = []
    stream: PodStream | None = None
    if settings.reconcile_interval_s > 0 or settings.watch or settings.wake_nodes:
        try:
            kube = await off_loop(extender.kube)
        except KubeConfigError as exc:
            log.warning("no Kubernetes API (%s): bind will fail and nothing is released", exc)
        else:
            opener = getattr(kube, "stream", None)  # only a real API server can be watched
            stream = opener() if (settings.watch or settings.wake_nodes) and opener else None
            if stream is not None and settings.watch:
                extender.watcher = PodWatcher(app.state.service, extender.gangs, stream)
                tasks.append(asyncio.create_task(extender.watcher.run()))
            if stream is not None and settings.wake_nodes:
                extender.wake = WakeUp(app.state.service, stream, settings.wake_rate_per_s)
                tasks.append(asyncio.create_task(extender.wake.run()))
            if settings.reconcile_interval_s > 0:
                reconcile = reconcile_forever(
                    app.state.service,
                    kube,
                    extender.gangs,
                    settings.reconcile_interval_s,
                    settings.reconcile_grace_s,
                    extender.backstop if extender.watcher is not None else None,
                )
                tasks.append(asyncio.create_task(reconcile))
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if stream is not None:
            await stream.aclose()


router = APIRouter(prefix=PREFIX, tags=["kubernetes"], lifespan=lifespan)


def _extender(request: Request) -> Extender:
    extender: Extender = request.app.state.k8s
    return extender


def _json(body: bytes) -> Response:
    return Response(body, media_type="application/json")


@router.post("/filter", response_model=ExtenderFilterResult, openapi_extra=EXTENDER_ARGS_SCHEMA)
async def filter_nodes(request: Request) -> Response:
    """ExtenderArgs in, ExtenderFilterResult out, in the mode asked (NodeNames or Nodes)."""
    return _json(await _extender(request).filter_async(await request.body()))


@router.post("/prioritize", response_model=list[HostPriority], openapi_extra=EXTENDER_ARGS_SCHEMA)
async def prioritize(request: Request) -> Response:
    """ExtenderArgs in, HostPriorityList (scores 0..10) out."""
    return _json(await _extender(request).prioritize_async(await request.body()))


@router.post("/bind", response_model=ExtenderBindingResult, openapi_extra=BINDING_ARGS_SCHEMA)
async def bind(request: Request) -> Response:
    """Reserve the pod's GPUs on the node, then create its Binding naming them."""
    return _json(await _extender(request).bind_async(await request.body()))


@router.post(
    "/preempt", response_model=ExtenderPreemptionResult, openapi_extra=PREEMPTION_ARGS_SCHEMA
)
async def preempt(request: Request) -> Response:
    """Keep only the nodes where evicting the proposed victims lets the pod fit."""
    body = await request.body()
    return _json(await off_loop(_extender(request).preempt, body))


# kube-scheduler blocks on these for every GPU pod, one pod after another: they are served
# before FastAPI's router (service/direct_routes.py); the routes above document them.
DIRECT = {
    ("POST", f"{PREFIX}/filter"): filter_nodes,
    ("POST", f"{PREFIX}/prioritize"): prioritize,
    ("POST", f"{PREFIX}/bind"): bind,
}
