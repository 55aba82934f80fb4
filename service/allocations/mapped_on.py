"""The node row a scheduler's truth was mapped on, as the truth's holds name it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class MappedOn:
    """A node's row as a truth's GPU indices or devices were mapped to UUIDs on it: the
    snapshot's ``seq`` and ``reported_at`` in memory, and the node's cordon there.

    Each hold of the truth names all three (``gpu_holds.node_seq``, ``node_reported_at``,
    ``node_cordoned``), whose foreign keys to the node row fail the commit when the stored
    row differs: a snapshot replaced since, a node deleted and reported again under its
    old seq with other GPUs (the seq matches again, ``reported_at`` does not), or a cordon
    or uncordon memory had not heard of. The truth is then mapped again on the stored
    row. The cordon is named as it is, where a reservation always names it false: what a
    scheduler runs on a cordoned node is held all the same."""

    seq: int
    reported_at: datetime | None  # None: memory knows none, and the row is not checked
    cordoned: bool

    def columns(self) -> dict[str, object]:
        """The hold's columns that name the row (service/schema.py, ``gpu_holds``)."""
        at = self.reported_at
        return {
            "node_seq": self.seq,
            "node_reported_at": at,
            "node_cordoned": None if at is None else self.cordoned,
        }
