"""The Host names an --insecure-dev service answers tokenless calls for."""

from __future__ import annotations

import pytest

from service.edge.dev_hosts import DevHosts, host_name, is_loopback


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("localhost:8000", "localhost"),
        ("Example.ORG", "example.org"),
        ("[::1]:8000", "::1"),
        ("[::1]", "::1"),
        ("127.0.0.1", "127.0.0.1"),
        ("localhost.:8000", "localhost"),
    ],
)
def test_host_name_drops_the_port_and_case(header: str, name: str) -> None:
    assert host_name(header) == name


@pytest.mark.parametrize("name", ["localhost", "app.localhost", "127.0.0.1", "127.3.2.1", "::1"])
def test_loopback_names(name: str) -> None:
    assert is_loopback(name)


@pytest.mark.parametrize(
    "name", ["attacker.example", "localhost.attacker.example", "10.0.0.1", "0.0.0.0", "::", ""]
)
def test_names_that_may_reach_another_machine_are_not_loopback(name: str) -> None:
    assert not is_loopback(name)


def test_listed_names_are_allowed_besides_loopback() -> None:
    hosts = DevHosts(["Laptop.lan", " ", "topoplace:8000"])
    assert hosts.allows("laptop.lan:8000") and hosts.allows("topoplace")
    assert hosts.allows("localhost:8000") and hosts.allows(None)
    assert not hosts.allows("attacker.example") and not hosts.allows("")
