"""Slurm job submissions in, job_desc changes out, through the same core calls as /place.

``decide`` reads what job_submit.lua sent, turns it into a placement request
(GPU count and model from the TRES fields, candidates from the partition,
--nodelist, --exclude and --constraint, locality and policy from the comment
or the settings), reserves through ``service.allocations`` and says
which job_desc fields to write. Slurm applies one ``tres_per_node`` to every
node of a job, so a multi-node job is placed only when every node gets the
same GPU indices; otherwise it is left to Slurm.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from placement.request import MAX_TASK_GPUS
from service.allocations import api as allocations
from service.allocations.results import Allocation
from service.allocations.schemas import PlaceRequest, ScoreRequest
from service.errors import ServiceError, Unresolvable, Unschedulable
from service.slurm import job_options
from service.slurm.fresh import FRESH
from service.slurm.host_list_cache import HostListCache
from service.slurm.schemas import JobDecision, JobSubmit
from service.slurm.settings import SlurmSettings
from service.state import ServiceState
from slurm_formats import conf, hostlist
from slurm_formats.admin_comment import format_comment
from slurm_formats.tres import GpuAsk, TresError, gpu_ask, per_gpu_tres

log = logging.getLogger("topoplace.slurm")
OWNER_PREFIX = "slurm:"
_COMPLEX_CONSTRAINT = set("|[]*()!")


# A cluster's submissions repeat a few shapes (partition, GPU count, user): the request
# each becomes is validated once and reused (requests are frozen), and a partition's
# host list is expanded once, within a budget of names (host_list_cache).
_expand = HostListCache().expand


def _place_request(fields: dict[str, Any]) -> PlaceRequest:
    """``PlaceRequest(**fields)``, validated once per distinct set of fields."""
    return _validated(tuple(fields.items()))


@functools.lru_cache(maxsize=512)
def _validated(fields: tuple[tuple[str, Any], ...]) -> PlaceRequest:
    return PlaceRequest(**dict(fields))


class _LeaveAlone(Exception):
    """The job goes to Slurm unchanged; the message says why (logged by the script)."""


def _unchanged(message: str) -> JobDecision:
    return JobDecision(action="unchanged", message=f"topoplace: {message}")


# The decision is a flow of the /place flow's steps: each reservation it needs
# is the allocations API's own flow, taken with ``yield from`` (a refusal is
# raised where it waited), and ``decide`` drives the whole of it once on the
# event loop, as /place is driven: slurmctld waits on this answer with its
# locks held, and a worker thread per call cost more than the decision.
DecideFlow = allocations.Flow[JobDecision]


async def decide(
    state: ServiceState, settings: SlurmSettings, job: JobSubmit, key: str | None = None
) -> JobDecision:
    """What job_submit.lua (or cli_filter.lua, with ``reserve`` false) does with the job.
    Runs on the event loop; each reservation's commit is awaited. ``key``: the
    submission's Idempotency-Key, under which its reservations are made (``_keyed``)."""
    flow = _decide_flow(state, settings, job, key)
    return await allocations.run_async(state, flow, at_once=True)


def _keyed(key: str | None, part: str | None = None) -> str | None:
    """The key of one reservation of a submission keyed ``key``: the key itself for a
    one-node job, ``key/gang`` and ``key/node/NAME`` for a multi-node job's gang and
    nodes. The script sends a submission again only when its connection closed with no
    answer, which is also a service that committed the reservation and stopped before
    answering: the resend's reservations are the first's, replayed, not a second set
    beside them."""
    if key is None or part is None:
        return key
    keyed = f"{key}/{part}"
    # Past the key's 256 characters, its digest: as unique, and as the same on a resend.
    return keyed if len(keyed) <= 256 else hashlib.sha256(keyed.encode()).hexdigest()


def _reserve(
    state: ServiceState, request: PlaceRequest, key: str | None
) -> allocations.Flow[Allocation]:
    """One reservation, active at once: Slurm owns the job from the answer on. Its key is
    new but for a resend, so an earlier use is found at the commit (``replay_first``),
    not by a read before every reservation."""
    placed = yield from allocations.placing(state, request, key, active=True, replay_first=False)
    FRESH.note()  # the reconcile loop checks soon that a job took it
    if not placed.created and not placed.allocation.live:
        raise _LeaveAlone(_RESENT_GONE)
    return placed.allocation


# A submission sent again whose first reservations are no longer live (undone part way,
# or released since): pinned to them it would run on GPUs nobody holds for it, and new
# ones beside what the first left would be a second set.
_RESENT_GONE = "sent again, and what its first sending reserved is no longer held; left to Slurm"


def _decide_flow(
    state: ServiceState, settings: SlurmSettings, job: JobSubmit, key: str | None
) -> DecideFlow:
    try:
        options = job_options.parse(job.comment, settings)
        ask, per_job = _gpu_request(job)
    except (job_options.JobOptionError, TresError) as exc:
        return JobDecision(action="refuse", message=str(exc))
    except _LeaveAlone as exc:
        return _unchanged(str(exc))
    if options.off:
        if settings.allow_opt_out:
            return _unchanged("the job's comment says topoplace:off")
        return JobDecision(
            action="refuse",
            message="topoplace: this cluster does not allow topoplace:off; remove it",
        )
    if (deferred := _deferred(job)) is not None:
        return _unchanged(deferred)
    if job.exclusive:
        # Slurm gives such a job every GPU of a node no other job uses, whatever it asks
        # for: there is nothing to choose, and a job pinned beside another one waited for
        # that job's end while other nodes sat idle. The prolog records its GPUs.
        return _unchanged(
            "--exclusive (or an OverSubscribe=EXCLUSIVE partition) takes every GPU of an"
            " idle node; left to Slurm"
        )
    if job.reservation is not None:
        # Slurm starts it only on its reservation's nodes, which topoplace does not know:
        # pinned elsewhere, the submission was refused. The nodes in a reservation are
        # left out for every other job (node_states.py: RESERVED).
        return _unchanged(
            f"--reservation={job.reservation[:100]}: only its nodes may run the job; left to Slurm"
        )
    if job.reserve and not job.batch and ask.per_gpu_indices is None:
        # cli_filter.lua names the GPUs of every srun/salloc it saw. Without it, the
        # job's steps keep a plain count (--gres=gpu:N), which Slurm 22.05 refuses
        # inside a job pinned to per-GPU types: Slurm chooses, the prolog reports.
        return _unchanged(
            "srun/salloc without cli_filter.lua: its steps could not use pinned GPUs; left to Slurm"
        )
    down = state.slurm_nodes.unavailable()  # sinfo's latest read (node_states.py)
    try:
        node_count, candidates, excluded = _nodes(state, job, down)
        if per_job and node_count > 1:
            raise _LeaveAlone("--gpus over several nodes is left to Slurm; use --gpus-per-node")
        if ask.count > MAX_TASK_GPUS:
            # A request holds at most this many (a node has at most MAX_GPUS): past it,
            # the request below failed its validation, a 500 the script took for an error.
            raise Unresolvable(
                f"the cluster can never hold this request: no node has {ask.count} GPUs;"
                f" a node has at most {MAX_TASK_GPUS}"
            )
        base: dict[str, Any] = {
            "gpus": ask.count,
            "locality": options.locality,
            "policy": options.policy,
            "objective": options.objective,
            "numa": options.numa,
            "gpu_models": ask.model_types,
            "nodes": candidates,
            "exclude_nodes": excluded,
        }
        if not job.reserve:
            return _proposal(state, base, node_count)
        owner = f"{OWNER_PREFIX}{job.user_name or 'unknown'}"
        if node_count == 1:
            request = _place_request({**base, "owner": owner})
            placed = [(yield from _reserve(state, request, key))]
        else:
            placed = yield from _place_nodes(state, base, node_count, owner, key)
    except _LeaveAlone as exc:
        return _unchanged(str(exc))
    except ValidationError as exc:
        # A job no request can say (a GPU type longer than a model name, more nodes than
        # a gang has tasks), met before anything is reserved: it was a 500, which the
        # script logs as the service failing.
        first = exc.errors()[0]
        why = f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
        return _unchanged(f"the job cannot be asked of topoplace ({why}); left to Slurm")
    except Unschedulable as exc:
        return _unchanged(f"nothing fits now, Slurm queues the job as asked ({exc.message})")
    except Unresolvable as exc:
        if down and not down.keys().isdisjoint(excluded):
            # Judged without the nodes Slurm has down or drained: they come back.
            return _unchanged(f"not on the nodes Slurm has up now; left to Slurm ({exc.message})")
        if per_job and job.min_nodes is None and options.locality != "nvlink":
            # --gpus=N without -N may span nodes under Slurm; only one node is out of reach.
            return _unchanged(f"no single node can hold it; left to Slurm ({exc.message})")
        return JobDecision(action="refuse", message=f"topoplace: {exc.message}")
    return _modify(state, job, placed, per_job)


def _deferred(job: JobSubmit) -> str | None:
    """Why the job cannot start now whatever GPUs are free, or None.

    A job waiting for other jobs (--dependency), for a time (--begin later than now) or
    for someone to release it (--hold) may wait for hours: GPUs reserved for it would be
    kept from every other job all that time. Slurm starts it when it may, on GPUs it
    chooses, and the prolog records them (docs/slurm.md, "Truth wins")."""
    if job.dependency is not None:
        return (
            f"the job waits for --dependency={job.dependency[:100]}; left to Slurm, nothing"
            " reserved"
        )
    if job.held:
        return "the job is held (--hold); left to Slurm, nothing reserved"
    if job.begin_in_s is not None and job.begin_in_s > 0:
        return (
            f"the job may start only in {job.begin_in_s:.0f} s (--begin); left to Slurm,"
            " nothing reserved"
        )
    return None


def _gpu_request(job: JobSubmit) -> tuple[GpuAsk, bool]:
    """(GPUs per node, whether they came from tres_per_job)."""
    if job.array_inx is not None:
        # One pinned set of GPUs would run the array's tasks one after another.
        raise _LeaveAlone("job arrays are left to Slurm")
    for field in ("tres_per_task", "tres_per_socket"):
        if gpu_ask(getattr(job, field)) is not None:
            raise _LeaveAlone(f"GPUs per task or socket ({field}) are left to Slurm")
    per_node, per_job = gpu_ask(job.tres_per_node), gpu_ask(job.tres_per_job)
    if per_node is not None and per_job is not None:
        raise _LeaveAlone("GPUs asked both per job and per node; left to Slurm")
    if per_node is not None:
        return per_node, False
    if per_job is not None:
        return per_job, True
    raise _LeaveAlone("the job asks for no GPU")


def _nodes(
    state: ServiceState, job: JobSubmit, down: Mapping[str, str]
) -> tuple[int, tuple[str, ...] | None, tuple[str, ...]]:
    """(node count, candidate nodes or None for all, excluded nodes). ``down``: the
    nodes Slurm starts no job on now, with why; they are excluded."""
    try:
        required = _expand(job.req_nodes)
        partition = _expand(job.partition_nodes)
        excluded = _expand(job.exc_nodes)
    except hostlist.HostlistError as exc:
        raise _LeaveAlone(str(exc)) from None
    node_count = max(job.min_nodes or 1, len(required))
    if job.max_nodes is not None and job.max_nodes < node_count:
        raise _LeaveAlone("the job's node count range is inconsistent; left to Slurm")
    with state.lock:  # the engine's contract: its state is read under the lock
        known = len(state.cluster)
        pool = [n for n in (required or partition or state.cluster.names()) if n in state.cluster]
        if partition and required:
            allowed = set(partition)
            pool = [n for n in pool if n in allowed]
        if job.features:
            pool = _with_features(state, pool, job.features)
    if not pool:
        raise _LeaveAlone("no node the job may use is known to topoplace; left to Slurm")
    if required and len(pool) < len(required):
        raise _LeaveAlone("some nodes in --nodelist are unknown to topoplace; left to Slurm")
    everything = not required and not job.features and len(pool) == known
    if down:
        # A job pinned there would wait (ReqNodeNotAvail) holding its reservation.
        unavailable = [n for n in pool if n in down and n not in excluded]
        if named := [n for n in required if n in down]:
            raise _LeaveAlone(
                f"--nodelist names {_why_down(named, down)}; left to Slurm, which waits for it"
            )
        if unavailable and len(unavailable) == len(pool):
            raise _LeaveAlone(
                f"every node the job may use is {_why_down(pool, down)}; left to Slurm"
            )
        excluded = (*excluded, *unavailable)
    return node_count, None if everything else tuple(pool), excluded


def _why_down(nodes: list[str], down: Mapping[str, str]) -> str:
    shown = ", ".join(f"{n} ({down[n]})" for n in nodes[:3] if n in down)
    more = f" and {len(nodes) - 3} more" if len(nodes) > 3 else ""
    return f"out of service in Slurm: {shown}{more}"


def _with_features(state: ServiceState, pool: list[str], expression: str) -> list[str]:
    """The nodes of ``pool`` that have every feature; called with the state lock held."""
    if _COMPLEX_CONSTRAINT & set(expression):
        raise _LeaveAlone(f"constraint {expression!r} is more than a list of features")
    wanted = {f.strip() for f in expression.replace("&", ",").split(",") if f.strip()}
    return [n for n in pool if wanted <= set(conf.features(state.cluster.node(n).snapshot))]


def _release(state: ServiceState, placed: list[Allocation]) -> allocations.Step:
    """The step that undoes these reservations: a database write, so the driver runs
    it off the loop (service/event_loop.py)."""

    def undo() -> None:
        for allocation in placed:
            allocations.release(state, allocation.id)

    return undo


def _node_sets(allocation: Allocation) -> dict[str, tuple[int, ...]]:
    return allocation.gpus_by_node()


def _place_nodes(
    state: ServiceState, base: dict[str, Any], node_count: int, owner: str, key: str | None
) -> allocations.Flow[list[Allocation]]:
    """A multi-node job: every node the same GPU indices, all or nothing.

    First as one gang (which keeps it inside one NVLink domain or network
    block when it can); when the gang shares a node between tasks or gives
    nodes different GPUs, the nodes that would give the same GPUs are taken
    one by one, each as its own allocation, undone if any fails.
    """
    gang_request = PlaceRequest(**{**base, "tasks": node_count}, owner=owner)
    try:
        gang = yield from _reserve(state, gang_request, _keyed(key, "gang"))
    except _LeaveAlone:
        # Sent again, its gang given back: the first sending went on node by node, and its
        # answer was the nodes it kept (none kept: left to Slurm, as the first was).
        assert key is not None  # only a replay of a keyed gang is refused so
        kept = yield functools.partial(allocations.live_keyed_under, state, f"{key}/node/")
        if not kept:
            raise
        return list(kept)
    sets = _node_sets(gang)
    if len(sets) == node_count and len(set(sets.values())) == 1:
        return [gang]
    yield _release(state, [gang])
    gpus, group = _same_gpu_group(state, base, node_count)
    placed: list[Allocation] = []
    try:
        for node in group:
            request = PlaceRequest(**{**base, "nodes": (node,)}, owner=owner)
            placed.append((yield from _reserve(state, request, _keyed(key, f"node/{node}"))))
            if _node_sets(placed[-1]).get(node) != gpus:
                raise _LeaveAlone(f"{node} changed while the job was placed; left to Slurm")
    except (ServiceError, _LeaveAlone):
        if placed:
            yield _release(state, placed)
        raise
    return placed


def _same_gpu_group(
    state: ServiceState, base: dict[str, Any], node_count: int
) -> tuple[tuple[int, ...], list[str]]:
    """The GPU indices and the best-ranked nodes that would all give them."""
    verdicts = allocations.score(state, ScoreRequest(**base))
    groups: dict[tuple[int, ...], list[tuple[int, str]]] = defaultdict(list)
    for v in verdicts:
        if v.fits and v.task is not None and v.rank is not None:
            groups[v.task.gpu_indices].append((v.rank, v.node))
    usable = [
        (gpus, sorted(members)[:node_count])
        for gpus, members in groups.items()
        if len(members) >= node_count
    ]
    if not usable:
        raise _LeaveAlone(
            f"no {node_count} nodes can give the same GPUs now (one tres_per_node applies to"
            " every node); left to Slurm"
        )
    gpus, best = min(usable, key=lambda item: (item[1][-1][0], item[1][0][0]))
    return tuple(sorted(gpus)), [node for _, node in best]


def _proposal(state: ServiceState, base: dict[str, Any], node_count: int) -> JobDecision:
    """What would be chosen for a single-node job, reserving nothing (cli_filter.lua)."""
    if node_count != 1:
        raise _LeaveAlone("multi-node jobs are placed by job_submit only")
    fitting = [
        (v.rank, v.node, v.task)
        for v in allocations.score(state, ScoreRequest(**base))
        if v.fits and v.task is not None and v.rank is not None
    ]
    if not fitting:
        raise _LeaveAlone("nothing fits now")
    _, node, task = min(fitting, key=lambda v: v[0])
    gpus = sorted(task.gpu_indices)
    return JobDecision(
        action="modify",
        message=f"topoplace: {node} GPUs {gpus} proposed",
        set={"req_nodes": node, "tres_per_node": per_gpu_tres(gpus)},
        nodes=[node],
        gpu_indices=gpus,
        gres=per_gpu_tres(gpus).replace("gres:", ""),
    )


def _modify(
    state: ServiceState, job: JobSubmit, placed: list[Allocation], per_job: bool
) -> JobDecision:
    nodes = [node for allocation in placed for node in _node_sets(allocation)]
    gpus = next(iter(_node_sets(placed[0]).values()))
    ids = [a.id for a in placed]
    ring = min(a.ring_gbps for a in placed)
    bandwidth = min(t.score.bandwidth for a in placed for t in a.tasks)
    fields = {
        "req_nodes": ",".join(nodes),
        "tres_per_node": per_gpu_tres(gpus),
        "admin_comment": format_comment(ids, ring, bandwidth, list(gpus)),
    }
    if per_job:
        # Slurm refuses a typed tres_per_node next to an untyped per-job ask.
        fields["tres_per_job"] = ""
    environment = (
        {
            "TOPOPLACE_ALLOCATION_ID": ",".join(ids),
            "TOPOPLACE_GPUS": ",".join(str(g) for g in gpus),
            "TOPOPLACE_RING_GBPS": f"{ring:g}",
        }
        if job.batch
        else {}
    )
    message = (
        f"topoplace: {','.join(nodes)} GPUs {','.join(str(g) for g in gpus)}"
        f" (ring {ring:g} GB/s, allocation {','.join(ids)})"
    )
    log.info("%s for %s", message, job.name or "a job")
    return JobDecision(
        action="modify",
        message=message,
        set=fields,
        environment=environment,
        allocation_ids=ids,
        nodes=nodes,
        gpu_indices=list(gpus),
        gres=per_gpu_tres(gpus).replace("gres:", ""),
    )
