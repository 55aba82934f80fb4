"""Whole numbers as a request may write them: 4 or 4.0, never true or "4".

Pydantic's lax integers take ``true`` as 1 and ``"4"`` as 4, so a caller's
mistake would reserve GPUs; its strict integers refuse ``4.0``, which JSON
Schema (and so the OpenAPI document, and every client generated from it)
counts as an integer. :data:`WHOLE` sits between: numbers with no fraction
are whole numbers, booleans and strings are refused.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BeforeValidator


def _whole_number(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value  # anything else meets the strict check below: bool and str are refused


WHOLE = BeforeValidator(_whole_number)
"""Placed after the bounds: ``Annotated[int, Field(strict=True, ge=1, le=64), WHOLE]``.

Bounds given after the conversion (or on the field) are not applied under it by
pydantic: it writes them into the JSON schema as unknown keywords instead of
minimum and maximum.
"""


def share_thousandths(fraction: float) -> int:
    """A share of one GPU in thousandths (the Alibaba trace's ``gpu_milli``), at least one.

    Rounded up, never to the nearest: three shares of 0.3334 counted 333 each fitted on
    one GPU while each was told it held 0.3334. Rounded to a thousandth of a thousandth
    first, so that float noise (0.1 + 0.2 is 0.30000000000000004) is not a thousandth.
    """
    return max(1, math.ceil(round(fraction * 1000, 3)))
