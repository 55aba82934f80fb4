"""Strings a request may carry: no control characters, no lone surrogates.

Every name and free-text field of a request ends up in a database row, a
log line, an environment variable or a Slurm/Kubernetes object. Postgres
refuses NUL in text outright (the whole transaction fails), other control
characters forge log lines and environment values, and a lone UTF-16
surrogate (``"\\ud800"`` in JSON) cannot be encoded as UTF-8 at all. So they
are refused where the request is read, with the field named, instead of
failing wherever the string lands.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

# Unicode category Cc (C0 controls, DEL, C1 controls), the bidirectional controls
# (embeddings, overrides, isolates and marks: a name carrying one is printed by a
# terminal or a log viewer in another order than it is stored, so a hostile agent's
# hostname could make an operator read another node's) and the surrogate range.
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_FORBIDDEN = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}\ud800-\udfff]")
# The same rule as the OpenAPI document states it (JSON text cannot carry a lone
# surrogate, so the controls are the whole rule there).
PLAIN_PATTERN = (
    "^[^\\u0000-\\u001f\\u007f-\\u009f\\u061c\\u200e\\u200f\\u202a-\\u202e\\u2066-\\u2069]*$"
)


def forbidden_character(value: str) -> str | None:
    """The first character ``value`` may not carry, or None."""
    found = _FORBIDDEN.search(value)
    return found.group() if found else None


def _plain(value: str) -> str:
    bad = forbidden_character(value)
    if bad is not None:
        raise ValueError(f"control characters are not allowed (found U+{ord(bad):04X})")
    return value


Text = Annotated[str, AfterValidator(_plain), Field(json_schema_extra={"pattern": PLAIN_PATTERN})]
"""A string without control characters or lone surrogates."""
