"""topoplace's placement engine: pure, deterministic, no I/O.

This package may import only the standard library, numpy and pydantic. It
takes node snapshots and placement requests in and gives placements out: no
sockets, no files, no clocks, no database. The service and the agent depend
on it; it depends on neither (a test enforces this).
"""

from placement.bandwidth import DEFAULT_BANDWIDTH, BandwidthTable, bandwidth_matrix
from placement.cluster import AllocationError, ClusterState, UnknownNodeError
from placement.islands import Island, islands
from placement.node_view import NodeView
from placement.outcome import (
    Cause,
    NodeVerdict,
    Outcome,
    Placement,
    ReasonGroup,
    ScoreParts,
    TaskPlacement,
)
from placement.request import PlacementRequest
from placement.snapshot import (
    CpuLink,
    Fabric,
    Gpu,
    Health,
    MigInstance,
    Nic,
    NodeSnapshot,
    NumaNode,
)

__all__ = [
    "DEFAULT_BANDWIDTH",
    "AllocationError",
    "BandwidthTable",
    "Cause",
    "ClusterState",
    "CpuLink",
    "Fabric",
    "Gpu",
    "Health",
    "Island",
    "MigInstance",
    "Nic",
    "NodeSnapshot",
    "NodeVerdict",
    "NodeView",
    "NumaNode",
    "Outcome",
    "Placement",
    "PlacementRequest",
    "ReasonGroup",
    "ScoreParts",
    "TaskPlacement",
    "UnknownNodeError",
    "bandwidth_matrix",
    "islands",
]
