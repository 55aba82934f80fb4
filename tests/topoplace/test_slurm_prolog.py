"""The prolog asks scontrol for its own job's record alone."""

from __future__ import annotations

from topoplace.slurm_prolog import own_record


def test_an_array_task_is_asked_for_by_array_and_index() -> None:
    """`scontrol show job 1` shows every task of array 1 when task 1 kept the id 1."""
    task = {"SLURM_JOB_ID": "1", "SLURM_ARRAY_JOB_ID": "1", "SLURM_ARRAY_TASK_ID": "1"}
    assert own_record(task) == "1_1"
    assert own_record({"SLURM_JOB_ID": "7"}) == "7"


def test_a_het_job_component_is_asked_for_by_het_job_and_offset() -> None:
    """`scontrol show job 1` shows every component of het job 1 (its leader's id)."""
    leader = {"SLURM_JOB_ID": "1", "SLURM_HET_JOB_ID": "1", "SLURM_HET_JOB_OFFSET": "0"}
    assert own_record(leader) == "1+0"
    other = {"SLURM_JOB_ID": "2", "SLURM_HET_JOB_ID": "1", "SLURM_HET_JOB_OFFSET": "1"}
    assert own_record(other) == "1+1"
