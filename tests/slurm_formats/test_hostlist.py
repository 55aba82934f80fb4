from __future__ import annotations

import pytest

from slurm_formats.hostlist import HostlistError, expand


@pytest.mark.parametrize(
    ("text", "names"),
    [
        (None, []),
        ("", []),
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("node[1-2,5],gpu-a", ["node1", "node2", "node5", "gpu-a"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("a,a,b", ["a", "b"]),
    ],
)
def test_expand(text: str | None, names: list[str]) -> None:
    assert expand(text) == names


@pytest.mark.parametrize("text", ["node[1-", "node]1", "node[a-b]", "node[3-1]"])
def test_malformed_lists_are_refused(text: str) -> None:
    with pytest.raises(HostlistError):
        expand(text)
