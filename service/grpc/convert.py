"""Between protobuf messages and the service layer's shapes.

Requests become the REST request models (the same pydantic validation, the
same field names); the allocations API's typed results (results.py) become
messages field by field: building messages directly is far cheaper than
going through JSON.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from google.protobuf.unknown_fields import UnknownFieldSet
from pydantic import BaseModel, ConfigDict, Field

from placement.text import forbidden_character
from service.allocations.results import Allocation, NodeScore, Task, TaskPlan
from service.allocations.schemas import AllocationState
from service.events import Event
from service.grpc.gen import topoplace_pb2 as pb
from service.nodes.schemas import NodeView

# Fields removed from a request message, by number (the .proto reserves them).
# A client built from the older .proto still sends them; protobuf would keep
# them as unknown fields and the request would run as if they were not there.
# They are passed on by name instead, so the request model refuses them with
# the same words REST uses.
REMOVED_FIELDS: dict[str, dict[int, str]] = {
    "PlaceRequest": {16: "priority"},
    "ScoreRequest": {16: "priority"},
}


def request_fields(message: Message) -> dict[str, Any]:
    """The fields a client set, as the REST JSON body would carry them.

    Unset optional fields are left out so the REST defaults apply; a present
    ``nodes`` (NodeNames) becomes a list, even an empty one. A removed field
    the client still set is there with its raw value (see REMOVED_FIELDS).
    """
    out: dict[str, Any] = {}
    removed = REMOVED_FIELDS.get(message.DESCRIPTOR.name)
    if removed:
        unknown = UnknownFieldSet(message)
        for index in range(len(unknown)):  # indexed: the stubs declare no __iter__
            name = removed.get(unknown[index].field_number)
            if name is not None:
                out[name] = unknown[index].data
    for descriptor, value in message.ListFields():
        if descriptor.message_type is not None and descriptor.message_type.name == "NodeNames":
            out[descriptor.name] = list(value.names)
        elif descriptor.message_type is not None and descriptor.message_type.GetOptions().map_entry:
            out[descriptor.name] = dict(value)
        elif descriptor.is_repeated:
            out[descriptor.name] = list(value)
        else:
            out[descriptor.name] = value
    return out


def forbidden_string(message: Message, prefix: str = "") -> str | None:
    """The first string field (nested ones too) carrying a control character, or None.

    As REST's request guard does for path and query parameters: ids and names go
    to the database as they are, and Postgres cannot store NUL. Fields named
    ``*_json`` carry JSON text, where newlines are formatting; the model that
    parses them refuses control characters inside its strings.
    """
    for descriptor, value in message.ListFields():
        name = f"{prefix}{descriptor.name}"
        if descriptor.type == FieldDescriptor.TYPE_STRING and not name.endswith("_json"):
            strings = list(value) if descriptor.is_repeated else [value]
            if any(forbidden_character(text) is not None for text in strings):
                return name
        elif descriptor.message_type is not None:
            if descriptor.message_type.GetOptions().map_entry:
                for key, item in value.items():
                    texts = [key, item] if isinstance(item, str) else [key]
                    if any(isinstance(t, str) and forbidden_character(t) for t in texts):
                        return name
            elif descriptor.is_repeated:
                for item in value:
                    found = forbidden_string(item, f"{name}.")
                    if found is not None:
                        return found
            else:
                found = forbidden_string(value, f"{name}.")
                if found is not None:
                    return found
    return None


class ListQuery(BaseModel):
    """The REST query of GET /v1/allocations, with the same limits."""

    model_config = ConfigDict(extra="forbid")

    job_id: str | None = Field(default=None, max_length=256)
    node: str | None = Field(default=None, max_length=253)
    state: AllocationState | None = None
    limit: int = Field(default=500, ge=1, le=10_000)


def timestamp(value: str | datetime | None) -> Timestamp | None:
    if value is None:
        return None
    out = Timestamp()
    if isinstance(value, datetime):
        out.FromDatetime(value)
    else:
        out.FromJsonString(value)
    return out


def task(value: TaskPlan) -> pb.Task:
    score = value.score
    return pb.Task(
        task=value.task,
        node=value.node,
        gpu_indices=value.gpu_indices,
        gpu_uuids=value.gpu_uuids,
        mig_uuids=value.mig_uuids,
        cpuset=value.cpuset,
        cpus=value.cpus,
        numa_nodes=value.numa_nodes,
        islands=value.islands,
        nvlink_connected=value.nvlink_connected,
        score=pb.TaskScore(
            ring_gbps=score.ring_gbps,
            pair_sum_gbps=score.pair_sum_gbps,
            bandwidth=score.bandwidth,
            fragmentation=score.fragmentation,
            numa_nodes=score.numa_nodes,
            free_after=score.free_after,
        ),
        reason=value.reason,
        # /score tasks reserve nothing and carry no environment
        env=value.env if isinstance(value, Task) else {},
        gpu_fraction=value.gpu_fraction if isinstance(value, Task) else None,
    )


def allocation(value: Allocation) -> pb.Allocation:
    return pb.Allocation(
        id=value.id,
        state=value.state,
        job_id=value.job_id,
        owner=value.owner,
        tasks=[task(t) for t in value.tasks],
        ring_gbps=value.ring_gbps,
        fabric_domain=value.fabric_domain,
        network_blocks=value.network_blocks,
        reason=value.reason,
        created_at=timestamp(value.created_at),
        expires_at=timestamp(value.expires_at),
        ended_at=timestamp(value.ended_at),
    )


def node_score(value: NodeScore) -> pb.NodeScore:
    return pb.NodeScore(
        node=value.node,
        fits=value.fits,
        rank=value.rank,
        score=value.score,
        cause=value.cause,
        message=value.message,
        resolvable=value.resolvable,
        task=task(value.task) if value.task is not None else None,
    )


def node(view: NodeView) -> pb.Node:
    return pb.Node(
        name=view.name,
        region=view.region,
        labels=view.labels,
        cpu_isa=view.cpu_isa,
        gpu_count=view.gpu_count,
        free_gpus=view.free_gpus,
        gpus=[
            pb.NodeGpu(
                index=g.index,
                uuid=g.uuid,
                model=g.model,
                memory_mib=g.memory_mib,
                numa_node=g.numa_node,
                health=g.health,
                mig_enabled=g.mig_enabled,
                free=g.free,
                island=g.island,
                share_milli=g.share_milli,
            )
            for g in view.gpus
        ],
        islands=[
            pb.Island(name=i.name, gpus=i.gpus, free=i.free, kind=i.kind) for i in view.islands
        ],
        fabric_domain=view.fabric_domain,
        state=view.state,
        seq=view.seq,
        reported_at=timestamp(view.reported_at),
        heartbeat_at=timestamp(view.heartbeat_at),
        allocations=view.allocations,
    )


def event(value: Event) -> pb.Event:
    return pb.Event(
        seq=value.seq,
        at=timestamp(value.at),
        kind=value.kind,
        type=value.type,
        allocation=allocation(value.allocation) if value.allocation is not None else None,
        node=value.node or "",
    )
