"""Which region a job should go to: pure functions over the regions' summaries.

No I/O and no clock: the caller says which summaries are stale. For each
region the best node design that fits is found, its bandwidth predicted and
its cost counted; the regions are then ranked. The numbers are predictions
from summaries, which may be seconds old: the region's own service decides
the node and GPUs, and a refusal there sends the job to the next region.

- **Fit.** A task needs ``gpus`` GPUs in one free NVLink island of at least
  ``max(gpus, floor_island)`` GPUs. A design's capacity is, per node, how
  many such tasks its largest free island holds; a gang of ``tasks`` fits
  when the region's nodes of one design hold them all (a gang never spans
  regions, nor designs).
- **Bandwidth.** Inside a task: the design's NVLink pair rate when the task
  sits in one island. Between the tasks of a gang: the same NVLink rate when
  one multi-node NVLink clique of that design has enough whole free nodes,
  else the region's network rate. The job's predicted rate is the lower.
- **Cost.** GPU-hours x the price per GPU-hour of that model (spot when the
  job allows it and the region offers it), plus the data's egress: its size
  in GB x the data region's price to another region of the same cloud, or
  to the internet for another cloud. Data in the region itself moves free.
- **Labels.** A job may require region labels (capabilities such as
  ``interconnect=infiniband``); a region without all of them does not fit.
- **Rank.** Among regions that fit, meet the bandwidth floor and the budget:
  ``cost_weight x cost/most_cost - (1 - cost_weight) x gbps/best_gbps``,
  lowest first; ties by cost, then name. A weight of 1 (the default) is the
  cheapest region that meets the floor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from placement.eligibility import model_matches_name

MAX_ISLAND = 64  # GPUs in a node, at most (the engine's bit masks)


@dataclass(frozen=True, slots=True)
class DesignFree:
    """One node design of a region, as its summary says: what is free, and how fast."""

    design: str
    gpu_model: str
    gpus_per_node: int
    nodes: int
    free_gpus: int
    island_gbps: float
    # largest free NVLink island (GPUs) -> how many usable nodes have exactly that
    by_island: Mapping[int, int] = field(default_factory=dict)
    # tasks_fitting for every size, counted once per summary rather than per request
    capacity: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        counts = [
            sum(count * (size // need) for size, count in self.by_island.items() if size >= need)
            for need in range(1, MAX_ISLAND + 1)
        ]
        object.__setattr__(self, "capacity", (0, *counts))

    def tasks_fitting(self, need: int) -> int:
        """Tasks of ``need`` GPUs the largest free islands hold, one island per task."""
        return self.capacity[need] if 0 < need <= MAX_ISLAND else 0


@dataclass(frozen=True, slots=True)
class CliqueFree:
    """A multi-node NVLink domain: its design and how many of its nodes are wholly free."""

    domain: str
    design: str
    nodes: int
    free_nodes: int


@dataclass(frozen=True, slots=True)
class Summary:
    region: str
    seq: int
    designs: tuple[DesignFree, ...]
    cliques: tuple[CliqueFree, ...] = ()
    stale_nodes: int = 0
    live_allocations: int = 0
    network_gbps: float = 25.0
    # design -> the most wholly free nodes one of its cliques has, found once per
    # summary: a summary may hold 10,000 cliques, too many to walk per design per request
    clique_free: Mapping[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        best: dict[str, int] = {}
        for clique in self.cliques:
            best[clique.design] = max(best.get(clique.design, 0), clique.free_nodes)
        object.__setattr__(self, "clique_free", best)


@dataclass(frozen=True, slots=True)
class Price:
    gpu_model: str
    on_demand: float
    spot: float | None = None


@dataclass(frozen=True, slots=True)
class Egress:
    region_gb: float  # to another region of the same cloud
    internet_gb: float  # to another cloud or the internet


@dataclass(frozen=True, slots=True)
class Region:
    name: str
    cloud: str
    prices: tuple[Price, ...]
    egress: Egress
    summary: Summary | None
    stale: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)  # its capabilities
    summary_problem: str | None = None  # why its stored summary is not read (summary None)
    # each design's price, in the summary's order, found once per summary
    priced: tuple[Price | None, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        designs = self.summary.designs if self.summary is not None else ()
        priced = tuple(price_for(self.prices, d.gpu_model) for d in designs)
        object.__setattr__(self, "priced", priced)


@dataclass(frozen=True, slots=True)
class Job:
    gpus: int = 1
    tasks: int = 1
    gpu_models: tuple[str, ...] = ()
    hours: float = 1.0
    spot: bool = False
    regions: frozenset[str] = frozenset()  # empty: any
    clouds: frozenset[str] = frozenset()  # empty: any
    data_region: str | None = None
    data_gb: float = 0.0
    cost_weight: float = 1.0
    budget_per_hour: float | None = None
    floor_island: int = 0
    floor_gbps: float = 0.0
    labels: Mapping[str, str] = field(default_factory=dict)  # the region must have these


@dataclass(frozen=True, slots=True)
class Cost:
    price_per_gpu_hour: float
    spot: bool
    gpu_hours: float
    compute: float
    egress: float

    @property
    def total(self) -> float:
        return self.compute + self.egress

    def per_hour(self, gpus: int) -> float:
        return self.price_per_gpu_hour * gpus


@dataclass(frozen=True, slots=True)
class Candidate:
    """One region's answer for a job: the design it would use, or why it cannot."""

    region: str
    cloud: str
    fits: bool
    reason: str
    stale: bool = False
    design: str | None = None
    gpu_model: str | None = None  # the price's model: what the forwarded request asks for
    predicted_gbps: float = 0.0
    cost: Cost | None = None
    rank_key: float = 0.0
    design_model: str | None = None  # the design's GPU model, as the region's nodes name it


# Routing asks the same few (model, GPU name) questions for every region on every
# request: a regular expression each, remembered.
_matches = lru_cache(maxsize=65_536)(model_matches_name)


def price_for(prices: Sequence[Price], gpu_model: str) -> Price | None:
    """The region's price whose model names this GPU (a whole token: "H100")."""
    for price in prices:
        if _matches(price.gpu_model, gpu_model):
            return price
    return None


def egress_cost(job: Job, region: Region, regions: Mapping[str, Region]) -> float:
    if job.data_region is None or job.data_gb <= 0 or job.data_region == region.name:
        return 0.0
    source = regions.get(job.data_region)
    if source is None:
        return 0.0  # refused before ranking (the service checks the data's region)
    rate = source.egress.region_gb if source.cloud == region.cloud else source.egress.internet_gb
    return job.data_gb * rate


def _gang_gbps(job: Job, summary: Summary, design: DesignFree) -> float:
    if job.tasks <= 1:
        return design.island_gbps
    whole = job.gpus >= design.gpus_per_node
    nodes_needed = job.tasks if whole else -(-job.tasks // max(1, design.gpus_per_node // job.gpus))
    if summary.clique_free.get(design.design, 0) >= nodes_needed:
        return design.island_gbps
    return min(design.island_gbps, summary.network_gbps)


def _design_choice(
    job: Job, region: Region, summary: Summary, egress: float
) -> tuple[Candidate | None, str]:
    """The region's best design for the job, or the reason none fits."""
    need = max(job.gpus, job.floor_island)
    gpus = job.gpus * job.tasks
    gpu_hours = gpus * job.hours
    best: Candidate | None = None
    refused: list[tuple[str, DesignFree, float]] = []  # (why, design, the number): told late
    # Whether the job takes each GPU model, asked once per model rather than per design.
    wanted: dict[str, bool] = {}
    for design, price in zip(summary.designs, region.priced, strict=True):
        if job.gpu_models:
            takes = wanted.get(design.gpu_model)
            if takes is None:
                takes = any(_matches(m, design.gpu_model) for m in job.gpu_models)
                wanted[design.gpu_model] = takes
            if not takes:
                continue
        if price is None:
            refused.append(("unpriced", design, 0.0))
            continue
        if design.tasks_fitting(need) < job.tasks:
            refused.append(("full", design, 0.0))
            continue
        gbps = _gang_gbps(job, summary, design)
        if gbps < job.floor_gbps:
            refused.append(("slow", design, gbps))
            continue
        spot = job.spot and price.spot is not None
        rate = price.spot if spot and price.spot is not None else price.on_demand
        if job.budget_per_hour is not None and rate * gpus > job.budget_per_hour:
            refused.append(("dear", design, rate * gpus))
            continue
        if best is not None and best.cost is not None:
            total = gpu_hours * rate + egress
            if (best.cost.total, -best.predicted_gbps) <= (total, -gbps):
                continue
        best = Candidate(
            region.name,
            region.cloud,
            True,
            "fits",
            design=design.design,
            gpu_model=price.gpu_model,
            predicted_gbps=gbps,
            cost=Cost(rate, spot, gpu_hours, gpu_hours * rate, egress),
            design_model=design.gpu_model,
        )
    if best is not None:
        return best, ""
    return None, _refusals(refused, job, need)


def _refusals(refused: list[tuple[str, DesignFree, float]], job: Job, need: int) -> str:
    if not refused:
        return "no node of the requested GPU models"
    said = []
    for why, design, number in refused:
        if why == "unpriced":
            said.append(f"no price for {design.gpu_model}")
        elif why == "full":
            said.append(f"{design.design}: not {job.tasks} free island(s) of {need}")
        elif why == "slow":
            said.append(f"{design.design}: {number:g} GB/s is under the floor")
        else:
            said.append(f"{design.design}: {number:g}/h is over budget")
    return "; ".join(said)


def candidate(job: Job, region: Region, regions: Mapping[str, Region]) -> Candidate:
    """What ``region`` offers ``job`` (fits or not, and why)."""
    refused = Candidate(region.name, region.cloud, False, "", stale=region.stale)
    if job.regions and region.name not in job.regions:
        return _with_reason(refused, "not among the allowed regions")
    if job.clouds and region.cloud not in job.clouds:
        return _with_reason(refused, f"cloud {region.cloud} is not allowed")
    missing = [k for k, v in job.labels.items() if region.labels.get(k) != v]
    if missing:
        return _with_reason(refused, f"lacks the label(s) {', '.join(sorted(missing))}")
    if region.summary is None:
        return _with_reason(refused, region.summary_problem or "no summary pushed yet")
    if region.stale:
        return _with_reason(refused, "stale: no summary within the staleness limit")
    best, reason = _design_choice(job, region, region.summary, egress_cost(job, region, regions))
    return best if best is not None else _with_reason(refused, reason)


def _with_reason(found: Candidate, reason: str) -> Candidate:
    return Candidate(found.region, found.cloud, False, reason, stale=found.stale)


def rank(job: Job, regions: Sequence[Region]) -> list[Candidate]:
    """Every region's candidate: those that fit first, best first; then the others by name."""
    by_name = {r.name: r for r in regions}
    found = [candidate(job, r, by_name) for r in regions]
    fitting = [c for c in found if c.fits]
    if not fitting:
        return sorted(found, key=lambda c: c.region)
    most_cost = max((c.cost.total for c in fitting if c.cost), default=0.0) or 1.0
    best_gbps = max(c.predicted_gbps for c in fitting) or 1.0
    w = job.cost_weight
    keyed = []
    for c in fitting:
        assert c.cost is not None
        key = w * c.cost.total / most_cost - (1.0 - w) * c.predicted_gbps / best_gbps
        keyed.append(
            Candidate(
                c.region,
                c.cloud,
                True,
                c.reason,
                c.stale,
                c.design,
                c.gpu_model,
                c.predicted_gbps,
                c.cost,
                key,
                c.design_model,
            )
        )
    keyed.sort(key=lambda c: (c.rank_key, c.cost.total if c.cost else 0.0, c.region))
    return keyed + sorted((c for c in found if not c.fits), key=lambda c: c.region)
