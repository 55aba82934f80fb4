from __future__ import annotations

import pytest

from slurm_formats.tres import GpuAsk, TresError, gpu_ask, per_gpu_tres


@pytest.mark.parametrize(
    ("tres", "ask"),
    [
        (None, None),
        ("", None),
        ("gres:shard:2", None),
        ("gres:gpu:4", GpuAsk(4)),
        ("gres:gpu:h100:2", GpuAsk(2, ("h100",))),
        ("gres:gpu:2,gres:shard:1", GpuAsk(2)),
        ("gres:gpu:g4:1,gres:gpu:g6:1", GpuAsk(2, ("g4", "g6"))),
    ],
)
def test_gpu_ask(tres: str | None, ask: GpuAsk | None) -> None:
    assert gpu_ask(tres) == ask


def test_per_gpu_types_and_models_are_told_apart() -> None:
    exact = GpuAsk(2, ("g4", "g6"))
    assert exact.per_gpu_indices == (4, 6) and exact.model_types == ()
    model = GpuAsk(2, ("v100",))
    assert model.per_gpu_indices is None and model.model_types == ("v100",)


@pytest.mark.parametrize("tres", ["gres:gpu:0", "gres:gpu:x", "gres:gpu:a:b:c"])
def test_unreadable_gpu_requests_are_refused(tres: str) -> None:
    with pytest.raises(TresError):
        gpu_ask(tres)


def test_per_gpu_tres_names_each_gpu_once_in_order() -> None:
    assert per_gpu_tres([6, 2]) == "gres:gpu:g2:1,gres:gpu:g6:1"


@pytest.mark.parametrize("count", ["9" * 5000, "9" * 21, "\u00b2", "\u0661"])
def test_a_count_int_would_misread_is_refused_as_unreadable(count: str) -> None:
    with pytest.raises(TresError, match="GPU count"):
        gpu_ask(f"gres:gpu:{count}")


@pytest.mark.parametrize("gpu_type", [f"g{'1' * 5000}", "g\u0661"])
def test_a_type_that_names_no_index_is_no_per_gpu_type(gpu_type: str) -> None:
    ask = gpu_ask(f"gres:gpu:{gpu_type}:1")
    assert ask is not None and ask.per_gpu_indices is None
