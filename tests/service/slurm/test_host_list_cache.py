"""Expanded host lists are remembered within a budget of names, not of lists."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from service.slurm import service
from service.slurm.host_list_cache import MAX_CACHED_NAMES, HostListCache
from slurm_formats import hostlist


def test_submissions_with_large_host_lists_do_not_keep_their_names() -> None:
    # Each submission names 65,536 nodes in 20 bytes. Kept per list (256 of them), 20
    # such submissions held 90 MB for good, and 256 of them 1.2 GB.
    lists = [f"x{i:02d}-[00000-65535]" for i in range(20)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for text in lists:
            assert len(service._expand(text)) == hostlist.MAX_NAMES
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 30 * 2**20, f"{kept / 2**20:.0f} MiB kept"


def test_lists_are_kept_until_the_budget_of_names_then_the_oldest_goes() -> None:
    cache = HostListCache(max_names=10)
    assert cache.expand("a[1-4]") == ("a1", "a2", "a3", "a4")
    assert cache.expand("b[1-4]") == ("b1", "b2", "b3", "b4")
    assert cache.names == 8
    assert cache.expand("a[1-4]") == ("a1", "a2", "a3", "a4")  # used: now the newest
    cache.expand("c[1-4]")
    assert cache.names == 8  # b went, the least recently used
    assert cache.expand("a[1-4]") is cache.expand("a[1-4]")
    assert cache.expand("b[1-4]") is not cache.expand("c[1-4]")


def test_a_list_longer_than_the_budget_is_expanded_but_not_kept() -> None:
    cache = HostListCache(max_names=3)
    assert cache.expand("n[1-5]") == ("n1", "n2", "n3", "n4", "n5")
    assert cache.names == 0
    assert cache.expand("n[1-3]") == ("n1", "n2", "n3")
    assert cache.names == 3


def test_the_number_of_lists_is_bounded_too() -> None:
    cache = HostListCache(max_lists=2)
    for name in ("a", "b", "c"):
        cache.expand(name)
    assert cache.names == 2


def test_empty_and_refused_lists() -> None:
    cache = HostListCache()
    assert cache.expand(None) == () and cache.expand("") == ()
    with pytest.raises(hostlist.HostlistError):
        cache.expand("n[0-99999999]")
    assert cache.names == 0
    assert MAX_CACHED_NAMES >= hostlist.MAX_NAMES  # the largest list a job may name is kept
