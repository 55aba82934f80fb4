"""Job arrays: each running task is recorded, and released, under its own job id.

The filter leaves arrays to Slurm (no reservation: ``test_job_submit_api``). Each
task is a job of its own (``SLURM_JOB_ID``), and ``scontrol show job`` prints it as
``JobId=2 ArrayJobId=1 ArrayTaskId=0 JobName=...``: the prolog's report of a task
must be read, or the GPUs the task runs on look free (docs/slurm.md).
"""

from __future__ import annotations

from fastapi.testclient import TestClient

from service.slurm import truth
from tests.service.slurm.test_late_prolog import _epilog
from tests.service.slurm.test_truth import gpus, of_job, show_job, started, submit

# Task 0 of `sbatch --array=0-1 --gres=gpu:1 --wrap "sleep 40"` as Slurm 22.05.8 printed it
# (`scontrol -d show job -o 2` in the prolog); task 1 kept the array's id, 1.
TASK_0 = (
    "JobId=2 ArrayJobId=1 ArrayTaskId=0 JobName=wrap UserId=root(0) GroupId=root(0)"
    " MCS_label=N/A Priority=4294901759 Nice=0 Account=(null) QOS=(null) JobState=RUNNING"
    " Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0"
    " DerivedExitCode=0:0 RunTime=00:00:03 TimeLimit=UNLIMITED TimeMin=N/A"
    " SubmitTime=2026-12-05T04:08:24 EligibleTime=2026-12-05T04:08:26"
    " AccrueTime=2026-12-05T04:08:26 StartTime=2026-12-05T04:08:26 EndTime=Unknown"
    " Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-05T04:08:26"
    " Scheduler=Main Partition=gpu AllocNode:Sid=localhost:1989 ReqNodeList=(null)"
    " ExcNodeList=(null) NodeList=node1 BatchHost=node1 NumNodes=1 NumCPUs=2 NumTasks=1"
    " CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=2,node=1,billing=2 Socks/Node=*"
    " NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:g0:1,gpu:g1:0,gpu:g2:0,gpu:g3:0,"
    "gpu:g4:0,gpu:g5:0,gpu:g6:0,gpu:g7:0   Nodes=node1 CPU_IDs=0-1 Mem=0"
    " GRES=gpu:g0:1(IDX:0),gpu:g1:0(IDX:),gpu:g2:0(IDX:),gpu:g3:0(IDX:),gpu:g4:0(IDX:),"
    "gpu:g5:0(IDX:),gpu:g6:0(IDX:),gpu:g7:0(IDX:) MinCPUsNode=1 MinMemoryNode=0"
    " MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0"
    " Licenses=(null) Network=(null) Command=(null) WorkDir=/home/alice"
    " StdErr=/home/alice/slurm-1_0.out StdIn=/dev/null StdOut=/home/alice/slurm-1_0.out"
    " Power= TresPerNode=gres:gpu:1 "
)


def test_an_array_task_is_read_as_its_own_job() -> None:
    task, state = truth.from_show_job(TASK_0, "wrap")
    assert (task.job_id, task.user_name, task.gpus, state) == (
        "2",
        "root",
        {"node1": [0]},
        "RUNNING",
    )


def test_array_tasks_are_recorded_and_released_each_on_its_own(dgx1: TestClient) -> None:
    task_0 = started(dgx1, show_job(2, "gpu:1(IDX:0)", head="ArrayJobId=1 ArrayTaskId=0 "))
    task_1 = started(dgx1, show_job(1, "gpu:1(IDX:1)", head="ArrayJobId=1 ArrayTaskId=1 "))
    assert task_0["action"] == task_1["action"] == "created", (task_0, task_1)
    # Nothing pins a whole-node job over the tasks' GPUs.
    assert submit(dgx1, tres_per_node="gres:gpu:8", req_nodes="node1")["action"] == "unchanged"
    _epilog(dgx1, 2)  # task 0 ends: task 1 keeps its GPU
    assert of_job(dgx1, 2) == []
    [kept] = of_job(dgx1, 1)
    assert gpus(kept) == {"node1": [1]}
    _epilog(dgx1, 1)
    assert of_job(dgx1, 1) == []
    assert submit(dgx1, tres_per_node="gres:gpu:8", req_nodes="node1")["action"] == "modify"
