"""Comparing a stored request with a replayed one across a removed field."""

from __future__ import annotations

import json

from service.allocations.schemas import PlaceRequest
from service.allocations.stored_request import same_request


def test_the_same_text_is_the_same_request() -> None:
    text = PlaceRequest(gpus=2).model_dump_json()
    assert same_request(text, text)


def test_a_removed_field_in_the_stored_request_is_ignored() -> None:
    new = PlaceRequest(gpus=2, job_id="j").model_dump_json()
    old = new.replace('"exclude_nodes":[]', '"exclude_nodes":[],"priority":7')
    assert old != new and same_request(old, new)


def test_anything_else_that_differs_is_another_request() -> None:
    new = PlaceRequest(gpus=2).model_dump_json()
    assert not same_request(PlaceRequest(gpus=3).model_dump_json(), new)
    with_priority = json.dumps(
        {**json.loads(PlaceRequest(gpus=3).model_dump_json()), "priority": 0}
    )
    assert not same_request(with_priority, new)
    assert not same_request("not json", new)
    assert not same_request("[]", new)


def test_labels_in_another_order_are_the_same_request() -> None:
    # A map's order means nothing: gRPC hands its map fields over in an order of its
    # own, which differs between processes, and a client may build its JSON either way.
    stored = PlaceRequest(gpus=2, node_labels={"zone": "a", "rack": "r1"}).model_dump_json()
    retried = PlaceRequest(gpus=2, node_labels={"rack": "r1", "zone": "a"}).model_dump_json()
    assert stored != retried and same_request(stored, retried)
    other = PlaceRequest(gpus=2, node_labels={"rack": "r2", "zone": "a"}).model_dump_json()
    assert not same_request(stored, other)


def test_a_retry_naming_the_added_fields_as_null_is_the_same_request() -> None:
    # A row stored before cpu_milli and memory_mib existed, retried by the same client
    # after the upgrade: its request now carries them as null.
    old = '{"gpus":1,"tasks":1}'
    assert same_request(old, '{"gpus":1,"tasks":1,"cpu_milli":null,"memory_mib":null}')
    assert not same_request(old, '{"gpus":1,"tasks":1,"cpu_milli":500,"memory_mib":null}')


def test_a_field_left_out_at_its_default_is_the_same_request() -> None:
    # A stored row written before a field with a non-null default existed, retried
    # with the field at that default: no special case names the field.
    full = PlaceRequest(gpus=2).model_dump_json()
    old = json.loads(full)
    del old["max_ring_loss"]
    assert same_request(json.dumps(old), full)
    assert same_request(full, json.dumps(old))  # and the other way round
    other = PlaceRequest(gpus=2, objective="balanced", max_ring_loss=0.25).model_dump_json()
    balanced = {**old, "objective": "balanced"}
    assert not same_request(json.dumps(balanced), other)  # 0.25 is not the default 0.5
