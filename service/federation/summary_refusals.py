"""Refused summary pushes: every one counted, at most one audit row per region and cause a window.

A refused push (a bad signature, a replay, a retired or unknown region, a seq
too far ahead) is the region's, or an attacker's with its token, and each one
left an audit row: a broken region pushing every half second, or a hostile one
in a loop, filled the log. Every refusal is still answered in full and counted
(``topoplace_summary_refusals_total``, by code); the audit log gets one row per
region and refusal code a window (``TOPOPLACE_AUDIT_REFUSAL_WINDOW_S``, 60 s),
with the refusals of that region and code since its last row folded into it
(``coalesced``), and at most ``TOPOPLACE_AUDIT_REFUSAL_ROWS`` rows a window in
all, as refused placements are bounded (service/audit/refusals.py). A warning is
logged with each row written, so the log is bounded the same way. The window is
kept per replica: N replicas write at most N rows a window for one cause.
"""

from __future__ import annotations

import logging

from sqlalchemy.exc import SQLAlchemyError

from service.audit import records
from service.audit import store as audit
from service.audit.refusals import RefusalGate
from service.errors import ServiceError
from service.state import ServiceState

log = logging.getLogger("topoplace.federation")


class SummaryRefusals:
    def __init__(self, state: ServiceState) -> None:
        self.state = state
        settings = state.settings
        self.gate = RefusalGate(settings.audit_refusal_window_s, settings.audit_refusal_rows)

    def refused(self, region: str, seq: int, refusal: ServiceError) -> None:
        """Count the refusal; write its audit row (and log it) unless the window has one."""
        self.state.metrics.summary_refusals.labels(refusal.code).inc()
        coalesced = self.gate.admit((region, refusal.code))
        if coalesced is None:
            return
        log.warning(
            "refused a summary of region %s: %s %s (and %d more of this since the last"
            " such audit row)",
            region,
            refusal.code,
            refusal.message,
            coalesced,
        )
        detail = {
            "region": region,
            "code": refusal.code,
            "message": refusal.message,
            "detail": refusal.detail,
            "seq": seq,
            "coalesced": coalesced,
        }
        row = records.record("summary", refusal.code, self.state.clock(), detail=detail)
        try:
            audit.write_alone(self.state.engine, row)
        except SQLAlchemyError:  # the refusal is the answer; a database hiccup must not hide it
            log.exception("the audit row of a refused summary of region %s was not written", region)
