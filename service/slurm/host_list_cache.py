"""Expanded Slurm host lists, remembered within a budget of names rather than of lists.

A cluster's submissions repeat a few host lists (a partition's, a user's
``--nodelist``), so each is expanded once. The cache used to hold 256 lists
whatever their size: every list may name up to ``hostlist.MAX_NAMES`` (65,536)
nodes, about 4.5 MB once expanded, so 256 submissions of a few hundred bytes
each, with host lists of their own (a viewer may ask, ``?propose=true``), kept
1.2 GB in the process for good. Now the lists kept name at most ``MAX_CACHED_NAMES``
nodes together, the least recently used going first; a list longer than that
is expanded each time it is asked for and not kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from slurm_formats import hostlist

# Two of the largest lists, or thousands of ordinary ones: about 9 MB of names.
MAX_CACHED_NAMES = 2 * hostlist.MAX_NAMES
MAX_CACHED_LISTS = 256


class HostListCache:
    """``hostlist.expand`` as a tuple, the recent results kept within ``max_names`` names."""

    def __init__(
        self, max_names: int = MAX_CACHED_NAMES, max_lists: int = MAX_CACHED_LISTS
    ) -> None:
        self.max_names = max_names
        self.max_lists = max_lists
        self._lists: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self._names = 0
        # The event loop and gRPC's worker threads both decide Slurm jobs.
        self._lock = threading.Lock()

    @property
    def names(self) -> int:
        """How many names the kept lists hold together."""
        return self._names

    def expand(self, text: str | None) -> tuple[str, ...]:
        if not text:
            return ()
        with self._lock:
            kept = self._lists.get(text)
            if kept is not None:
                self._lists.move_to_end(text)
                return kept
        names = tuple(hostlist.expand(text))  # HostlistError passes, and nothing is kept
        if len(names) <= self.max_names:
            self._keep(text, names)
        return names

    def _keep(self, text: str, names: tuple[str, ...]) -> None:
        with self._lock:
            if text in self._lists:
                return  # another thread expanded it meanwhile
            self._lists[text] = names
            self._names += len(names)
            while self._names > self.max_names or len(self._lists) > self.max_lists:
                _, dropped = self._lists.popitem(last=False)
                self._names -= len(dropped)
