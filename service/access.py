"""Who may call what: the one table REST and gRPC both enforce.

Every REST route and every gRPC method has a rule naming the permission it
needs. A role is a set of permissions:

    permission   what it covers                                roles
    report       a node's snapshot, heartbeat and key,          agent (its scope only), admin
                 for the nodes in the token's scope
    read         every GET, the gRPC reads and Watch             viewer, scheduler, admin
    schedule     place, score, confirm, extend, release,        scheduler, admin
                 the Kubernetes extender and Slurm routes
    summary      a region's signed summary to a global          region (its own region only),
                 service (docs/federation.md)                  admin
    admin        tokens, node keys (replace, delete), cordon,   admin
                 delete, regions (register, update, retire)

An ``agent`` token carries a scope: node names and/or one region. A
``report`` call names its node (the ``{name}`` of the path, the ``node``
field of the gRPC request); it is allowed when the node is in the scope.
A ``region`` token carries one region, its scope: it may only push that
region's summary (``PUT /v1/regions/{region}/summary``), nothing else, so a
region's credentials on the global service cannot place, read or report a
node. Other roles have no scope.

A rule may name a boolean query parameter (``?replace=true``): it then
applies when the parameter is given and not false, before the rule of the
same route without it. Whether a node's *first* key is an agent's to
register depends on the node and the settings, not on the call, so it is
decided by service/admin_actions.py (trust on first use), not here.

A request no rule matches needs ``admin``: a route added without a rule is
closed, not open, and tests/service/test_access_matrix.py fails for it.
docs/security.md shows this table (``markdown_table``); a test keeps the two
in step.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl


class Role(enum.StrEnum):
    AGENT = "agent"
    REGION = "region"
    SCHEDULER = "scheduler"
    VIEWER = "viewer"
    ADMIN = "admin"


class Permission(enum.StrEnum):
    REPORT = "report"
    READ = "read"
    SCHEDULE = "schedule"
    SUMMARY = "summary"
    ADMIN = "admin"


GRANTS: dict[Role, frozenset[Permission]] = {
    Role.AGENT: frozenset({Permission.REPORT}),
    Role.REGION: frozenset({Permission.SUMMARY}),
    Role.VIEWER: frozenset({Permission.READ}),
    Role.SCHEDULER: frozenset({Permission.READ, Permission.SCHEDULE}),
    Role.ADMIN: frozenset(Permission),
}


def roles_with(permission: Permission) -> list[Role]:
    return [role for role in Role if permission in GRANTS[role]]


@dataclass(frozen=True)
class Rule:
    method: str
    path: str  # a route template: /v1/nodes/{name}/snapshot
    permission: Permission
    flag: str | None = None  # a boolean query parameter that selects this rule

    @property
    def pattern(self) -> re.Pattern[str]:
        return _compile(self.path)

    @property
    def call(self) -> str:
        """The call as the docs show it: ``PUT /v1/nodes/{name}/key?replace=true``."""
        query = f"?{self.flag}=true" if self.flag else ""
        return f"{self.method} {self.path}{query}"


# The strings the service's boolean parameters read as false (pydantic's); any other value
# given selects the flagged rule, so a value the handler would refuse is judged strictly.
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def query_of(scope: Mapping[str, Any]) -> str:
    """The request's query as the access rule reads it: the ASGI scope's bytes. A handler
    whose rule a flag selects reads the flag from this too, not from a URL rebuilt from
    the request (Starlette's ``request.url``), which may cut the query short at a '#'
    (uvicorn's h11 protocol passes one on) or at a crafted ``Host``: a viewer let in for
    ``?propose=true`` then reserved."""
    query: bytes = scope.get("query_string", b"")
    return query.decode("latin-1")


def flagged(query_string: str, flag: str) -> bool:
    """Whether the boolean query parameter ``flag`` is given and not false."""
    values = [v for k, v in parse_qsl(query_string, keep_blank_values=True) if k == flag]
    return any(v.strip().lower() not in _FALSE for v in values)


# Path parameters that may hold "/", as their routes take them (a ``:path`` parameter):
# a job id (a Kubernetes gang's is "k8s-gang:NAMESPACE/NAME").
SPANNING = frozenset({"job_id"})


def _compile(template: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[^}]+\})", template)
    regex = "".join(_part(p) for p in parts)
    return re.compile(f"^{regex}$")


def _part(part: str) -> str:
    if not part.startswith("{"):
        return re.escape(part)
    name = part[1:-1]
    return f"(?P<{name}>{'.+' if name in SPANNING else '[^/]+'})"


R, S, V, A = Permission.REPORT, Permission.SCHEDULE, Permission.READ, Permission.ADMIN
F = Permission.SUMMARY

REST_RULES: tuple[Rule, ...] = (
    # nodes: what an agent reports, what everyone reads, what only an admin changes
    Rule("PUT", "/v1/nodes/{name}/snapshot", R),
    Rule("POST", "/v1/nodes/{name}/heartbeat", R),
    Rule("PUT", "/v1/nodes/{name}/key", A, flag="replace"),  # replacing a node's key
    Rule("PUT", "/v1/nodes/{name}/key", R),
    Rule("GET", "/v1/nodes/{name}/key", V),
    Rule("DELETE", "/v1/nodes/{name}/key", A),
    Rule("GET", "/v1/nodes", V),
    Rule("GET", "/v1/nodes/{name}", V),
    Rule("GET", "/v1/nodes/{name}/topology", V),
    Rule("GET", "/v1/nodes/{name}/topology.svg", V),
    Rule("GET", "/v1/nodes/{name}/snapshots", V),
    Rule("GET", "/v1/nodes/{name}/nvlink", V),
    Rule("POST", "/v1/nodes/{name}/cordon", A),
    Rule("POST", "/v1/nodes/{name}/uncordon", A),
    Rule("DELETE", "/v1/nodes/{name}", A),
    Rule("GET", "/v1/cluster", V),
    # allocations
    Rule("POST", "/v1/place", S),
    Rule("POST", "/v1/score", S),
    Rule("GET", "/v1/allocations", V),
    Rule("GET", "/v1/allocations/{allocation_id}", V),
    Rule("POST", "/v1/allocations/{allocation_id}/confirm", S),
    Rule("POST", "/v1/allocations/{allocation_id}/extend", S),
    Rule("POST", "/v1/allocations/{allocation_id}/release", S),
    Rule("POST", "/v1/jobs/{job_id}/release", S),
    # the schedulers' own routes
    # cli_filter.lua's proposal (nothing is reserved): its token is readable by users.
    Rule("POST", "/v1/slurm/job-submit", V, flag="propose"),
    Rule("POST", "/v1/slurm/job-submit", S),
    Rule("POST", "/v1/slurm/reconcile", S),
    Rule("POST", "/v1/slurm/job-started", S),
    Rule("POST", "/k8s/v1/filter", S),
    Rule("POST", "/k8s/v1/prioritize", S),
    Rule("POST", "/k8s/v1/bind", S),
    Rule("POST", "/k8s/v1/preempt", S),
    # The device plugin, with its node's agent token; a difference log for people.
    Rule("GET", "/v1/nodes/{name}/k8s/reservations", R),
    Rule("POST", "/v1/nodes/{name}/k8s/devices", R),
    Rule("GET", "/v1/k8s/mismatches", V),
    # tokens
    Rule("POST", "/v1/tokens", A),
    Rule("GET", "/v1/tokens", A),
    Rule("DELETE", "/v1/tokens/{token_id}", A),
    # federation: regions register with a global service and push their summaries
    Rule("POST", "/v1/regions", A),
    Rule("GET", "/v1/regions", V),
    Rule("GET", "/v1/regions/{region}", V),
    Rule("PATCH", "/v1/regions/{region}", A),
    Rule("POST", "/v1/regions/{region}/retire", A),
    Rule("PUT", "/v1/regions/{region}/summary", F),
    Rule("POST", "/v1/federation/place", S),
    Rule("POST", "/v1/federation/score", S),
    # the audit log: it names every token and what each did, so an admin's, like the tokens
    Rule("GET", "/v1/audit", A),
)

# Open to every caller, with or without a token: probes cannot present one, and
# the API's own description (both of its pages) and the front page pointing at
# it are not secrets.
OPEN_PATHS = frozenset(
    {
        "/",
        "/healthz",
        "/readyz",
        "/metrics",
        "/docs",
        "/docs/oauth2-redirect",
        "/redoc",
        "/openapi.json",
        "/console",
    }
)
# The pages' scripts and styles, shipped in the package: they hold no data (the
# console reads the API with the caller's own token).
OPEN_PREFIXES = ("/assets/",)

GRPC_SERVICE = "/topoplace.v1.Topoplace/"
GRPC_RULES: dict[str, Permission] = {
    "ReportSnapshot": R,
    "Heartbeat": R,
    "ListNodes": V,
    "GetNode": V,
    "Place": S,
    "Score": S,
    "GetAllocation": V,
    "ListAllocations": V,
    "ConfirmAllocation": S,
    "ExtendAllocation": S,
    "ReleaseAllocation": S,
    "ReleaseJob": S,
    "Watch": V,
}
GRPC_OPEN_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)

_BY_METHOD: dict[str, list[tuple[re.Pattern[str], Rule]]] = {}
for _rule in REST_RULES:
    _BY_METHOD.setdefault(_rule.method, []).append((_rule.pattern, _rule))
_ALL = [pair for pairs in _BY_METHOD.values() for pair in pairs]


@dataclass(frozen=True)
class Match:
    permission: Permission
    node: str | None  # the node a report names
    rule: Rule | None  # None: no rule matched (admin needed)
    region: str | None = None  # the region a path names (``{region}``)


def rest_rule(method: str, path: str, query_string: str = "") -> Match:
    """The permission ``method path?query_string`` needs, and the node it names (``{name}``)."""
    lookup = "GET" if method == "HEAD" else method
    for pattern, rule in _BY_METHOD.get(lookup, ()):
        if rule.flag is not None and not flagged(query_string, rule.flag):
            continue
        found = pattern.match(path)
        if found is not None:
            params = found.groupdict()
            return Match(rule.permission, params.get("name"), rule, params.get("region"))
    return Match(Permission.ADMIN, None, None)


def methods_of(path: str) -> set[str]:
    """The methods the table has a rule for at ``path`` (every route has one: a request no
    rule matches whose path is here was sent with another method)."""
    return {rule.method for pattern, rule in _ALL if pattern.match(path)}


def grpc_rule(full_method: str) -> Permission:
    """The permission a gRPC method (``/package.Service/Method``) needs; admin when unknown."""
    if full_method.startswith(GRPC_SERVICE):
        return GRPC_RULES.get(full_method[len(GRPC_SERVICE) :], Permission.ADMIN)
    return Permission.ADMIN


def markdown_table() -> str:
    """The REST and gRPC rules as the Markdown table docs/security.md shows."""
    names = ", ".join
    lines = ["| call | permission | roles |", "| --- | --- | --- |"]
    for rule in REST_RULES:
        roles = names(r.value for r in roles_with(rule.permission))
        lines.append(f"| `{rule.call}` | {rule.permission} | {roles} |")
    for method, permission in GRPC_RULES.items():
        roles = names(r.value for r in roles_with(permission))
        lines.append(f"| gRPC `{method}` | {permission} | {roles} |")
    return "\n".join(lines)
