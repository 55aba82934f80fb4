"""Which List each node's device reports were last taken from, so an older one is not taken after.

The plugin reports each round's List and moves on when a report times out, while the
service may still be working on it: the next round's report can be taken first. The
kubelet hands a finished pod's devices to the next pod before the API shows the first
one finished, so the older List names the first pod on devices the newer one gave the
next; taken last, it moved them back onto the pod that no longer runs. A node's
reports are taken one at a time here, and one whose List (``listed_at``) was read
before the last one taken for its node and resource, by less than ``REORDER_S``, is
answered with nothing changed: the plugin's next round reads the List again. One
older by more is the node's clock stepped back (no report is held up that long), and
is taken: were it refused, the node's truth would wait until its clock caught up.
This replica's memory: a report answered by another replica is not known here.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

from service.k8s.device_schemas import DeviceReport, PodOutcome

# Past the plugin's client timeout (5 s) and a round (10 s) or two: how much older than
# the last List taken a report's may be and still be one answered late.
REORDER_S = 30.0


class ReportOrder:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, threading.Lock] = {}
        # (node, resource) -> the listed_at of the last report taken; one per node and
        # resource, so it grows with the cluster, not with the reports.
        self._newest: dict[tuple[str, str], datetime] = {}

    def node_lock(self, node: str) -> threading.Lock:
        """Held over a report of ``node``: its reports are checked and taken in turn."""
        with self._lock:
            return self._nodes.setdefault(node, threading.Lock())

    def stale(self, node: str, body: DeviceReport) -> list[PodOutcome] | None:
        """Under ``node_lock``: each pod deferred when the report's List is older than one
        taken already for its node and resource; None when it is to be taken."""
        newest = self._newest.get((node, body.resource))
        if body.listed_at is None or newest is None or body.listed_at >= newest:
            return None
        if body.listed_at < newest - timedelta(seconds=REORDER_S):
            return None  # the node's clock stepped back
        message = (
            f"the report's List was read at {body.listed_at.isoformat()}, before that of a"
            f" newer report taken already ({newest.isoformat()}): nothing is changed by it"
        )
        return [
            PodOutcome(namespace=p.namespace, name=p.name, action="deferred", message=message)
            for p in body.pods
        ]

    def taken(self, node: str, body: DeviceReport) -> None:
        """Under ``node_lock``: the report was taken."""
        if body.listed_at is not None:  # the last taken, older after a clock step back
            self._newest[(node, body.resource)] = body.listed_at
