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
carries, against how much of the free capacity those models are: for each
model list L, (GPUs asked with L / all GPUs asked) / (free GPUs matching L /
all free GPUs, the room on shared GPUs included), summed over the lists that
match the node's GPUs (weighted by the share of the node's GPUs they match).
A model nobody insists on has pressure 0; T4s that a fifth of the demand
needs while they are a tenth of the free GPUs have 2. Against the free
capacity, not the fleet: on openb_pod_list_gpuspec05 0.4% of the demand
insists on P100s, a tenth of their 4.3% of the fleet, so against the fleet
they were never pressed, and the pods that run
anywhere took all 265 within the first 460 pods; the next P100-only pod was
the engine's first failure (pod 641). Against the free GPUs the ratio grows
as they go, and what may run anywhere stops before the last ones. The
ranking (placement.ranking) sends a request to the least pressed of its
equally good nodes, so requests that can go anywhere leave the pressed
models to the requests that cannot. With no model list, there is no
pressure and the ranking is as without it.

The demand is configured (``ClusterState(model_demand=...)``: GPUs asked per
model list, () for any model, any scale) or observed from the requests
decided (``ClusterState.place``), never decreased, like the host mix
(placement.host): it is the mix of requests the cluster is asked, not what
runs now. Observed, it lives in the process: a restart starts it again from
nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

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
    """GPUs asked per model list (and in all), configured or as requests are decided."""

    def __init__(self, configured: Mapping[tuple[str, ...], float] | None = None) -> None:
        self.total = 0.0
        self.by_list: dict[tuple[str, ...], float] = {}
        self.observed = 0  # requests naming models, seen
        self.configured = configured is not None
        if configured is not None:
            lists = {model_list(m) for m in configured if m}
            if len(lists) > MAX_LISTS:
                raise ValueError(f"a model demand has at most {MAX_LISTS} model lists")
            for models, gpus in configured.items():
                if not (gpus >= 0 and np.isfinite(gpus)):
                    raise ValueError(f"GPUs asked are >= 0, not {gpus} for {models}")
                self.total += gpus
                if models and gpus > 0:
                    key = model_list(models)
                    self.by_list[key] = self.by_list.get(key, 0.0) + gpus

    def observe(self, models: tuple[str, ...], gpus: float) -> None:
        if gpus <= 0 or self.configured:
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


@dataclass(frozen=True, slots=True)
class ListColumns:
    """The demand's model lists against the fleet, fixed until the membership or the
    demand changes: per list, the GPUs asked, and per list and node the GPUs it matches
    (a bit mask) and the share of the node's GPUs that is."""

    asked: NDArray[np.float64]  # (lists,)
    masks: NDArray[np.int64]  # (lists, nodes)
    share: NDArray[np.float64]  # (lists, nodes)


def pressure(
    total: float,
    lists: ListColumns,
    free_matched: NDArray[np.float64],
    free_all: float,
) -> NDArray[np.float64]:
    """Per node, the pressure (0..PRESSURE_CAP): for each model list, its share of the
    demand (GPUs asked over ``total``) against its share of the free capacity
    (``free_matched``, the free GPUs it matches, over ``free_all``), summed over the lists
    weighted by the share of the node's GPUs each matches.

    Against the free capacity, not the whole fleet: a model that few requests insist on
    is still pressed once what may run anywhere has taken most of it, and a list whose
    GPUs are all taken is pressed to the cap."""
    nodes = lists.share.shape[1]
    if total <= 0 or free_all <= 0 or not lists.asked.size:
        return np.zeros(nodes, dtype=np.float64)
    wanted = lists.asked / total * free_all  # free GPUs each list's share of the demand is
    ratio = np.divide(
        wanted,
        free_matched,
        out=np.full(wanted.shape, PRESSURE_CAP),
        where=free_matched > 0,
    )
    out: NDArray[np.float64] = ratio @ lists.share
    return np.minimum(out, PRESSURE_CAP)
