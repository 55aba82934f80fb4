"""placement/ imports only downwards, in the layers docs/engine.md lists.

No cycle (tests/test_import_cycles.py) is the floor; this holds the shape:
the table never imports the search, the search never imports the facade.
A new module must be given a layer here (and in docs/engine.md).
"""

from __future__ import annotations

from tests.test_import_cycles import ROOT, import_graph

# Bottom first. A module may import modules of its own layer or of the layers below.
LAYERS: tuple[tuple[str, ...], ...] = (
    # values: what callers hand in and get back, and the words for them
    (
        "text",
        "numbers",
        "links",
        "cpuset",
        "gpu_family",
        "snapshot",
        "request",
        "outcome",
        "bandwidth",
        "islands",
        "topo_text",
        "profiles",
    ),
    # one node design: its answer tables and how sets and nodes are ranked
    (
        "what_is_left",
        "host",
        "task_mix",
        "model_demand",
        "workload_mix",
        "topology_class",
        "node_choice",
        "large_node",
        "class_registry",
        "numa",
        "ranking",
        "explain",
    ),
    # the table: slots, per-slot arrays, change log, cache storage; read-only node views
    ("node_entry", "node_view", "shape_cache", "table"),
    # scoring and search over the table
    (
        "eligibility",
        "analysis",
        "task_builder",
        "capacity",
        "fast_path",
        "screen",
        "mig",
        "gang",
        "shares",
        "decide",
    ),
    # the facade
    ("cluster",),
)


def _layer_of(module: str) -> int:
    """Layer of 'placement.x' or 'placement.x.y' (a subpackage is one unit)."""
    parts = module.split(".")
    if len(parts) == 1:
        return len(LAYERS)  # the package's __init__ re-exports from every layer
    for i, layer in enumerate(LAYERS):
        if parts[1] in layer:
            return i
    raise AssertionError(f"{module} has no layer: add it to LAYERS and docs/engine.md")


def test_every_import_goes_to_the_same_layer_or_below() -> None:
    graph = import_graph(ROOT, "placement")
    upward = [
        f"{module} (layer {_layer_of(module)}) imports {target} (layer {_layer_of(target)})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if _layer_of(target) > _layer_of(module)
    ]
    assert upward == []
