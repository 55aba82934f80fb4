"""Settings of the Kubernetes extender: TOPOPLACE_K8S_* environment variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from service.duration_bound import DurationBound


class ExtenderSettings(DurationBound):
    model_config = SettingsConfigDict(env_prefix="TOPOPLACE_K8S_", extra="ignore")

    extender_open: bool = Field(
        default=False,
        description="accept /k8s/ calls without a bearer token even when tokens are configured:"
        " kube-scheduler's extender client can present a TLS client certificate but no token,"
        " so protect the port with mTLS (a proxy) or a NetworkPolicy instead",
    )
    kubeconfig: str | None = Field(
        default=None,
        description="kubeconfig for the Kubernetes API; unset: the in-cluster service account",
    )
    api_timeout_s: float = Field(default=5.0, gt=0)
    bind_ttl_s: float = Field(
        default=120.0,
        gt=0,
        description="the TTL a pod's reservation had when binds made it pending until confirmed;"
        " a pod's reservation is now active at once (kept so existing settings still load)",
    )
    gang_ttl_s: float = Field(
        default=600.0,
        gt=0,
        description="a gang's reservation waits this long for its first member to bind, counted"
        " again from each member's claim",
    )
    watch: bool = Field(
        default=True,
        description="follow pods with list-and-watch and release the GPUs of a deleted or"
        " finished pod at once (off: only the reconciler releases them)",
    )
    reconcile_interval_s: float = Field(
        default=30.0,
        ge=0,
        description="how often the reconciler, the backstop behind the watch, releases GPUs"
        " of deleted or finished pods the watch missed (0: never)",
    )
    reconcile_grace_s: float = Field(
        default=60.0,
        ge=0,
        description="reservations younger than this are left alone by the reconciler",
    )
    wake_nodes: bool = Field(
        default=True,
        description="when the service becomes ready (start, database back), patch the label"
        " topoplace.io/extender-ready on each GPU node once, a cluster event that makes"
        " kube-scheduler retry the pods it parked while the extender could not answer",
    )
    wake_rate_per_s: float = Field(
        default=20.0,
        gt=0,
        description="at most this many Node patches a second during a wake-up",
    )
