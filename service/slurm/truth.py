"""What Slurm really runs: a job's node(s) and GPU indices, recorded as its allocation.

Two sources say it, in the same terms: the prolog (``topoplace slurm
prolog``, run by slurmctld as PrologSlurmctld when a job starts) sends
``scontrol -d show job -o JOBID``; the reconcile loop reads ``squeue --json``
(``nodes`` and ``gres_detail`` per job). Either way the job's GPUs are the
``(IDX:...)`` lists Slurm prints per node, and ``record`` makes the
service's allocation say the same (``observe`` of service/allocations/api.py):
Slurm is running the job, so its choice wins over any reservation.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from placement.snapshot import MAX_GPUS
from placement.text import forbidden_character
from service.allocations import api as allocations
from service.allocations.results import Observation
from service.slurm.schemas import MAX_USER_NAME
from service.slurm.service import OWNER_PREFIX
from service.state import ServiceState
from slurm_formats import hostlist
from slurm_formats.admin_comment import allocation_ids

log = logging.getLogger("topoplace.slurm")
_IDX = re.compile(r"\(IDX:([0-9,\-]*)\)")
_NODE_GRES = re.compile(r"\bNodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=(\S*)")
# Between the id and the name Slurm prints an array task's array id and index, or a
# het job component's het job id and offset (each task or component is a job of its
# own, with its own id), never text a user wrote.
_HEAD = re.compile(
    r"\s*JobId=(\d+) (?:ArrayJobId=\d+ ArrayTaskId=\S+ (?:ArrayTaskThrottle=\d+ )?"
    r"|HetJobId=\d+ HetJobOffset=\d+ )?JobName=",
    re.ASCII,  # \d: Slurm's digits only, not "\u0661\u0662", which int() reads as 12
)
# A het job component's name is followed by the het job's ids (Slurm's), then the user.
_USER = re.compile(r"(?: HetJobIdSet=[0-9,\-]+)? UserId=([^\s(]+)")
# Slurm prints the state with the reason right after it; a user's ``--wckey`` comes
# before and can imitate both: the last one before MinCPUsNode= is Slurm's.
_STATE = re.compile(r" JobState=(\S+) Reason=")
# Slurm prints the restart count in this run of its own fields, after the account, QOS
# and wckey (``--wckey``, as the user wrote it, where TrackWCKey=yes): a user's text
# can imitate the run, so the last one before MinCPUsNode= is Slurm's.
_RESTARTS = re.compile(r" Requeue=\d+ Restarts=(\d{1,9}) BatchFlag=\d+ ", re.ASCII)
# Slurm 22.05 prints this field right after the per-node lines, and no text a user
# writes between the job's name and it.
_AFTER_NODES = " MinCPUsNode="
_ADMIN_COMMENT = re.compile(r"\bAdminComment=(topoplace alloc=\S+)")


@dataclass(frozen=True)
class JobTruth:
    job_id: str
    user_name: str
    named: list[str]  # allocation ids in the job's admin comment
    gpus: dict[str, list[int]]  # node -> GPU indices Slurm gave the job there
    restarts: int = 0  # how often Slurm requeued the job before this run


class TruthError(ValueError):
    """Slurm's text could not be read."""


_MAX_JOB_ID = 2**32 - 1  # Slurm's job ids are 32-bit


def ascii_digits(text: str) -> bool:
    """Whether ``text`` is a whole number in ASCII digits: str.isdigit() also takes
    "\u0661\u0662" (read by int() as 12, another job's id) and "\u00b2" (which int()
    refuses)."""
    return text.isascii() and text.isdigit()


def _job_id(value: object) -> str:
    """A job id as Slurm gives it (a whole number, in JSON or text), as the service keeps it."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not ascii_digits(text) or int(text[:12]) > _MAX_JOB_ID:
        raise TruthError(f"not a Slurm job id: {str(value)[:40]!r}")
    return str(int(text))


def _user(value: object) -> str:
    user = str(value or "unknown")
    if len(user) > MAX_USER_NAME:
        raise TruthError(f"a user name of more than {MAX_USER_NAME} characters")
    # The user becomes the allocation's owner, which the owner field refuses control
    # characters in (placement/text.py): met there, deep in the write, it was a 500.
    bad = forbidden_character(user)
    if bad is not None:
        raise TruthError(f"a user name with a control character (U+{ord(bad):04X})")
    return user


def gpu_indices(gres: str) -> list[int]:
    """GPU indices in Slurm's per-node GRES text: ``gpu:g1:1(IDX:1),gpu:g2:1(IDX:2)``,
    ``gpu:4(IDX:0-1,4-5)``; other GRES (``(IDX:N/A)``) give none."""
    found: set[int] = set()
    for entry in re.split(r",(?=[a-z])", gres):
        if not entry.startswith("gpu"):
            continue
        for listed in _IDX.findall(entry):
            for part in filter(None, listed.split(",")):
                found.update(_index_range(part, listed))
    return sorted(found)


def _index_range(part: str, listed: str) -> range:
    """One ``N`` or ``N-M`` of an IDX list; checked before it is expanded, so that no
    text names more GPUs than a node can have (or a range that names none)."""
    first, dash, last = part.partition("-")
    if not first.isdigit() or (dash and not last.isdigit()):
        raise TruthError(f"cannot read GPU indices {listed[:80]!r}")
    if len(first) > 4 or len(last) > 4 or max(int(first), int(last or first)) >= MAX_GPUS:
        raise TruthError(
            f"GPU index out of range in {listed[:80]!r}: a node has at most {MAX_GPUS}"
        )
    if last and int(last) < int(first):
        raise TruthError(f"GPU index range {part!r} goes backwards")
    return range(int(first), int(last or first) + 1)


def from_show_job(text: str, job_name: str) -> tuple[JobTruth, str]:
    """A job as ``scontrol -d show job -o`` prints it: (what it holds, its state).

    Slurm prints what users write (the job's name, work directory, comment) as it is,
    among its own fields, so such text can imitate them. The name, known from the
    prolog's environment, is cut out by its length; the user, the state, the restart
    count and the per-node GPUs are read only from what follows it up to
    ``MinCPUsNode=``. There Slurm prints one thing a user writes, the wckey (with
    TrackWCKey=yes), before the state and the restart count: the last of each is
    Slurm's, and the per-node GPUs are read after the restart count. The admin
    comment comes after the work
    directory: every allocation it could name is a candidate, and ``record`` keeps
    only the job's user's own.
    """
    head = _HEAD.match(text)
    if head is None:
        raise TruthError("expected `scontrol -d show job -o ID`: a text starting JobId=N JobName=")
    named_from = head.end() + len(job_name)
    user = _USER.match(text, named_from)
    if not text.startswith(job_name, head.end()) or user is None:
        raise TruthError("the job's text does not carry the job_name given (SLURM_JOB_NAME)")
    end = text.find(_AFTER_NODES, named_from)
    if end < 0:
        raise TruthError("no MinCPUsNode= in the job's text")
    fields = text[named_from:end]
    state = next(reversed(list(_STATE.finditer(fields))), None)
    restarts = next(reversed(list(_RESTARTS.finditer(fields))), None)
    # The per-node lines come after the restart count, as does no text a user writes
    # (the wckey comes before it).
    gpus: dict[str, list[int]] = {}
    named_nodes = 0
    for nodes, gres in _NODE_GRES.findall(fields, restarts.end() if restarts else 0):
        indices = gpu_indices(gres)
        if indices:
            names = hostlist.expand(nodes)
            # Each node is on one line: more nodes in all than a list may name is no
            # job's (each line may name that many, and making them takes 50 ms).
            named_nodes += len(names)
            if named_nodes > hostlist.MAX_NAMES:
                raise TruthError(f"the per-node lines name more than {hostlist.MAX_NAMES} nodes")
            for node in names:
                gpus[node] = indices
    # `scontrol show job` gives each record a line: the admin comments read are this
    # record's, not the next one's (a het job's leader id, or an array's id, shows every
    # component or task). A work directory that imitates a next record cuts off only its
    # own job's admin comment.
    record_end = text.find("\nJobId=", end)
    comments = _ADMIN_COMMENT.findall(text, end, len(text) if record_end < 0 else record_end)
    named = list(dict.fromkeys(i for c in comments for i in allocation_ids(c)))
    truth = JobTruth(
        _job_id(head.group(1)),
        _user(user.group(1)),
        named,
        gpus,
        int(restarts.group(1)) if restarts else 0,
    )
    return truth, state.group(1) if state else ""


def users_own(state: ServiceState, truth: JobTruth) -> JobTruth:
    """``truth`` naming only the allocations made for its own user that no other job
    carries: names read where a user's text could imitate them never take or end
    another user's allocation (the user is Slurm's, read where no user writes)."""
    owner = f"{OWNER_PREFIX}{truth.user_name}"
    kept = [
        a.id
        for a in allocations.by_ids(state, truth.named)
        if a.owner == owner and a.job_id in (None, truth.job_id)
    ]
    return replace(truth, named=kept)


def from_squeue_job(job: dict[str, Any]) -> JobTruth:
    """A job of ``squeue --json`` (API v0.0.38: ``nodes``, ``gres_detail`` per node)."""
    details = job.get("gres_detail") or []
    if not isinstance(details, list):
        # One entry per node: anything else (a number failed the zip below with a
        # TypeError, which the reconcile's skip of one unreadable job does not catch).
        raise TruthError(f"gres_detail is no list: {str(details)[:80]!r}")
    # Only the nodes the entries pair with are made: a short list can name 65,536.
    nodes = hostlist.expand(str(job.get("nodes") or ""), limit=len(details))
    gpus: dict[str, list[int]] = {}
    for node, gres in zip(nodes, details, strict=False):
        indices = gpu_indices(str(gres))
        if indices:
            gpus[node] = indices
    return JobTruth(
        _job_id(job.get("job_id")),
        _user(job.get("user_name")),
        allocation_ids(str(job.get("admin_comment") or "")),
        gpus,
    )


def hear_of(state: ServiceState, nodes: Iterable[str]) -> None:
    """Read into memory those of ``nodes`` it lacks: another replica may have stored a
    node's first report a moment ago, its notification still on the way. Judged by
    memory alone, a job Slurm runs there was recorded nowhere, and that replica handed
    the job's GPUs to another."""
    unheard = sorted({n for n in nodes if n not in state.cluster})
    if unheard:
        state.sync_nodes(unheard)


def record(
    state: ServiceState, truth: JobTruth, started: bool = False, heard: bool = False
) -> Observation | None:
    """Make the job's allocation match what Slurm runs; None for a job without GPUs here.
    ``started``: read as the job started (the prolog's), so perhaps processed after the
    job ended: then nothing is written (action ``ended``, docs/slurm.md). A requeued
    job's later run (``Restarts=`` above 0) is not held to that: its previous run's end
    is remembered under the same job id, and this run started after it. A report of
    any run's start stamps the allocations it matches (``touch``): a reconcile's answer
    read before it, that saw the job held, leaves them. ``heard``: the caller has read
    the job's nodes memory lacked (``hear_of``) already."""
    if not heard:
        hear_of(state, truth.gpus)
    known = {n: g for n, g in truth.gpus.items() if n in state.cluster}
    if not known:
        return None
    # The epilog cannot say which run ended (at a requeue Slurm counts the restart
    # before it runs), so any end remembered may be the previous run's.
    observation = allocations.observe(
        state,
        truth.job_id,
        f"{OWNER_PREFIX}{truth.user_name}",
        known,
        truth.named,
        f"observed: Slurm runs job {truth.job_id} on these GPUs",
        started and truth.restarts == 0,
        touch=started,
        # A prolog's report says which run started: one of an earlier run than the job's
        # allocation was recorded for (a requeued run reported first) moves nothing back.
        run=truth.restarts if started else None,
    )
    if observation.action == "ended":
        log.info("job %s: a report of its start came after its end; nothing recorded", truth.job_id)
        return observation
    if observation.action in ("moved", "created") or observation.superseded:
        # Slurm ran the job elsewhere than the service held for it, or on GPUs the
        # service held for another: a mismatch, counted and logged.
        MISMATCHES.add(observation)
        log.warning(
            "job %s runs on %s: allocation %s %s; stale allocations released: %s",
            truth.job_id,
            known,
            observation.allocation_id,
            observation.action,
            ",".join(observation.superseded) or "none",
        )
    return observation


class _Mismatches:
    """How often Slurm's truth differed from the service's view, since start."""

    def __init__(self) -> None:
        self.moved = 0
        self.created = 0
        self.superseded = 0

    def add(self, observation: Observation) -> None:
        self.moved += observation.action == "moved"
        self.created += observation.action == "created"
        self.superseded += len(observation.superseded)

    def as_dict(self) -> dict[str, int]:
        return {"moved": self.moved, "created": self.created, "superseded": self.superseded}


MISMATCHES = _Mismatches()
