"""Static filters: which nodes and GPUs a request may use at all.

These depend on the request and the cluster's membership, not on what is
free, so they are cached per (constraint, cluster version) and cost one
dictionary lookup on the hot path once warm.
"""

from __future__ import annotations

import re

import numpy as np
from numpy.typing import NDArray

from placement.model_demand import ListColumns, pressure
from placement.request import PlacementRequest
from placement.table import NodeTable

ALL_GPUS = np.int64(-1)


def region_ok(table: NodeTable, regions: tuple[str, ...]) -> NDArray[np.bool_]:
    key = ("region", regions, table.version)
    cached = table.static_cache.get(key)
    if cached is None:
        allowed = set(regions)
        cached = np.zeros(table.slot_count, dtype=np.bool_)
        for entry in table.entries.values():
            cached[entry.slot] = not allowed or entry.snapshot.region in allowed
        table.keep_filter(key, cached)
    return cached.astype(np.bool_, copy=False)


def labels_ok(table: NodeTable, selector: dict[str, str]) -> NDArray[np.bool_]:
    items = tuple(sorted(selector.items()))
    key = ("labels", items, table.version)
    cached = table.static_cache.get(key)
    if cached is None:
        cached = np.zeros(table.slot_count, dtype=np.bool_)
        for entry in table.entries.values():
            labels = entry.snapshot.labels
            cached[entry.slot] = all(labels.get(k) == v for k, v in items)
        table.keep_filter(key, cached)
    return cached.astype(np.bool_, copy=False)


def gpu_eligible(table: NodeTable, request: PlacementRequest) -> NDArray[np.int64]:
    """Per slot, the mask of GPUs whose model and memory the request accepts."""
    if not request.gpu_models and request.min_gpu_memory_mib == 0:
        return np.full(table.slot_count, ALL_GPUS, dtype=np.int64)
    return models_eligible(
        table, tuple(m.upper() for m in request.gpu_models), request.min_gpu_memory_mib
    )


def models_eligible(
    table: NodeTable, models: tuple[str, ...], min_memory_mib: int = 0
) -> NDArray[np.int64]:
    """Per slot, the mask of GPUs of these models (upper case; () = any) with at least
    this much memory."""
    key = ("gpus", models, min_memory_mib, table.version)
    cached = table.static_cache.get(key)
    if cached is None:
        cached = np.zeros(table.slot_count, dtype=np.int64)
        # A fleet has a few GPU names and many GPUs: each name is matched once.
        accepted: dict[str, bool] = {}
        for entry in table.entries.values():
            mask = 0
            for gpu in entry.snapshot.gpus:
                model_ok = accepted.get(gpu.model)
                if model_ok is None:
                    model_ok = accepted[gpu.model] = not models or any(
                        model_matches_name(m, gpu.model) for m in models
                    )
                if model_ok and gpu.memory_mib >= min_memory_mib:
                    mask |= 1 << gpu.index
            cached[entry.slot] = mask
        table.keep_filter(key, cached)
    return cached.astype(np.int64, copy=False)


def model_matches_name(wanted: str, model: str) -> bool:
    """Whether a requested model names this GPU: a whole token, case-insensitive.

    "A100" matches "NVIDIA A100-SXM4-80GB" and "h100" matches "NVIDIA H100
    80GB HBM3", but "A10" does not match an A100 and "B200" does not match a
    GB200: a plain substring test would hand a job the wrong GPU.
    """
    pattern = rf"(?<![A-Z0-9]){re.escape(wanted.upper())}(?![A-Z0-9])"
    return re.search(pattern, model.upper()) is not None


def model_matches(table: NodeTable, request: PlacementRequest) -> NDArray[np.int64]:
    """Per slot, GPUs whose model alone is accepted (to tell model from memory misses)."""
    if not request.gpu_models:
        return np.full(table.slot_count, ALL_GPUS, dtype=np.int64)
    return gpu_eligible(table, request.model_copy(update={"min_gpu_memory_mib": 0}))


def model_pressure(table: NodeTable) -> NDArray[np.float64] | None:
    """Per slot, the pressure on its GPUs' models (placement.model_demand); None while no
    request has named a model and none is configured, so that the ranking is exactly as
    without it."""
    demand = table.model_demand
    if not demand.active:
        return None
    key = (table.version, demand.epoch(), table.clock)
    if table.pressure_cache is not None and table.pressure_cache[0] == key:
        return table.pressure_cache[1]
    n = table.slot_count
    columns = _list_columns(table, n)
    free = np.where(table.present[:n], table.free[:n], 0)
    # A shared GPU's room counts as free capacity of the lists that match the node's GPUs,
    # in proportion: what a share that insists on the model can still use.
    room = table.share_room[:n] / 1000.0
    free_matched = np.bitwise_count(columns.masks & free).sum(axis=1) + columns.share @ room
    free_all = float(np.bitwise_count(free).sum() + room.sum())
    values = pressure(demand.total, columns, free_matched.astype(np.float64), free_all)
    table.pressure_cache = (key, values)
    return values


def _list_columns(table: NodeTable, n: int) -> ListColumns:
    """The demand's lists against the fleet: computed again only when the membership or
    the demand's epoch moves, so a decision pays for the free counts alone."""
    demand = table.model_demand
    key = (table.version, demand.epoch())
    cached = table.pressure_lists
    if cached is not None and cached[0] == key and cached[1].masks.shape[1] == n:
        return cached[1]
    every = np.where(table.present[:n], table.every_gpu[:n], 0)
    count = np.bitwise_count(every)
    per_gpu = np.where(count > 0, 1.0 / np.maximum(count, 1), 0.0)
    # A list no GPU here matches presses nothing: left out, so that invented model names
    # cost a decision nothing.
    lists = []
    rows = []
    for models, asked in demand.by_list.items():
        mask = models_eligible(table, models)[:n] & every
        if mask.any():
            lists.append((models, asked))
            rows.append(mask)
    masks = np.asarray(rows, dtype=np.int64).reshape(len(rows), n)
    columns = ListColumns(
        asked=np.asarray([asked for _, asked in lists], dtype=np.float64),
        masks=masks,
        share=np.bitwise_count(masks) * per_gpu[None, :],
    )
    table.pressure_lists = (key, columns)
    return columns
