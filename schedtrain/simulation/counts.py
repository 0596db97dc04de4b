"""Per-batch amounts of a simulated run: a constant, or one epoch's batches in order.

``RunShape`` reads its counters through these: what ``n`` batches add up to, and the
fewest batches that reach an amount (a bisection over one epoch's running totals).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

from schedtrain.time import MAX_COUNT

__all__ = ["Rate", "batches_for", "ceil_div", "count_at", "cut_runs", "epoch_batches",
           "rate_of", "sums_of", "whole"]

#: What each micro-batch adds: one number, or one epoch's batches in order.
Rate = int | tuple[int, ...]


def ceil_div(due: float, rate: int) -> float:
    """Smallest whole n >= 0 with n * rate >= due (inf when unreachable)."""
    if due <= 0:
        return 0
    if rate <= 0 or math.isinf(due):
        return math.inf
    d = math.ceil(due)
    return -(-d // rate)


def whole(name: str, value: object, least: int) -> int:
    """``value``, checked to be a whole number from ``least`` to ``MAX_COUNT``."""
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_COUNT:
        raise ValueError(f"{name} must be a whole number >= {least}, got {value!r}")
    return value


def rate_of(name: str, value: int | Sequence[int]) -> Rate:
    """A per-batch amount: one number, or one epoch's batches in order (a tuple)."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        return whole(name, value, 0)
    if not value:
        raise ValueError(f"{name} must list one number per batch of an epoch, got []")
    return tuple(whole(f"{name}[{i}]", n, 0) for i, n in enumerate(value))


def sums_of(rate: Rate) -> tuple[int, ...]:
    """Running totals of one epoch's batches (``(0, a, a + b, ...)``); ``()`` for a number."""
    return () if isinstance(rate, int) else (0, *itertools.accumulate(rate))


def count_at(rate: Rate, sums: tuple[int, ...], batch: int) -> int:
    """What ``batch`` micro-batches add up to."""
    if isinstance(rate, int):
        return batch * rate
    q, r = divmod(batch, len(rate))
    return q * sums[-1] + sums[r]


def batches_for(rate: Rate, sums: tuple[int, ...], due: float) -> float:
    """Fewest micro-batches that add up to ``due`` (inf when unreachable)."""
    if isinstance(rate, int):
        return ceil_div(due, rate)
    if due <= 0:
        return 0
    if sums[-1] == 0 or math.isinf(due):
        return math.inf
    q = (math.ceil(due) - 1) // sums[-1]  # whole epochs of batches before the one reaching it
    return q * len(rate) + bisect.bisect_left(sums, math.ceil(due) - q * sums[-1])


def epoch_batches(batches: int | None, per_step: int, samples: Rate, tokens: Rate,
                   epoch_lengths: object) -> tuple[int | None, int | None]:
    """``(batches per epoch, steps per epoch)`` from ``batches_per_epoch`` or the length of
    a per-batch list; ``(None, None)`` when neither is given."""
    if batches is None:
        listed = {len(r) for r in (samples, tokens) if isinstance(r, tuple)}
        if len(listed) > 1:
            raise ValueError("samples_per_batch and tokens_per_batch list different "
                             "numbers of batches per epoch")
        batches = listed.pop() if listed else None
    if batches is None:
        return None, None
    whole("batches_per_epoch", batches, 1)
    whole("batches_per_step", per_step, 1)
    if epoch_lengths is not None:
        raise TypeError("give batches_per_epoch (or per-batch lists) with epochs, "
                        "not epoch_lengths")
    return batches, -(-batches // per_step)


def cut_runs(runs: list[tuple[int, int]], max_steps: int) -> tuple[list[tuple[int, int]], bool]:
    """``runs`` (``(steps per epoch, epochs)``) ended right after step ``max_steps``, and
    whether an epoch was cut short there."""
    done, kept = 0, []
    for length, count in runs:
        if done + length * count < max_steps:
            kept.append((length, count))
            done += length * count
            continue
        full = (max_steps - done) // length
        if full:
            kept.append((length, full))
        rest = max_steps - done - full * length
        if rest:
            kept.append((rest, 1))
            return kept, True
        break
    return kept, False
