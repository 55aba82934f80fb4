"""The Origin check of an --insecure-dev service's tokenless writes (service/edge/dev_origin.py)."""

from __future__ import annotations

import pytest

from service.edge.dev_origin import is_own_origin


@pytest.mark.parametrize(
    ("origin", "host", "scheme"),
    [
        ("http://localhost:8000", "localhost:8000", "http"),
        ("http://LOCALHOST:8000", "localhost:8000", "http"),
        ("http://localhost", "localhost", "http"),
        ("http://localhost:80", "localhost", "http"),
        ("https://localhost", "localhost:443", "https"),
        ("http://[::1]:8000", "[::1]:8000", "http"),
        ("http://127.0.0.1:8000", "127.0.0.1:8000", "http"),
    ],
)
def test_the_services_own_origin(origin: str, host: str, scheme: str) -> None:
    assert is_own_origin(origin, host, scheme)


@pytest.mark.parametrize(
    ("origin", "host", "scheme"),
    [
        ("https://elsewhere.example", "localhost:8000", "http"),
        ("null", "localhost:8000", "http"),
        ("", "localhost:8000", "http"),
        ("http://localhost:3000", "localhost:8000", "http"),  # another port: another origin
        ("http://localhost", "localhost:8000", "http"),
        ("https://localhost:8000", "localhost:8000", "http"),  # another scheme
        ("http://127.0.0.1:8000", "localhost:8000", "http"),  # the same machine, not origin
        ("http://[::1]:8000", "[::1]:9000", "http"),
        ("http://localhost:8000/page", "localhost:8000", "http"),  # no origin has a path
        ("http://localhost:80x", "localhost", "http"),
        ("http://localhost:8000", "localhost:\u00b2", "http"),  # a digit int() cannot read
        ("http://localhost:8000", None, "http"),  # no Host to compare with
        ("http://localhost.evil.example:8000", "localhost:8000", "http"),
    ],
)
def test_another_origin(origin: str, host: str | None, scheme: str) -> None:
    assert not is_own_origin(origin, host, scheme)
