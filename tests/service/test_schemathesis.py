"""schemathesis against the committed OpenAPI document, on a real server and database.

Every operation, positive and negative cases, every check schemathesis has
(the status code and body declared for each answer, the content type, that
invalid data is refused, that the token is required, ...), with a bounded
number of examples per operation: the service must never answer 5xx and
never answer what the document does not declare. A few nodes are seeded so
that the operations on nodes and placements have something to work on.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from service.app import create_app
from service.settings import Settings
from tests.live_server import live_server
from tests.service.helpers import add_nodes
from topoplace.serve_cmd import uvicorn_options

COMMITTED = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"
TOKEN = "schemathesis-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# Per operation and generation mode; about 30 operations x 2 modes. Raise it locally
# (TOPOPLACE_SCHEMATHESIS_EXAMPLES) to search harder.
EXAMPLES = int(os.environ.get("TOPOPLACE_SCHEMATHESIS_EXAMPLES", "6"))
# A request the document allows may still be refused for what no schema can state: a
# TTL over the deployment's TOPOPLACE_MAX_RESERVATION_TTL_S (400), a request no node of
# this cluster could ever hold (422 unresolvable, the documented answer), a snapshot
# whose parts disagree (link matrix size and symmetry, unique UUIDs: 422) or whose name
# is not the URL's (400), a GPU share asked of /v1/score, which ranks whole GPUs (422
# unsupported), a Slurm job report whose `scontrol show job` text names no job (400);
# a token whose scope does not fit its role, a region's URL that is no http(s) URL or a
# key that is no Ed25519 key, a summary naming another region, a federated request
# naming a region not registered or breaking /place's own rules, an audit query whose
# cursor the service never gave out or whose until is not after its since (422).
_ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409", "429", "5xx"]
_CONFIG = {
    # The token as schemathesis's own bearer auth: its negative cases leave it out on
    # purpose (the service must answer 401), which a header added to every call would undo.
    "auth": {"openapi": {"bearer": {"bearer": TOKEN}}},
    "operations": [
        {
            "include-path": "/v1/place",
            "checks": {
                "positive_data_acceptance": {"expected-statuses": [*_ACCEPTED, "400", "422"]}
            },
        },
        {
            "include-path": "/v1/nodes/{name}/snapshot",
            "checks": {
                "positive_data_acceptance": {"expected-statuses": [*_ACCEPTED, "400", "422"]}
            },
        },
        {
            "include-path": "/v1/score",
            "checks": {"positive_data_acceptance": {"expected-statuses": [*_ACCEPTED, "422"]}},
        },
        {
            "include-path": "/v1/slurm/job-started",
            "checks": {
                "positive_data_acceptance": {"expected-statuses": [*_ACCEPTED, "400", "422"]}
            },
        },
        *(
            {
                "include-path": path,
                "checks": {"positive_data_acceptance": {"expected-statuses": [*_ACCEPTED, "422"]}},
            }
            for path in (
                "/v1/tokens",
                "/v1/regions",
                "/v1/regions/{region}",
                "/v1/regions/{region}/summary",
                "/v1/federation/place",
                "/v1/federation/score",
            )
        ),
        {
            "include-path": "/v1/audit",
            "checks": {"positive_data_acceptance": {"expected-statuses": [*_ACCEPTED, "422"]}},
        },
        {
            "include-path": "/v1/allocations/{allocation_id}/extend",
            "checks": {"positive_data_acceptance": {"expected-statuses": [*_ACCEPTED, "400"]}},
        },
    ],
}


def _seed(url: str) -> None:
    with httpx.Client(base_url=url, headers=AUTH, trust_env=False) as client:
        add_nodes(client, ("hgx-h100", "h0"), ("hgx-h100", "h1"), ("dgx-a100-mig", "m0"))
        placed = client.post("/v1/place", json={"gpus": 2, "job_id": "seeded"})
        assert placed.status_code == 201, placed.text


def test_every_operation_conforms(database_url: str) -> None:
    config = schemathesis.Config.from_dict(_CONFIG)
    schema = schemathesis.openapi.from_path(COMMITTED, config=config)
    served = Settings(database_url=database_url, api_tokens=TOKEN, insecure_dev=False)
    app = create_app(served)
    # As `topoplace serve` runs it: its HTTP protocol answers what uvicorn cannot parse
    # (the negative cases' malformed headers) in the service's JSON shape.
    with live_server(app, options=uvicorn_options(served)) as url:
        _seed(url)
        failures: list[str] = []
        statuses: Counter[int] = Counter()  # of the positive cases
        for result in schema.get_all_operations():
            operation = result.ok()
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                run = _runner(operation, mode, url, statuses)
                try:
                    run()
                except Unsatisfiable:
                    continue  # no invalid request exists (an operation without parameters)
                except BaseExceptionGroup as exc:  # collect every operation's, then fail once
                    failures.append(f"{operation.label} ({mode.value}): {_describe(exc)}")
        assert not failures, "\n\n".join(failures)
        # The token was sent with the valid requests, and some operations succeeded.
        assert statuses[401] < statuses.total() / 10, statuses
        assert sum(n for status, n in statuses.items() if status < 300) > 20, statuses


def _runner(
    operation: schemathesis.APIOperation, mode: GenerationMode, url: str, statuses: Counter[int]
) -> Callable[[], None]:
    """A hypothesis test calling ``operation`` with generated cases; counts positive answers."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        # The same cases every run, so CI is not a lottery; raise EXAMPLES (or set
        # TOPOPLACE_SCHEMATHESIS_RANDOM=1) locally to search further.
        derandomize=not os.environ.get("TOPOPLACE_SCHEMATHESIS_RANDOM"),
        suppress_health_check=list(HealthCheck),
    )
    def run(case: schemathesis.Case) -> None:
        response = case.call_and_validate(base_url=url)
        if mode is GenerationMode.POSITIVE:
            statuses[response.status_code] += 1

    runner: Callable[[], None] = run
    return runner


def _describe(exc: BaseExceptionGroup[BaseException]) -> str:
    """schemathesis's report: each distinct failure, the answer and a curl to reproduce it."""
    return str(exc)
