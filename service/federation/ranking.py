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
- **Rank.** Among regions that fit, meet the bandwidth floor and the budget:
  ``cost_weight x cost/most_cost - (1 - cost_weight) x gbps/best_gbps``,
  lowest first; ties by cost, then name. A weight of 1 (the default) is the
  cheapest region that meets the floor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from placement.eligibility import model_matches_name


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

    def tasks_fitting(self, need: int) -> int:
        """Tasks of ``need`` GPUs the largest free islands hold, one island per task."""
        return sum(count * (size // need) for size, count in self.by_island.items() if size >= need)


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


def price_for(prices: Iterable[Price], gpu_model: str) -> Price | None:
    """The region's price whose model names this GPU (a whole token: "H100")."""
    for price in prices:
        if model_matches_name(price.gpu_model, gpu_model):
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
    for clique in summary.cliques:
        if clique.design == design.design and clique.free_nodes >= nodes_needed:
            return design.island_gbps
    return min(design.island_gbps, summary.network_gbps)


def _design_choice(
    job: Job, region: Region, summary: Summary, egress: float
) -> tuple[Candidate | None, str]:
    """The region's best design for the job, or the reason none fits."""
    need = max(job.gpus, job.floor_island)
    best: Candidate | None = None
    reasons: list[str] = []
    for design in summary.designs:
        if job.gpu_models and not any(
            model_matches_name(m, design.gpu_model) for m in job.gpu_models
        ):
            continue
        price = price_for(region.prices, design.gpu_model)
        if price is None:
            reasons.append(f"no price for {design.gpu_model}")
            continue
        if design.tasks_fitting(need) < job.tasks:
            reasons.append(f"{design.design}: not {job.tasks} free island(s) of {need}")
            continue
        gbps = _gang_gbps(job, summary, design)
        if gbps < job.floor_gbps:
            reasons.append(f"{design.design}: {gbps:g} GB/s is under the floor")
            continue
        spot = job.spot and price.spot is not None
        rate = price.spot if spot and price.spot is not None else price.on_demand
        gpu_hours = job.gpus * job.tasks * job.hours
        cost = Cost(rate, spot, gpu_hours, gpu_hours * rate, egress)
        if (
            job.budget_per_hour is not None
            and cost.per_hour(job.gpus * job.tasks) > job.budget_per_hour
        ):
            reasons.append(
                f"{design.design}: {cost.per_hour(job.gpus * job.tasks):g}/h is over budget"
            )
            continue
        found = Candidate(
            region.name,
            region.cloud,
            True,
            "fits",
            design=design.design,
            gpu_model=price.gpu_model,
            predicted_gbps=gbps,
            cost=cost,
        )
        if best is None or _better_design(found, best):
            best = found
    if best is None and not reasons:
        reasons.append("no node of the requested GPU models")
    return best, "; ".join(reasons)


def _better_design(a: Candidate, b: Candidate) -> bool:
    assert a.cost is not None and b.cost is not None
    return (a.cost.total, -a.predicted_gbps) < (b.cost.total, -b.predicted_gbps)


def candidate(job: Job, region: Region, regions: Mapping[str, Region]) -> Candidate:
    """What ``region`` offers ``job`` (fits or not, and why)."""
    refused = Candidate(region.name, region.cloud, False, "", stale=region.stale)
    if job.regions and region.name not in job.regions:
        return _with_reason(refused, "not among the allowed regions")
    if job.clouds and region.cloud not in job.clouds:
        return _with_reason(refused, f"cloud {region.cloud} is not allowed")
    if region.summary is None:
        return _with_reason(refused, "no summary pushed yet")
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
            )
        )
    keyed.sort(key=lambda c: (c.rank_key, c.cost.total if c.cost else 0.0, c.region))
    return keyed + sorted((c for c in found if not c.fits), key=lambda c: c.region)
