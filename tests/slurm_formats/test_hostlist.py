from __future__ import annotations

import pytest

from slurm_formats.hostlist import MAX_NAMES, HostlistError, expand


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


@pytest.mark.parametrize(
    "text",
    [
        "node[1-",
        "node]1",
        "node[a-b]",
        "node[3-1]",
        # A number int() refuses (more than 4,300 digits: a ValueError of its own, which
        # the job-submit route did not catch), or in digits other than ASCII ones.
        f"node[{'9' * 5000}]",
        "node[1-99999999999999999999999]",
        "node[\u0661-\u0662]",
    ],
)
def test_malformed_lists_are_refused(text: str) -> None:
    with pytest.raises(HostlistError):
        expand(text)


@pytest.mark.parametrize(
    "text",
    [
        f"node[1-{MAX_NAMES + 1}]",
        "r[1-300]n[1-300]",  # 90,000 names from two short ranges
        "a[1-40000],b[1-40000]",
        "node[0-99999999999999999999]",  # refused before any name is made
        "r[1-99999]n[1-99999]s[1-99999]",
    ],
)
def test_lists_longer_than_any_cluster_are_refused_unexpanded(text: str) -> None:
    with pytest.raises(HostlistError, match="more than"):
        expand(text)


def test_a_list_at_the_limit_expands() -> None:
    assert len(expand(f"node[1-{MAX_NAMES}]")) == MAX_NAMES


def test_plain_names_count_towards_the_limit() -> None:
    with pytest.raises(HostlistError, match="more than"):
        expand(",".join(f"n{i}" for i in range(MAX_NAMES + 1)))


def test_a_limit_makes_only_the_first_names_and_checks_the_whole_list() -> None:
    assert expand(f"node[1-{MAX_NAMES}]", limit=2) == ["node1", "node2"]
    assert expand("a,a,r[1-2]n[1-2]", limit=3) == ["a", "r1n1", "r1n2"]
    assert expand("node[1-3]", limit=0) == []
    assert expand("node[1-3]", limit=9) == ["node1", "node2", "node3"]
    for text in (f"a,node[1-{MAX_NAMES}]", "a,node[3-1]"):
        with pytest.raises(HostlistError):
            expand(text, limit=1)


def test_a_name_of_many_bracketed_parts_is_read_without_recursion() -> None:
    """Each bracket of a name was a call deeper: 2,000 of them (8 KB) ended in a
    RecursionError, a 500 for the job-submit, job-started and reconcile routes."""
    assert expand("a[1]" * 2000) == ["a1" * 2000]
    assert expand("x" + "[1-2]" * 3) == [f"x{a}{b}{c}" for a in "12" for b in "12" for c in "12"]
    with pytest.raises(HostlistError, match="more than"):
        expand("a[1-2]" * 17)  # 131,072 names
