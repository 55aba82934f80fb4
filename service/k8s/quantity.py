"""Kubernetes resource quantities ("500m", "1.5", "4Gi", "129e6") read exactly.

The grammar is Kubernetes' (k8s.io/apimachinery resource.Quantity): an
optional sign, a decimal number (``5``, ``5.``, ``.5``, ``1.5``) and one
suffix: none, a decimal SI one (``m k M G T P E``), a binary one (``Ki Mi
Gi Ti Pi Ei``) or a decimal exponent (``e3``, ``E-2``; ``E`` alone is exa).

The value is kept exact (Decimal, never a float) and then, as Kubernetes
stores every quantity, rounded up to thousandths of its unit ("0.1m" is
1m) and capped at 2**63 - 1 of them. kube-scheduler sums a pod's quantities
in those units, so summing :func:`milli_units` gives its figures exactly:
milli-CPU as they are, memory (milli-bytes) rounded up to MiB at the end
(:func:`mib`), so a pod is never counted smaller than the scheduler counts it.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Context, Decimal, Inexact

_NUMBER = re.compile(r"([+-]?)([0-9]+\.?[0-9]*|\.[0-9]+)(.*)", re.ASCII | re.DOTALL)
_EXPONENT = re.compile(r"[eE]([+-]?[0-9]+)", re.ASCII)
_DECIMAL_SI = {"m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SI = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
CAP = 2**63 - 1  # Kubernetes' bound on a quantity, in the units counted here
# Kubernetes reads an exponent as a 32-bit integer. Past 10**25 milli-units a value is
# capped, and a positive one below one milli-unit rounds up to one, so powers of ten
# outside these bounds are never computed (10**(2**31) would not fit in memory).
_ABOVE_CAP = 25
_BELOW_ONE = -1
MIB_MILLI = 1000 * 2**20  # milli-bytes in a MiB


class BadQuantity(ValueError):
    """The text is not a Kubernetes quantity, or is negative."""


def milli_units(text: object) -> int:
    """A quantity in thousandths of its unit, rounded up and capped as Kubernetes stores
    it. ``text`` is a string as Kubernetes writes it, or a JSON number (Kubernetes'
    decoder takes an unquoted number too). BadQuantity otherwise."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise BadQuantity("is not a quantity")
    raw = text if isinstance(text, str) else repr(text)
    match = _NUMBER.fullmatch(raw)
    if match is None:
        raise BadQuantity("is not a quantity (a number with an optional suffix: 500m, 4Gi)")
    sign, number, suffix = match.groups()
    value = Decimal(number)  # exact at any length: construction does not round
    if suffix in _DECIMAL_SI:
        power, factor = _DECIMAL_SI[suffix] + 3, 1
    elif suffix in _BINARY_SI:
        power, factor = 3, 2 ** _BINARY_SI[suffix]
    else:
        exponent = _EXPONENT.fullmatch(suffix)
        if exponent is None:
            raise BadQuantity(f"has an unknown suffix {suffix[:8]!r} (m, k, M, G, Ki, Mi, Gi, e6)")
        power, factor = _exponent(exponent.group(1)) + 3, 1
    if value == 0:
        return 0
    if sign == "-":
        raise BadQuantity("is negative")
    # 2**60 is below 10**19: the bound holds for binary suffixes as well.
    magnitude = value.adjusted() + power + (19 if factor > 1 else 0)
    if magnitude > _ABOVE_CAP:
        return CAP
    if magnitude < _BELOW_ONE:
        return 1
    context = Context(prec=len(value.as_tuple().digits) + 60, Emax=999, Emin=-999, traps=[Inexact])
    scaled = context.multiply(value.scaleb(power, context), Decimal(factor))
    return min(CAP, int(scaled.to_integral_value(ROUND_CEILING, context)))


def _exponent(digits: str) -> int:
    body = digits.lstrip("+-").lstrip("0") or "0"
    if len(body) > 10 or abs(int(body)) > 2**31 - 1:
        raise BadQuantity("has an exponent past what Kubernetes reads (32 bits)")
    return int(digits)


def mib(milli_bytes: int) -> int:
    """Memory in milli-bytes as whole MiB, rounded up."""
    return -(-milli_bytes // MIB_MILLI)
