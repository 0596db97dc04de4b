"""What ``[run]`` can ask of several processes, and the arithmetic of reduced values.

Torch-free, so the spec checks ``[run] strategy`` and ``[run] reduce`` and
``simulate_ranks`` reduces a simulated run's metrics by exactly the arithmetic the
ranks of a real run use when they agree (``reduce_column``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

__all__ = ["REDUCE_OPS", "STRATEGIES", "first_flagged", "reduce_column", "reduce_values"]

#: ``[run] strategy`` on several processes ("auto" is "ddp").
STRATEGIES: Final = ("auto", "ddp", "fsdp")
#: How a metric put on several processes is combined (``[run] reduce``; "mean" by default).
REDUCE_OPS: Final = ("mean", "sum", "max", "min")


def reduce_values(got: Sequence[float], op: str) -> float:
    """``got`` (one value per rank, at least one) reduced by ``op``: exact and the same on
    every rank; a NaN on any rank is the result whatever the op."""
    if any(math.isnan(v) for v in got):
        return math.nan
    if op in ("mean", "sum"):
        # fsum is exact (and order-independent) but refuses inf + -inf
        total = math.fsum(got) if all(map(math.isfinite, got)) else sum(got)
        return total / len(got) if op == "mean" else total
    return max(got) if op == "max" else min(got)


def reduce_column(rows: Sequence[Sequence[float]], value: int, present: int,
                  op: str) -> float | None:
    """Column ``value`` of gathered rows reduced by ``op`` over the rows whose column
    ``present`` is set (``None`` when none is)."""
    got = [row[value] for row in rows if row[present]]
    return reduce_values(got, op) if got else None


def first_flagged(rows: Sequence[Sequence[float]], column: int) -> int | None:
    """The lowest rank whose row has ``column`` set (``None``: none has)."""
    return next((r for r, row in enumerate(rows) if row[column]), None)
