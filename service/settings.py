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
        description="comma-separated bearer tokens the API accepts; empty (and no token file)"
        " leaves the API open",
    )
    api_token_file: str | None = Field(
        default=None, description="a file of accepted bearer tokens, one per line"
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
