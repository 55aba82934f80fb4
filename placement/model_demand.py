"""Which GPU models the cluster's requests insist on, and how hard each model is pressed.

A request that names GPU models (``gpu_models``) can run only there; one that
names none can run anywhere. When the second takes the last free GPUs of a
model that many of the first need, those wait while other models sit free:
on the Alibaba v2023 trace with a third of its pods naming models
(openb_pod_list_gpuspec33), 970 T4-only pods failed that way while GPUs of
other models were free (docs/benchmarks.md). FGD counts such GPUs as
fragmented for the task types that cannot use them; HiveD keeps cells of a
kind for the virtual clusters that ask for that kind.

The **pressure** on a node is how much of the demand restricted to models it
carries, against how much of the cluster's GPUs those models are: for each
model list L seen, (GPUs asked with L / all GPUs asked) / (GPUs matching L /
all GPUs), summed over the lists that match the node's GPUs (weighted by the
share of the node's GPUs they match). A model nobody insists on has pressure
0; T4s that a fifth of the demand needs while they are an eighth of the
fleet have about 1.5. The ranking (placement.ranking) sends a request to the
least pressed of its equally good nodes, so requests that can go anywhere
leave the pressed models to the requests that cannot. With no request
naming a model, there is no pressure and the ranking is as without it.

The demand is observed from the requests decided (``ClusterState.place``),
never decreased, like the host mix (placement.host): it is the mix of
requests the cluster is asked, not what runs now. It lives in the process:
a restart starts it again from nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray

MAX_LISTS = 64  # model lists are the callers' to choose: the smallest demand goes past this
PRESSURE_CAP = 4.0  # beyond 4x its share of the fleet a model is simply scarce
# The pressure is recomputed at each of the first EXACT_FOR observations, then at every
# EVERY_AFTER-th: the demand's shares move slowly once there is some.
EXACT_FOR = 64
EVERY_AFTER = 64


def model_list(models: Iterable[str]) -> tuple[str, ...]:
    """One key per set of model names, however the caller spelled and ordered it."""
    return tuple(sorted({m.upper() for m in models}))


class ModelDemand:
    """GPUs asked per model list (and in all), as requests are decided."""

    def __init__(self) -> None:
        self.total = 0.0
        self.by_list: dict[tuple[str, ...], float] = {}
        self.observed = 0  # requests naming models, seen

    def observe(self, models: tuple[str, ...], gpus: float) -> None:
        if gpus <= 0:
            return
        self.total += gpus
        if not models:
            return
        key = model_list(models)
        if key not in self.by_list and len(self.by_list) >= MAX_LISTS:
            smallest = min(self.by_list, key=self.by_list.__getitem__)
            if self.by_list[smallest] > gpus:
                return  # a list asked once does not push out one asked more
            del self.by_list[smallest]
        self.by_list[key] = self.by_list.get(key, 0.0) + gpus
        self.observed += 1

    @property
    def active(self) -> bool:
        return bool(self.by_list)

    def epoch(self) -> int:
        """Changes when the pressure should be computed again."""
        if self.observed <= EXACT_FOR:
            return self.observed
        return EXACT_FOR + self.observed // EVERY_AFTER


def pressure(
    demand: ModelDemand,
    matching: Iterable[tuple[float, NDArray[np.int64]]],
    gpu_count: NDArray[np.int64],
) -> NDArray[np.float64]:
    """Per node, the pressure (0..PRESSURE_CAP) from ``matching``: for each model list,
    its GPUs asked and, per node, how many of the node's GPUs it matches."""
    out = np.zeros(gpu_count.size, dtype=np.float64)
    supply_all = float(gpu_count.sum())
    if demand.total <= 0 or supply_all <= 0:
        return out
    share_of_nodes = np.where(gpu_count > 0, 1.0 / np.maximum(gpu_count, 1), 0.0)
    for asked, matched in matching:
        supply = float(matched.sum())
        if supply <= 0:
            continue  # a list no GPU here matches presses nothing
        ratio = (asked / demand.total) / (supply / supply_all)
        out += ratio * matched * share_of_nodes
    return np.minimum(out, PRESSURE_CAP)
