"""Heterogeneous jobs: each component is recorded, and released, under its own job id.

``sbatch --gres=gpu:1 : --gres=gpu:2`` makes one job per component, each with its own
id (``SLURM_JOB_ID`` in its prolog and epilog, ``job_id`` in squeue), and Slurm 22.05
prints a component as ``JobId=2 HetJobId=1 HetJobOffset=1 JobName=wrap
HetJobIdSet=1-2 UserId=...``: the prolog's report of each must be read, or the GPUs a
component runs on look free until the reconcile loop's next read (docs/slurm.md).
"""

from __future__ import annotations

from fastapi.testclient import TestClient

from service.slurm import truth
from tests.service.slurm.test_late_prolog import _epilog
from tests.service.slurm.test_truth import gpus, of_job, show_job, started, submit

_COMMON = (
    " JobName=wrap HetJobIdSet=1-2 UserId=root(0) GroupId=root(0) MCS_label=N/A"
    " Priority={priority} Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None"
    " Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0"
    " DerivedExitCode=0:0 RunTime=00:00:04 TimeLimit=UNLIMITED TimeMin=N/A"
    " SubmitTime=2026-12-05T04:28:38 EligibleTime=2026-12-05T04:28:38"
    " AccrueTime=2026-12-05T04:28:38 StartTime=2026-12-05T04:28:39 EndTime=Unknown"
    " Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-05T04:28:39"
    " Scheduler=Backfill Partition=gpu AllocNode:Sid=localhost:26348"
)
_ALLOCATION = "00607d96-caef-4e6a-930f-f9e5d185cc3b"
# `sbatch --gres=gpu:1 -w node1 : --gres=gpu:2 -w node2 --wrap "sleep 8"` as Slurm 22.05.8
# printed it (`scontrol -d show job -o 1+0` and `... 1+1`): the filter pinned component 0
# (the batch one) and left component 1 to Slurm.
COMPONENT_0 = (
    "JobId=1 HetJobId=1 HetJobOffset=0"
    + _COMMON.format(priority=4294901759)
    + " ReqNodeList=node1 ExcNodeList=node2 NodeList=node1 BatchHost=node1 NumNodes=1"
    " NumCPUs=2 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=2,node=1,billing=2"
    " Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:g0:1"
    "   Nodes=node1 CPU_IDs=0-1 Mem=0 GRES=gpu:g0:1(IDX:0) MinCPUsNode=1 MinMemoryNode=0"
    " MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0"
    " Licenses=(null) Network=(null) Command=(null) WorkDir=/home/alice"
    f" AdminComment=topoplace alloc={_ALLOCATION} ring=0GB/s bandwidth=1.00 gpus=0 "
    " StdErr=/home/alice/het-1.out StdIn=/dev/null StdOut=/home/alice/het-1.out Power="
    " TresPerNode=gres:gpu:g0:1 "
)
COMPONENT_1 = (
    "JobId=2 HetJobId=1 HetJobOffset=1"
    + _COMMON.format(priority=4294901758)
    + " ReqNodeList=node2 ExcNodeList=node1 NodeList=node2 BatchHost=node2 NumNodes=1"
    " NumCPUs=2 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=2,node=1,billing=2"
    " Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:g0:1,gpu:g1:0,"
    "gpu:g2:0,gpu:g3:1,gpu:g4:0,gpu:g5:0,gpu:g6:0,gpu:g7:0   Nodes=node2 CPU_IDs=0-1"
    " Mem=0 GRES=gpu:g0:1(IDX:0),gpu:g1:0(IDX:),gpu:g2:0(IDX:),gpu:g3:1(IDX:3),"
    "gpu:g4:0(IDX:),gpu:g5:0(IDX:),gpu:g6:0(IDX:),gpu:g7:0(IDX:) MinCPUsNode=1"
    " MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00"
    " OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null)"
    " WorkDir=/home/alice StdErr=/home/alice/het-2.out StdIn=/dev/null"
    " StdOut=/home/alice/het-2.out Power= TresPerNode=gres:gpu:2 "
)


def test_each_component_of_a_het_job_is_read_as_its_own_job() -> None:
    first, state = truth.from_show_job(COMPONENT_0, "wrap")
    assert (first.job_id, first.user_name, first.gpus, first.named, state) == (
        "1",
        "root",
        {"node1": [0]},
        [_ALLOCATION],
        "RUNNING",
    )
    second, state = truth.from_show_job(COMPONENT_1, "wrap")
    assert (second.job_id, second.user_name, second.gpus, second.named, state) == (
        "2",
        "root",
        {"node2": [0, 3]},
        [],
        "RUNNING",
    )


def test_the_leaders_whole_record_names_only_its_own_admin_comment() -> None:
    """``scontrol show job 1`` (the leader's own id) prints every component, one a line:
    read as the leader's, the next component's admin comment is not the leader's, or
    its reservation would learn the leader's job id and outlive its own end."""
    other = "11111111-2222-4333-8444-555555555555"
    component_1 = COMPONENT_1.replace(
        " StdErr=", f" AdminComment=topoplace alloc={other} gpus=0,3  StdErr=", 1
    )
    leader, _ = truth.from_show_job(f"{COMPONENT_0}\n{component_1}\n", "wrap")
    assert (leader.job_id, leader.gpus, leader.named) == ("1", {"node1": [0]}, [_ALLOCATION])


def test_het_job_components_are_recorded_and_released_each_on_its_own(
    dgx1: TestClient,
) -> None:
    """The harm: while a component's report is refused, the GPUs it runs on look free,
    and the filter pins a whole-node job onto them (two jobs on one GPU)."""
    head = "HetJobId=1 HetJobOffset={} "
    decision = submit(dgx1, tres_per_node="gres:gpu:1", req_nodes="node1")
    [reserved] = decision["allocation_ids"]
    pinned = ",".join(f"gpu:g{g}:1(IDX:{g})" for g in decision["gpu_indices"])
    comment = decision["set"]["admin_comment"]
    after = "HetJobIdSet=1-2 "
    leader = show_job(1, pinned, "node1", comment, head=head.format(0), after_name=after)
    other = show_job(2, "gpu:2(IDX:0,3)", "node2", head=head.format(1), after_name=after)
    assert started(dgx1, leader, "train")["action"] == "attached"
    assert started(dgx1, other, "train")["action"] == "created"
    assert [a["id"] for a in of_job(dgx1, 1)] == [reserved]
    # Nothing pins a whole-node job over the second component's GPUs.
    assert submit(dgx1, tres_per_node="gres:gpu:8", req_nodes="node2")["action"] == "unchanged"
    _epilog(dgx1, 2)  # `scancel 1+1` ends component 1 alone: component 0 keeps its GPU
    assert of_job(dgx1, 2) == []
    [kept] = of_job(dgx1, 1)
    assert gpus(kept) == {"node1": decision["gpu_indices"]}
    assert submit(dgx1, tres_per_node="gres:gpu:8", req_nodes="node2")["action"] == "modify"
    _epilog(dgx1, 1)
    assert of_job(dgx1, 1) == []
