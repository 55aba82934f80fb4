"""The federation's wire shapes: a region's registration, its signed summary, and the
global /v1/federation/place and /score requests and answers."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from agent.signing import decode_public_key
from placement.text import Text
from service.allocations.schemas import PlaceRequest
from service.federation import bearer, region_url

REGION_NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
RegionName = Annotated[str, Field(min_length=1, max_length=63, pattern=REGION_NAME_PATTERN)]
Money = Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]
LabelText = Annotated[Text, Field(min_length=1, max_length=63)]
Count = Annotated[int, Field(ge=0, le=10_000_000)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GpuPrice(_Strict):
    gpu_model: Text = Field(
        min_length=1, max_length=128, description="matched as a whole token of the GPU name: H100"
    )
    on_demand: Money = Field(description="price per GPU-hour, on demand")
    spot: Money | None = Field(default=None, description="price per GPU-hour on spot, if offered")


class EgressPrices(_Strict):
    region_gb: Money = Field(description="per GB to another region of the same cloud")
    internet_gb: Money = Field(description="per GB to another cloud or the internet")


def _forwardable(value: str) -> str:
    """A region's URL as it is stored: one that takes forwards (region_url.py), no
    trailing slash. Registration and an update check it alike."""
    found = region_url.problem(value)
    if found is not None:
        raise ValueError(found)
    return value.rstrip("/")


RegionUrl = Annotated[Text, Field(min_length=1, max_length=2048)]


def _bearer(value: str) -> str:
    found = bearer.problem(value)
    if found is not None:
        raise ValueError(found)
    return value


ForwardToken = Annotated[
    str,
    AfterValidator(_bearer),
    Field(min_length=1, max_length=512, json_schema_extra={"pattern": bearer.PATTERN}),
]
URL_SAYS = "the region's own topoplace"
FORWARD_TOKEN_SAYS = (
    "a scheduler token of the region's service, sent when forwarding a placement there"
    " (stored; never shown)"
)


class RegionRequest(_Strict):
    name: RegionName
    cloud: Annotated[str, Field(min_length=1, max_length=63, pattern=REGION_NAME_PATTERN)]
    location: Text = Field(default="", max_length=128, description="e.g. us-east-1, a site")
    url: RegionUrl = Field(description=URL_SAYS)
    public_key: Text = Field(
        min_length=1,
        max_length=128,
        description="base64 Ed25519 public key the region signs its summaries with",
    )
    forward_token: ForwardToken | None = Field(default=None, description=FORWARD_TOKEN_SAYS)
    prices: list[GpuPrice] = Field(min_length=1, max_length=64)
    egress: EgressPrices
    labels: dict[LabelText, LabelText] = Field(default_factory=dict, max_length=64)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return _forwardable(value)

    @field_validator("public_key")
    @classmethod
    def _ed25519(cls, value: str) -> str:
        try:
            decode_public_key(value)
        except ValueError as exc:
            raise ValueError(f"not an Ed25519 public key: {exc}") from None
        return value.strip()

    @field_validator("prices")
    @classmethod
    def _one_price_a_model(cls, value: list[GpuPrice]) -> list[GpuPrice]:
        models = [p.gpu_model.upper() for p in value]
        if len(set(models)) != len(models):
            raise ValueError("each GPU model is priced once")
        return value


class RegionUpdate(_Strict):
    """What an admin may set again on a registered region: where its forwards go and
    what they carry. A field left out stays as it is; ``forward_token: null`` stops
    sending one."""

    # The document says what is accepted: at least one field, and a URL never null
    # (schema-driven clients and fuzzers would otherwise send ``{}`` or ``url: null``).
    model_config = ConfigDict(json_schema_extra={"minProperties": 1})

    url: RegionUrl | SkipJsonSchema[None] = Field(default=None, description=URL_SAYS)
    forward_token: ForwardToken | None = Field(default=None, description=FORWARD_TOKEN_SAYS)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str:
        if value is None:  # only a URL may be stored: a region without one takes nothing
            raise ValueError("the region's URL cannot be removed; give a new one")
        return _forwardable(value)

    @model_validator(mode="after")
    def _something(self) -> RegionUpdate:
        if not self.model_fields_set:
            raise ValueError("give url, forward_token or both")
        return self

    def changes(self) -> dict[str, str | None]:
        """The columns to set: the fields given, a null forward_token included."""
        return {name: getattr(self, name) for name in sorted(self.model_fields_set)}


class SummaryCut(_Strict):
    """What a region left out of its summary to fit the limits."""

    designs: Count = Field(default=0, description="designs left out (the fewest free GPUs)")
    free_gpus: Count = Field(default=0, description="the free GPUs of those designs")
    cliques: Count = Field(default=0, description="cliques left out (the fewest free nodes)")
    names: Count = Field(default=0, description="names shortened (their start and a hash)")


class SummaryView(BaseModel):
    """What a region's latest summary says, as the global service shows it."""

    seq: int
    received_at: datetime
    stale: bool
    free_gpus: int
    stale_nodes: int
    live_allocations: int
    cut: SummaryCut | None = Field(
        default=None, description="what the region left out of it to fit the limits"
    )


class RegionView(BaseModel):
    name: str
    cloud: str
    location: str
    url: str
    public_key: str
    prices: list[GpuPrice]
    egress: EgressPrices
    labels: dict[str, str]
    token_id: str
    registered_at: datetime
    retired_at: datetime | None
    summary: SummaryView | None


class RegionCreated(RegionView):
    token: str = Field(
        description="the region token (role region, scope this region): shown this once"
    )


class RegionList(BaseModel):
    regions: list[RegionView]


# -- the summary a region pushes ----------------------------------------------


# What one summary may hold (a region cuts its summary to fit: summary_limits.py).
MAX_DESIGN_NAME = 256
MAX_GPU_MODEL_NAME = 128
MAX_CLIQUE_DOMAIN = 160
MAX_SUMMARY_DESIGNS = 1000
MAX_SUMMARY_CLIQUES = 10_000
# The GPU models one summary may name: each is matched against each model a job asks
# for (up to 64) on every federated request, on the event loop.
MAX_SUMMARY_MODELS = 64
# An island size as the summary writes it (summary.py): str(size), 0 to 64.
_ISLAND_SIZE = re.compile(r"0|[1-9][0-9]?")


class DesignSummary(_Strict):
    design: Text = Field(min_length=1, max_length=MAX_DESIGN_NAME)
    gpu_model: Text = Field(min_length=1, max_length=MAX_GPU_MODEL_NAME)
    gpus_per_node: Annotated[int, Field(ge=1, le=64)]
    nodes: Count
    free_gpus: Count
    island_gbps: float = Field(ge=0, le=1e6, allow_inf_nan=False)
    by_island: dict[str, Count] = Field(
        default_factory=dict,
        max_length=65,
        description="largest free NVLink island size -> usable nodes with exactly that",
    )

    @field_validator("by_island")
    @classmethod
    def _sizes(cls, value: dict[str, int]) -> dict[str, int]:
        for size in value:
            # ASCII decimal, no leading zero: str.isdigit() took "\u0663" and "\u00b2", and
            # "08" is read back (registry.py) as the same size as "8", one count lost.
            if _ISLAND_SIZE.fullmatch(size) is None or int(size) > 64:
                raise ValueError(f"island sizes are whole numbers of GPUs up to 64, not {size!r}")
        return value


class CliqueSummary(_Strict):
    domain: Text = Field(min_length=1, max_length=MAX_CLIQUE_DOMAIN)
    design: Text = Field(min_length=1, max_length=MAX_DESIGN_NAME)
    nodes: Count
    free_nodes: Count


class RegionSummary(_Strict):
    region: RegionName
    seq: Annotated[int, Field(ge=1, le=2**63 - 1)]
    sent_at: datetime
    designs: list[DesignSummary] = Field(
        default_factory=list,
        max_length=MAX_SUMMARY_DESIGNS,
        description=f"at most {MAX_SUMMARY_MODELS} GPU models among them",
    )
    cliques: list[CliqueSummary] = Field(default_factory=list, max_length=MAX_SUMMARY_CLIQUES)
    stale_nodes: Count = 0
    live_allocations: Count = 0
    network_gbps: float = Field(default=25.0, gt=0, le=1e6, allow_inf_nan=False)
    cut: SummaryCut | None = Field(
        default=None, description="what the region left out to fit the limits; absent: nothing"
    )

    @model_serializer(mode="wrap")
    def _without_no_cut(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Absent rather than null when nothing was cut: a summary is signed as dumped, and
        # one from a region that predates the field (which it cannot name) must read back
        # exactly as it was signed.
        dumped: dict[str, Any] = handler(self)
        if dumped.get("cut") is None:
            dumped.pop("cut", None)
        return dumped

    @field_validator("designs")
    @classmethod
    def _few_models(cls, value: list[DesignSummary]) -> list[DesignSummary]:
        models = {d.gpu_model for d in value}
        if len(models) > MAX_SUMMARY_MODELS:
            raise ValueError(
                f"the designs name {len(models)} GPU models; a summary names at most"
                f" {MAX_SUMMARY_MODELS}"
            )
        return value


class SummaryReport(_Strict):
    summary: RegionSummary
    signature: Text = Field(
        min_length=1,
        max_length=128,
        description="base64 Ed25519 signature over the summary (docs/federation.md)",
    )


class SummaryAccepted(BaseModel):
    region: str
    seq: int


# -- global place and score ---------------------------------------------------


class DataLocation(_Strict):
    region: RegionName = Field(description="the registered region that holds the data")
    size_gb: float = Field(ge=0, le=1e9, allow_inf_nan=False)


class BandwidthFloor(_Strict):
    island: Annotated[int, Field(ge=0, le=64)] = Field(
        default=0, description="each task in one free NVLink island of at least this many GPUs"
    )
    gbps: float = Field(
        default=0.0, ge=0, le=1e6, allow_inf_nan=False, description="predicted GB/s at least"
    )


class FederationOptions(_Strict):
    regions: list[RegionName] = Field(default_factory=list, max_length=1000)
    clouds: list[RegionName] = Field(default_factory=list, max_length=100)
    labels: dict[LabelText, LabelText] = Field(
        default_factory=dict, max_length=64, description="region labels the job needs"
    )
    data: DataLocation | None = None
    hours: float = Field(default=1.0, gt=0, le=1e5, allow_inf_nan=False, description="job length")
    cost_weight: float = Field(
        default=1.0,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="1: cheapest that meets the floor; 0: fastest; between: both",
    )
    budget_per_hour: Money | None = None
    floor: BandwidthFloor = Field(default_factory=BandwidthFloor)
    spot: bool = Field(default=False, description="spot prices may be used where offered")
    deadline_s: float = Field(
        default=10.0, gt=0, le=300, allow_inf_nan=False, description="for all forwards together"
    )


class FederatedPlaceRequest(PlaceRequest):
    """/v1/place's request plus where it may go and what it may cost."""

    federation: FederationOptions = Field(default_factory=FederationOptions)

    @model_validator(mode="after")
    def _whole_gpus(self) -> FederatedPlaceRequest:
        if self.mig_profile is not None or self.gpu_fraction is not None:
            raise ValueError("federated placement takes whole GPUs (no mig_profile, gpu_fraction)")
        return self


class CostView(BaseModel):
    price_per_gpu_hour: float
    spot: bool
    gpu_hours: float
    compute: float
    egress: float
    total: float
    per_hour: float


class CandidateView(BaseModel):
    region: str
    cloud: str
    fits: bool
    reason: str
    stale: bool
    design: str | None
    gpu_model: str | None
    predicted_gbps: float
    cost: CostView | None


class Attempt(BaseModel):
    region: str
    outcome: str = Field(description="placed, refused or unreachable")
    status: int | None
    detail: str


class FederatedScore(BaseModel):
    candidates: list[CandidateView]


class FederatedPlacement(BaseModel):
    region: str
    cloud: str
    node: str = Field(description="the first task's node")
    nodes: list[str] = Field(description="every task's node, in task order")
    gpus: list[str] = Field(description="the GPUs' UUIDs, in task order")
    allocation: dict[str, Any]
    replayed: bool
    design: str | None = Field(description="the node design the ranking chose")
    gpu_model: str = Field(description="the GPU model the forward asked the region for")
    predicted_gbps: float
    cost: CostView
    alternatives: list[CandidateView]
    attempts: list[Attempt]
    timings_ms: dict[str, float]
