"""The wiring picture of one node as it is now: the engine's view, the live holders."""

from __future__ import annotations

from service.allocations import api
from service.console.topology_svg import render_svg
from service.console.wiring import Holder, lay_out
from service.errors import NotFound
from service.nodes import service as nodes
from service.state import ServiceState


def topology_svg(state: ServiceState, name: str) -> str:
    """The SVG of node ``name``; :class:`NotFound` when there is no such node."""
    held = nodes.get_node(state, name).allocations  # NotFound for an unknown node
    holders: dict[int, Holder] = {}
    for allocation_id in held:
        try:
            allocation = api.get(state, allocation_id)
        except NotFound:  # ended between the two reads: its GPUs are free now
            continue
        if not allocation.live:
            continue
        holder = Holder(allocation.id, allocation.job_id, allocation.state)
        for gpu in allocation.gpus_by_node().get(name, ()):
            holders[gpu] = holder
    with state.lock:
        if name not in state.cluster:
            raise NotFound(f"no node named {name!r}")
        view = state.cluster.node(name)
        snapshot, island_of = view.snapshot, view.island_of
    return render_svg(lay_out(snapshot, island_of, holders))
