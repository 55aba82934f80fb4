"""The Kubernetes API calls the service makes, timed for /metrics.

A wrapper around any ``KubeApi`` (the real one, or a test's), so the
extender's bind and reconciler measure what they wait on without the
client knowing of metrics: ``topoplace_kube_api_request_duration_seconds``
by call (``bind``, ``get_pod``, ``list_pods``) and outcome (``ok``, or the
API's HTTP status, ``unreachable`` when it did not answer).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from prometheus_client import Histogram

from service.event_loop import off_loop
from service.k8s.kube_api import KubeApi, KubeApiError, PodStream
from service.k8s.wire import Pod

T = TypeVar("T")


class TimedKubeApi:
    def __init__(self, api: KubeApi, histogram: Histogram) -> None:
        self.api = api
        self.histogram = histogram

    @contextmanager
    def _observed(self, call: str) -> Iterator[None]:
        started = time.perf_counter()
        outcome = "ok"
        try:
            yield
        except KubeApiError as exc:
            outcome = str(exc.status) if exc.status else "unreachable"
            raise
        finally:
            self.histogram.labels(call, outcome).observe(time.perf_counter() - started)

    def _timed(self, call: str, work: Callable[[], T]) -> T:
        with self._observed(call):
            return work()

    def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
    ) -> None:
        self._timed("bind", lambda: self.api.bind(namespace, name, uid, node, annotations))

    async def bind_async(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
    ) -> None:
        """``bind`` on the running event loop: the wrapped API's own asynchronous bind
        where it has one (the real one), else its ``bind`` on a worker thread."""
        native = getattr(self.api, "bind_async", None)
        with self._observed("bind"):
            if native is not None:
                await native(namespace, name, uid, node, annotations)
            else:
                await off_loop(self.api.bind, namespace, name, uid, node, annotations)

    def get_pod(self, namespace: str, name: str) -> Pod | None:
        return self._timed("get_pod", lambda: self.api.get_pod(namespace, name))

    def list_pods(self, namespace: str | None = None) -> list[Pod]:
        return self._timed("list_pods", lambda: self.api.list_pods(namespace))

    def stream(self) -> PodStream | None:
        """The wrapped API's pod stream (list-and-watch, node labels), where it has one:
        only a real API server can be watched."""
        opener = getattr(self.api, "stream", None)
        return None if opener is None else opener()
