"""Service settings: one typed object, read from TOPOPLACE_* environment variables."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite:///./topoplace.sqlite3"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOPOPLACE_", extra="ignore")

    database_url: str = Field(
        default=DEFAULT_DATABASE_URL,
        description="SQLAlchemy URL: the embedded SQLite file by default, "
        "postgresql+psycopg://user@host/db in production",
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    migrate_on_start: bool = True
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
    snapshot_history: int = Field(
        default=20, ge=1, description="snapshots kept per node, newest first"
    )
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
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

    grpc_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="port of the gRPC API (0: any free one); unset or 'off': no gRPC server."
        " `topoplace serve` uses 50051 unless told otherwise",
    )

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
