"""grpc's peer strings as the address the failed-token budget counts against."""

from __future__ import annotations

import pytest

from service.grpc.peer_address import peer_host


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:10.0.0.1:50123", "10.0.0.1"),
        ("ipv6:[2001:db8::1]:50123", "2001:db8::1"),
        ("ipv6:[fe80::1%25eth0]:50123", "fe80::1%eth0"),
        ("unix:/run/topoplace.sock", "/run/topoplace.sock"),
        ("", None),
        (None, None),
    ],
)
def test_the_host_part_of_a_peer(peer: str | None, host: str | None) -> None:
    assert peer_host(peer) == host
