"""Plain strings and whole numbers: what a request's fields accept."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from placement import NodeSnapshot, PlacementRequest
from placement.text import forbidden_character


@pytest.mark.parametrize("text", ["\x00", "a\nb", "\x1b[31m", "\x7f", "\x85", "\ud800"])
def test_control_characters_and_lone_surrogates_are_found(text: str) -> None:
    assert forbidden_character(text) is not None


@pytest.mark.parametrize("mark", ["\u202e", "\u202a", "\u2066", "\u2069", "\u200f", "\u061c"])
def test_bidirectional_controls_are_found(mark: str) -> None:
    """'gpu-\u202e7-edon' prints as 'gpu-node-7' in a terminal: an agent's hostname or a
    job's reason could show an operator another name than the one stored."""
    assert forbidden_character(f"gpu-{mark}7-edon") == mark
    with pytest.raises(ValidationError) as caught:
        NodeSnapshot.model_validate({"name": "n0", "hostname": f"n0{mark}"})
    assert caught.value.errors()[0]["loc"] == ("hostname",)


@pytest.mark.parametrize(
    "text",
    [
        "h100-node-7",
        "ünïcode",
        "GPU 0: NVIDIA H100",
        "\U0001f680",
        "\u05e9\u05dc\u05d5\u05dd",
        "👨\u200d👩",
    ],
)
def test_plain_text_passes(text: str) -> None:
    assert forbidden_character(text) is None


@pytest.mark.parametrize("value", [True, False, "4", 4.5, None])
def test_a_count_is_never_a_bool_or_a_string(value: object) -> None:
    with pytest.raises(ValidationError) as caught:
        PlacementRequest.model_validate({"gpus": value})
    assert caught.value.errors()[0]["loc"] == ("gpus",)


def test_a_count_written_with_a_zero_fraction_is_that_count() -> None:
    # JSON Schema, and so every generated client, counts 4.0 as an integer.
    assert PlacementRequest.model_validate_json('{"gpus": 4.0, "tasks": 2.0}').total_gpus == 8


@pytest.mark.parametrize(
    "body",
    [
        {"tasks": True},
        {"cpus_per_task": "8"},
        {"min_gpu_memory_mib": 2**40},
        {"max_ring_loss": "0.1"},
        {"max_ring_loss": float("nan")},
    ],
)
def test_other_numbers_are_strict_and_bounded(body: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        PlacementRequest.model_validate(body)


@pytest.mark.parametrize(
    "body",
    [
        {"mig_profile": ""},
        {"mig_profile": "   "},
        {"gpu_models": [""]},
        {"gpu_models": ["H100", " "]},
        {"job_id": "job\x00"},
        {"nodes": ["n\x00"]},
        {"nodes": ["ok", "x" * 254]},
        {"exclude_nodes": [""]},
        {"exclude_nodes": ["ok", "b\ud800"]},
        {"exclude_nodes": ["ok", "c\x85"]},
        {"regions": ["eu\n"]},
        {"node_labels": {"zone": "a\x00"}},
        {"node_labels": {"zo\x01ne": "a"}},
    ],
)
def test_blank_choices_and_control_characters_are_refused(body: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        PlacementRequest.model_validate(body)


def test_snapshot_numbers_are_strict_and_seq_fits_a_bigint() -> None:
    base = {"name": "n0"}
    assert NodeSnapshot.model_validate({**base, "seq": 2**63 - 1}).seq == 2**63 - 1
    for bad in (2**63, True, "7", -1):
        with pytest.raises(ValidationError):
            NodeSnapshot.model_validate({**base, "seq": bad})


def test_snapshot_strings_refuse_control_characters() -> None:
    with pytest.raises(ValidationError) as caught:
        NodeSnapshot.model_validate({"name": "n0", "hostname": "n0\x00"})
    assert caught.value.errors()[0]["loc"] == ("hostname",)


def test_a_node_list_names_the_name_it_refuses() -> None:
    # A list's characters are checked once over all its names; the refusal still says which.
    with pytest.raises(ValidationError) as caught:
        PlacementRequest.model_validate({"exclude_nodes": ["a", "b", "c\x1b[31m"]})
    assert "name 2" in str(caught.value) and "U+001B" in str(caught.value)
