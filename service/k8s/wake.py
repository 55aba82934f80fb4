"""Wake kube-scheduler's parked pods when the service becomes ready again.

A filter call that fails (connection refused while the service restarts, a
503 while its database is down) fails that scheduling attempt, and
kube-scheduler parks the pod in its unschedulable queue until a cluster
event (a Node or Pod change) or its periodic flush, about five minutes
later: it does not notice the extender coming back. So on each change from
not ready to ready (the first one at start) the service patches one label,
``topoplace.io/extender-ready=<unix seconds>``, onto each GPU node it knows:
a Node label change is an event kube-scheduler's queue reacts to (1.24
moves parked pods on label changes, not on annotation changes), and the
parked GPU pods are retried at once.

Bounded: each known node once per change to ready, at most
``wake_rate_per_s`` patches a second, nodes Kubernetes does not know are
skipped; ``TOPOPLACE_K8S_WAKE_NODES=false`` turns it off. If the API server
cannot be reached, the remaining nodes are patched on the next check.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import sqlalchemy as sa

from service.event_loop import off_loop
from service.k8s.kube_api import KubeApiError, PodStream
from service.state import ServiceState

log = logging.getLogger("topoplace.k8s")

WAKE_LABEL = "topoplace.io/extender-ready"
CHECK_S = 1.0


def service_ready(state: ServiceState) -> bool:
    """As /readyz: the state is loaded and the database answers (blocking)."""
    if not state.loaded:
        return False
    try:
        with state.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.SQLAlchemyError:
        return False
    return True


class WakeUp:
    def __init__(
        self,
        state: ServiceState,
        stream: PodStream,
        rate_per_s: float,
        ready: Callable[[ServiceState], bool] = service_ready,
        check_s: float = CHECK_S,
    ) -> None:
        self.state = state
        self.stream = stream
        self.interval_s = 1.0 / rate_per_s
        self.ready = ready
        self.check_s = check_s
        self.wake_ups = 0  # completed: every known node patched once
        self.patched = 0
        self.checks = 0  # readiness checks made
        self._left: list[str] | None = None  # nodes still to patch in this wake-up
        self._value = ""

    async def run(self) -> None:
        was_ready = False
        while True:
            ready = await off_loop(self.ready, self.state)
            self.checks += 1
            if ready and not was_ready:
                with self.state.lock:
                    self._left = list(self.state.cluster.names())
                self._value = str(int(time.time()))
            was_ready = ready
            if self._left is not None and ready:
                await self._patch()
            await asyncio.sleep(self.check_s)

    async def _patch(self) -> None:
        assert self._left is not None
        while self._left:
            name = self._left[0]
            try:
                known = await self.stream.label_node(name, WAKE_LABEL, self._value)
            except KubeApiError as exc:
                log.warning(
                    "wake-up: cannot label node %s (%s); %d nodes left for the next try",
                    name,
                    exc.message,
                    len(self._left),
                )
                return
            self._left.pop(0)
            self.patched += known
            if self._left:
                await asyncio.sleep(self.interval_s)
        self._left = None
        self.wake_ups += 1
        log.info("wake-up: labelled the GPU nodes; kube-scheduler retries the pods it parked")
