"""Service settings: one typed object, read from TOPOPLACE_* environment variables."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from service.duration_bound import DurationBound

DEFAULT_DATABASE_URL = "sqlite:///./topoplace.sqlite3"
# Postgres counts idle_in_transaction_session_timeout in milliseconds, in a 32-bit int.
IDLE_IN_TRANSACTION_MAX_S = 2_147_483


class Settings(DurationBound):
    model_config = SettingsConfigDict(env_prefix="TOPOPLACE_", extra="ignore")

    database_url: str = Field(
        default=DEFAULT_DATABASE_URL,
        description="SQLAlchemy URL: the embedded SQLite file by default, "
        "postgresql+psycopg://user@host/db in production",
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    migrate_on_start: bool = True
    database_idle_in_transaction_s: float = Field(
        default=30.0,
        ge=0,
        le=IDLE_IN_TRANSACTION_MAX_S,
        description="Postgres ends a session of this service idle this long inside a"
        " transaction (idle_in_transaction_session_timeout), releasing its locks: a"
        " replica frozen mid-transaction would hold them, and every other replica's"
        " writes would wait, forever; 0: off",
    )
    reservation_ttl_s: float = Field(
        default=300.0, gt=0, description="how long a pending reservation lives unconfirmed"
    )
    max_reservation_ttl_s: float = Field(default=86_400.0, gt=0)
    min_reservation_ttl_s: float = Field(
        default=1.0,
        gt=0,
        description="the shortest TTL a request may ask for: a reservation that expires"
        " before its scheduler can confirm it only churns the cluster",
    )
    heartbeat_ttl_s: float = Field(
        default=90.0, gt=0, description="a node whose last heartbeat is older is stale"
    )
    nvlink_min_interval_s: float = Field(
        default=10.0,
        ge=0,
        description="a node's NVLink counters are kept at most once per this many seconds;"
        " readings sent more often are dropped (the agent sends them every 30 s)",
    )
    metrics_nvlink: bool = Field(
        default=True,
        description="export every node's per-link NVLink counters on /metrics (one series"
        " per node, GPU, link and counter; off on fleets where that is too many)",
    )
    snapshot_history: int = Field(
        default=20, ge=1, description="snapshots kept per node, newest first"
    )
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    max_placement_body_bytes: int = Field(
        default=2 * 1024 * 1024,
        ge=1024,
        description="bodies of /v1/place and /v1/score (and gRPC Place and Score messages):"
        " parsed on the event loop while other requests wait; 2 MiB holds 65,536 node names"
        " of 28 characters",
    )
    max_reconcile_body_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=1024,
        # Past what one slurmctld's queue prints (~250,000 jobs), and decoded it would
        # hold gigabytes: a value above is a mistake, refused at start.
        le=1024 * 1024 * 1024,
        description="bodies of POST /v1/slurm/reconcile (the whole of `squeue --json`,"
        " pushed by cron), in place of max_body_bytes when higher: Slurm 22.05 prints"
        " 3.2 KB a pending job and 4 KB a running one, so 256 MiB holds 50,000 jobs of up"
        " to 5.3 KB; read only once the caller's token is allowed the route",
    )
    max_watches: int = Field(
        default=256,
        ge=1,
        description="open gRPC Watch streams this process serves at once: each is handed"
        " every event on the writers' path and holds a buffer",
    )
    max_watches_per_caller: int = Field(
        default=16, ge=1, description="open gRPC Watch streams one token may hold at once"
    )
    max_open_streams: int = Field(
        default=1024,
        ge=1,
        description="open gRPC streams that need no token (health Watch, server reflection)"
        " this process serves at once: each holds a call and a task while the client keeps it",
    )
    max_open_streams_per_peer: int = Field(
        default=32,
        ge=1,
        description="open gRPC streams that need no token one client address may hold at once",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="a connection must send a request's headers within this many seconds"
        " of opening (or of the request's first byte), else 408 and it is closed",
    )
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="a request's whole body must arrive within this many seconds of its"
        " headers, else 408 and the connection is closed",
    )
    send_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="a client that reads nothing of its answer for this many seconds has"
        " its connection aborted, the rest of the answer dropped",
    )
    keep_alive_timeout_s: int = Field(
        default=5, ge=1, description="an idle kept-alive connection is closed after this"
    )
    rate_limit_per_s: float = Field(
        default=2000.0,
        ge=0,
        description="requests a second each token (each client address without one) may"
        " make over time; 0: no limit. The probes are never limited",
    )
    rate_limit_burst: int = Field(
        default=4000, ge=1, description="requests a token may make at once above the rate"
    )
    auth_failures_per_s: float = Field(
        default=1.0,
        ge=0,
        description="refused tokens a second each client address may present over time;"
        " past its burst, a token this process has not verified is answered 429 before any"
        " database read or hash, while tokens verified before keep working; 0: no limit",
    )
    auth_failure_burst: int = Field(
        default=20, ge=1, description="refused tokens an address may present at once"
    )
    token_verifications_at_once: int = Field(
        default=2,
        ge=1,
        description="scrypt verifications of first-seen tokens the process runs at once"
        " (16 MiB and ~40 ms of a core each); more wait",
    )
    token_verification_wait_s: float = Field(
        default=1.0,
        ge=0,
        description="how long a first-seen token waits for a verification slot before it"
        " is answered 429 with Retry-After",
    )
    max_score_nodes: int = Field(
        default=1000,
        ge=1,
        description="the most nodes one /score answer lists; a larger `limit` is refused,"
        " and `offset` pages through the rest",
    )
    ended_job_memory_s: float = Field(
        default=3600.0,
        gt=0,
        description="how long a job released by job id (a Slurm epilog's POST"
        " /v1/jobs/{job_id}/release) or released by the Slurm reconcile loop because it"
        " ended is remembered as ended: a Slurm prolog report of its start processed"
        " meanwhile records nothing. A job id Slurm gives again after it (ids wrap, and"
        " start again on a new cluster) is a new job's",
    )
    audit_retention_days: float = Field(
        default=90.0,
        ge=0,
        description="audit log rows older than this many days are deleted (in batches, by"
        " the background loop); 0: kept forever",
    )
    audit_prune_interval_s: float = Field(
        default=300.0, gt=0, description="how often the audit log's old rows are pruned"
    )
    audit_refusal_window_s: float = Field(
        default=60.0,
        ge=0,
        description="a refused placement of one shape (token, route, request without job_id"
        " and owner), and a refused region summary of one region and error code, writes at"
        " most one audit row this often; the others are counted on its next row. 0: every"
        " refusal writes one (within audit_refusal_rows)",
    )
    audit_refusal_rows: int = Field(
        default=600,
        ge=0,
        description="the most audit rows refused placements write in one window, all shapes"
        " together, and as many refused region summaries; 0: none",
    )
    access_log: bool = Field(
        default=False,
        description="log one line per HTTP request (uvicorn's access log). Off by default:"
        " at scheduler rates it was a tenth of the service's CPU; errors and warnings are"
        " logged either way",
    )
    api_tokens: str = Field(
        default="",
        description="comma-separated static admin tokens (the bootstrap and compatibility"
        " path; role tokens live in the database, docs/security.md)",
    )
    api_token_file: str | None = Field(
        default=None, description="a file of static admin tokens, one per line"
    )
    bootstrap_admin_token: str = Field(
        default="",
        description="one static admin token, to make the first database tokens with",
    )
    insecure_dev: bool = Field(
        default=False,
        description="accept callers without a token (as admins): for a laptop only."
        " Without it the service refuses to start with no token at all",
    )
    insecure_dev_hosts: str = Field(
        default="",
        description="with insecure_dev, comma-separated host names (besides loopback ones)"
        " that calls without a token may name in their Host header: the machine's own name,"
        " a container's service name. Other hosts are refused (DNS rebinding,"
        " docs/security.md)",
    )

    workload_mix_file: str | None = Field(
        default=None,
        description='a workload mix file (docs/engine.md, "Configured or observed"; `topoplace'
        " sim --write-mix` writes one from a trace): the request sizes, CPU and memory per"
        " GPU, task types and GPU model demand the engine ranks choices by, read at start."
        " Parts it leaves out, and all of them without it, are the engine's default size mix"
        " and, for the rest, observed from the requests this process serves since it"
        " started",
    )

    tls_cert: str | None = Field(
        default=None,
        description="PEM certificate (chain) the REST and gRPC APIs serve TLS with;"
        " with tls_key, both APIs speak only TLS",
    )
    tls_key: str | None = Field(default=None, description="the PEM private key of tls_cert")
    trust_on_first_use: bool = Field(
        default=False,
        description="let a node's first public key be registered by an agent token whose"
        " scope holds the node, not only by an admin; replacing or deleting a key stays an"
        " admin action",
    )

    grpc_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="port of the gRPC API (0: any free one); unset or 'off': no gRPC server."
        " `topoplace serve` uses 50051 unless told otherwise",
    )

    # Federation (docs/federation.md). A region's service pushes its signed summary to
    # the global one; the global one routes jobs to regions by their summaries.
    federation_global: str | None = Field(
        default=None,
        description="URL of the global topoplace this region pushes its summary to;"
        " with region_name, region_token (or region_token_file) and region_key",
    )
    region_name: str | None = Field(
        default=None, min_length=1, max_length=63, description="this region's registered name"
    )
    region_token: str = Field(
        default="", description="the region token the global service issued at registration"
    )
    region_token_file: str | None = Field(default=None, description="a file holding it")
    region_key: str | None = Field(
        default=None, description="the Ed25519 private key (PEM) the summaries are signed with"
    )
    federation_push_s: float = Field(
        default=10.0,
        gt=0,
        description="a region pushes its summary on every change and at least this often",
    )
    federation_check_s: float = Field(
        default=0.5, gt=0, description="how often a region looks for a change to push"
    )
    federation_stale_s: float = Field(
        default=30.0,
        gt=0,
        description="global: a region whose last summary is older is stale and skipped",
    )
    federation_forward_retention_s: float = Field(
        default=7 * 86_400.0,
        ge=3600,
        description="global: which region an Idempotency-Key was forwarded to is kept this"
        " long after its first forward, then forgotten (in batches, by the background"
        " loop): a retry of the key within it goes to the same region; after it the key is"
        " routed afresh. At least an hour",
    )

    @model_validator(mode="after")
    def _federation_complete(self) -> Settings:
        if self.federation_global is None:
            return self
        missing = [
            name
            for name, value in (
                ("TOPOPLACE_REGION_NAME", self.region_name),
                (
                    "TOPOPLACE_REGION_TOKEN or TOPOPLACE_REGION_TOKEN_FILE",
                    self.region_token or self.region_token_file,
                ),
                ("TOPOPLACE_REGION_KEY", self.region_key),
            )
            if not value
        ]
        if missing:
            raise ValueError(
                "pushing to a global service (TOPOPLACE_FEDERATION_GLOBAL) needs "
                + ", ".join(missing)
            )
        return self

    def region_token_value(self) -> str:
        """The region token, from the setting or its file; ValueError naming a bad file."""
        if self.region_token.strip():
            return self.region_token.strip()
        if self.region_token_file:
            from pathlib import Path

            try:
                return Path(self.region_token_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ValueError(
                    f"cannot read the region token file {self.region_token_file}: {exc.strerror}"
                ) from None
        return ""

    @model_validator(mode="after")
    def _default_ttl_within_bounds(self) -> Settings:
        """The TTL a /place without ``ttl_s`` gets, within the bounds a request's must
        meet: outside them every such request was refused (400), naming a ``ttl_s`` the
        client never sent. (One past what a datetime holds, a 500 then, is refused with
        every duration: duration_bound.py.)"""
        ttl, low, high = (
            self.reservation_ttl_s,
            self.min_reservation_ttl_s,
            self.max_reservation_ttl_s,
        )
        if not low <= ttl <= high:
            raise ValueError(
                f"TOPOPLACE_RESERVATION_TTL_S ({ttl:g}) must be within"
                f" TOPOPLACE_MIN_RESERVATION_TTL_S ({low:g}) and"
                f" TOPOPLACE_MAX_RESERVATION_TTL_S ({high:g})"
            )
        return self

    @model_validator(mode="after")
    def _tls_pair(self) -> Settings:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("TLS needs both TOPOPLACE_TLS_CERT and TOPOPLACE_TLS_KEY")
        return self

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert and self.tls_key)

    @field_validator("grpc_port", mode="before")
    @classmethod
    def _grpc_off(cls, value: object) -> object:
        return None if isinstance(value, str) and value.strip().lower() in ("", "off") else value

    def accepted_tokens(self) -> list[str]:
        """Every configured token; raises ValueError naming an unreadable token file."""
        from pathlib import Path

        from service.auth import read_token_file

        tokens = [t.strip() for t in self.api_tokens.split(",") if t.strip()]
        if self.api_token_file:
            tokens += read_token_file(Path(self.api_token_file))
        if self.bootstrap_admin_token.strip():
            tokens.append(self.bootstrap_admin_token.strip())
        return tokens

    def static_tokens(self) -> list[str]:
        """:meth:`accepted_tokens`, refusing (ValueError) a default or too short one:
        a static token is an admin's, so a guessable one opens everything."""
        from service.tokens.secrets import weak_reason

        for name in ("api_tokens", "bootstrap_admin_token"):
            value: str = getattr(self, name)
            if name in self.model_fields_set and not value.replace(",", "").strip():
                raise ValueError(f"refusing TOPOPLACE_{name.upper()}: it is set but empty")
        tokens = self.accepted_tokens()
        for token in tokens:
            reason = weak_reason(token)
            if reason is not None:
                raise ValueError(
                    f"refusing a configured API token: {reason}; make one with"
                    " `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
                )
        return tokens

    @field_validator("database_url")
    @classmethod
    def _known_driver(cls, value: str) -> str:
        if not value.startswith(("sqlite", "postgresql")):
            raise ValueError(
                "TOPOPLACE_DATABASE_URL must be sqlite:///PATH or postgresql+psycopg://..."
            )
        if value.startswith("postgresql://") or value.startswith("postgres://"):
            # psycopg 3 is the only driver installed; say so instead of failing on import.
            return "postgresql+psycopg://" + value.split("://", 1)[1]
        return value

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")
