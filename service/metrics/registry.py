"""The metrics the service counts as it works, in one object per service.

Names follow Prometheus' conventions: the ``topoplace_`` prefix, base units
(seconds, bytes), ``_total`` on counters (the client library adds it). Every
label takes values from a closed set (route templates, error codes, causes,
event types), so no caller can grow the number of series.

What is a fact about the cluster (free GPUs, allocations by state, stale
nodes) is not counted here: service/metrics/cluster.py reads it from the
state when scraped, so it can never drift from what the service holds.

One object per service rather than the library's global registry: tests
build many services in one process, and each must start from zero. Under
several worker processes (``PROMETHEUS_MULTIPROC_DIR`` set before the
service starts) the library writes every value here to that directory, and
/metrics adds up all workers' files (service/metrics/endpoint.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram

# Request latencies: /place answers in about a millisecond, a large /score in tens.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # group_commit.MAX_BATCH is 64
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
NO_CODE = "none"  # the ``code`` label of an answer that is not an error


class Metrics:
    """Counters and histograms, each with the labels docs/metrics.md lists."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Histogram(
            "topoplace_http_request_duration_seconds",
            "HTTP requests by route template, method, status class and error code.",
            ["route", "method", "status", "code"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.extender = Histogram(
            "topoplace_extender_request_duration_seconds",
            "Kubernetes scheduler extender calls (filter, prioritize, bind, preempt).",
            ["verb", "code"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.slurm = Histogram(
            "topoplace_slurm_request_duration_seconds",
            "Slurm calls (job-submit, job-started, reconcile).",
            ["call", "code"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.kube_api = Histogram(
            "topoplace_kube_api_request_duration_seconds",
            "Calls the service makes to the Kubernetes API, by call and outcome.",
            ["call", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.squeue = Histogram(
            "topoplace_squeue_duration_seconds",
            "squeue --json runs of the Slurm reconciler, by outcome (ok, failed).",
            ["outcome"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.unschedulable = Counter(
            "topoplace_unschedulable",
            "Placements refused for now (409), by cause; a refusal with several causes"
            " counts once under each.",
            ["cause"],
            registry=r,
        )
        self.unresolvable = Counter(
            "topoplace_unresolvable",
            "Placements the cluster can never hold (422), by cause.",
            ["cause"],
            registry=r,
        )
        self.events = Counter(
            "topoplace_events",
            "Events published on the service's event stream, by kind and type.",
            ["kind", "type"],
            registry=r,
        )
        self.snapshots = Counter(
            "topoplace_snapshots_ingested",
            "Node snapshots taken, by whether they changed the node.",
            ["changed"],
            registry=r,
        )
        self.snapshot_refusals = Counter(
            "topoplace_snapshot_refusals",
            "Node snapshots refused, by error code.",
            ["reason"],
            registry=r,
        )
        self.summary_refusals = Counter(
            "topoplace_summary_refusals",
            "Region summaries refused by the global service after parsing, by error code.",
            ["reason"],
            registry=r,
        )
        self.batches = Histogram(
            "topoplace_group_commit_batch_size",
            "Reservations written per group commit transaction.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.db_retries = Counter(
            "topoplace_database_retries",
            "Transactions run again after a deadlock or serialization failure.",
            registry=r,
        )
        self.notification_lag = Histogram(
            "topoplace_replica_notification_lag_seconds",
            "From another replica's commit to this replica having read the change.",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.telemetry = Counter(
            "topoplace_nvlink_telemetry_reports",
            "NVLink telemetry reports with heartbeats, by outcome (stored, too_soon).",
            ["outcome"],
            registry=r,
        )

    # The callbacks other parts of the service are handed; each is one increment.

    def published(self, kind: str, type_: str, count: int = 1) -> None:
        self.events.labels(kind, type_).inc(count)

    def refused(self, outcome: str, causes: Iterable[str]) -> None:
        family = self.unresolvable if outcome == "unresolvable" else self.unschedulable
        for cause in set(causes) or {"lost_race"}:
            family.labels(cause).inc()

    def batch(self, size: int) -> None:
        self.batches.observe(size)

    def retried(self) -> None:
        self.db_retries.inc()

    def lag(self, seconds: float) -> None:
        self.notification_lag.observe(max(0.0, seconds))
