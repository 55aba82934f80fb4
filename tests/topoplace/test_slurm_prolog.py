"""The prolog asks scontrol for its own job's record alone."""

from __future__ import annotations

from topoplace.slurm_prolog import _own_record


def test_an_array_task_is_asked_for_by_array_and_index() -> None:
    """`scontrol show job 1` shows every task of array 1 when task 1 kept the id 1."""
    task = {"SLURM_JOB_ID": "1", "SLURM_ARRAY_JOB_ID": "1", "SLURM_ARRAY_TASK_ID": "1"}
    assert _own_record(task) == "1_1"
    assert _own_record({"SLURM_JOB_ID": "7"}) == "7"
