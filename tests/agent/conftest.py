"""Agent test fixtures: the service tests' Postgres database, for the end-to-end test."""

from tests.service.conftest import postgres_url

__all__ = ["postgres_url"]
