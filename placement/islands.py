"""NVLink islands: connected components of a node's NVLink graph.

Names are stable for a given wiring: islands are numbered by their lowest
GPU index (``nvl0`` holds GPU 0), so a restart or a re-report of the same
machine yields the same names. A GPU without NVLink is an island of one.
"""

from __future__ import annotations

from dataclasses import dataclass

from placement.snapshot import NodeSnapshot


@dataclass(frozen=True, slots=True)
class Island:
    name: str
    gpus: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.gpus)


def islands(snapshot: NodeSnapshot) -> tuple[Island, ...]:
    n = snapshot.gpu_count
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i in range(n):
        for j in range(i + 1, n):
            if snapshot.link(i, j).is_nvlink:
                root_i, root_j = find(i), find(j)
                if root_i != root_j:
                    parent[max(root_i, root_j)] = min(root_i, root_j)
    groups: dict[int, list[int]] = {}
    for gpu in range(n):
        groups.setdefault(find(gpu), []).append(gpu)
    ordered = sorted(groups.values(), key=lambda members: members[0])
    return tuple(Island(f"nvl{k}", tuple(members)) for k, members in enumerate(ordered))
