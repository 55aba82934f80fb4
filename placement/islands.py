"""NVLink islands and PCIe groups: how a node's GPUs are joined.

An NVLink island is a connected component of the node's NVLink graph with at
least two GPUs. GPUs without any NVLink peer are not islands: they form PCIe
groups, the GPUs joined by a PCIe path short of ``SYS`` (one socket's GPUs:
``PIX``, ``PXB``, ``PHB`` or ``NODE``). Every GPU is in exactly one island
or group.

Names are stable for a given wiring: islands are ``nvl0``, ``nvl1``, ... and
groups ``pcie0``, ``pcie1``, ..., each numbered by their lowest GPU index,
so a restart or a re-report of the same machine yields the same names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from placement.snapshot import NodeSnapshot

GroupKind = Literal["nvlink", "pcie"]
NVLINK: GroupKind = "nvlink"
PCIE: GroupKind = "pcie"


@dataclass(frozen=True, slots=True)
class Island:
    name: str
    gpus: tuple[int, ...]
    kind: GroupKind = NVLINK

    @property
    def size(self) -> int:
        return len(self.gpus)

    @property
    def is_nvlink(self) -> bool:
        return self.kind == NVLINK


def _components(joined: Callable[[int, int], bool], members: list[int]) -> list[list[int]]:
    parent = {gpu: gpu for gpu in members}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, i in enumerate(members):
        for j in members[a + 1 :]:
            if joined(i, j):
                root_i, root_j = find(i), find(j)
                if root_i != root_j:
                    parent[max(root_i, root_j)] = min(root_i, root_j)
    groups: dict[int, list[int]] = {}
    for gpu in members:
        groups.setdefault(find(gpu), []).append(gpu)
    return sorted(groups.values(), key=lambda group: group[0])


def islands(snapshot: NodeSnapshot) -> tuple[Island, ...]:
    """The node's NVLink islands, then its PCIe groups, each in order of lowest GPU."""
    every = list(range(snapshot.gpu_count))
    nvlink = _components(lambda i, j: snapshot.link(i, j).is_nvlink, every)
    linked = [group for group in nvlink if len(group) > 1]
    alone = sorted(group[0] for group in nvlink if len(group) == 1)
    pcie = _components(lambda i, j: snapshot.link(i, j).label != "SYS", alone)
    return (
        *(Island(f"nvl{k}", tuple(group), NVLINK) for k, group in enumerate(linked)),
        *(Island(f"pcie{k}", tuple(group), PCIE) for k, group in enumerate(pcie)),
    )
