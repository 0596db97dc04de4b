"""The run state inside a checkpoint, read back: typed, bounded, or refused.

A resume reads a checkpoint's ``run`` (``RunState.capture``) and puts the run back from
it. A file with a valid checksum may still be crafted (the checksum is recomputable), so
everything the resume reads is checked here, before anything is restored: the clock's
counters, the epoch flag, ``events_offset``, the names written, each rank's part and the
epoch's division, and every ``every("auto")`` state in the trigger table. What fails is
a ``DamagedFile`` naming the key path: ``--resume auto`` passes the checkpoint over,
``--resume PATH`` ends with it (exit 2).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch

from schedtrain.readback import (
    MAX_DEPTH,
    DamagedFile,
    between,
    invalid,
    printable,
    structure,
)
from schedtrain.training.redivide import MAX_RANKS, Split
from schedtrain.triggers.auto import AutoState

if TYPE_CHECKING:
    from schedtrain.training.data_position import DataPosition

__all__ = ["MAX_LOSS_SUM", "Clock", "Counters", "DataState", "LossesState", "MetricsState",
           "RankPart", "RunRecord", "check_pending", "check_run"]

_COUNT = between(0, 2**62)


@attrs.frozen
class Counters:
    """A clock's counters: whole numbers >= 0."""

    step: int = attrs.field(validator=_COUNT)
    batch: int = attrs.field(validator=_COUNT)
    epoch: int = attrs.field(validator=_COUNT)
    step_in_epoch: int = attrs.field(validator=_COUNT)
    sample: int = attrs.field(validator=_COUNT)
    token: int = attrs.field(validator=_COUNT)
    time_ns: int = attrs.field(validator=_COUNT)


@attrs.frozen
class Clock:
    """The loop clock's state: the counters now and at the previous step end."""

    now: Counters
    previous_step_end: Counters

    def __attrs_post_init__(self) -> None:
        now, last = self.now, self.previous_step_end
        if now.step_in_epoch > now.step:
            raise invalid("now.step_in_epoch", f"expected at most the step {now.step}, found "
                                               f"{now.step_in_epoch}")
        for key in ("step", "batch", "epoch", "sample", "token"):
            if getattr(last, key) > getattr(now, key):
                raise invalid(f"previous_step_end.{key}", f"expected at most now's "
                              f"{getattr(now, key)}, found {getattr(last, key)}")


@attrs.frozen
class DataState:
    """A rank's data position: a loader's own state, or the generators at the epoch's
    start and the epoch's division (``split``)."""

    epoch_rng: Any = None
    loader: Any = None
    split: Split | None = None


@attrs.frozen
class RankPart:
    """One rank's generators and data position (a run on several processes)."""

    rng: Any
    data: DataState


def _real(value: Any) -> bool:
    # A metric's value may be NaN or infinite (a diverged loss is worth logging).
    return isinstance(value, int | float) and not isinstance(value, bool)


@attrs.frozen
class MetricsState:
    """The metric store's state: each name's history ``[step, epoch, value, wall]``, the
    values not yet written ``[name, step, epoch, value, wall]``, counts per name."""

    history: dict[str, tuple[tuple[int, int, Any, float], ...]]
    pending: tuple[tuple[str, int, int, Any, float], ...] = ()
    counts: dict[str, int] | None = None
    epochs_ended: int | None = attrs.field(default=None, validator=_COUNT)

    def __attrs_post_init__(self) -> None:
        # (key path, index of the name in the row (-1: the history's key), the row)
        rows = [(f"history.{printable(n)}[{i}]", n, -1, r)
                for n, h in self.history.items() for i, r in enumerate(h)]
        rows += [(f"pending[{i}]", r[0], 0, r[1:]) for i, r in enumerate(self.pending)]
        for where, name, at, (step, epoch, value, _wall) in rows:
            if printable(name) != name or not 0 < len(name) <= 200:
                named = where if at < 0 else f"{where}[0]"
                raise invalid(named, "expected a printable metric name, found "
                              f"{printable(name)[:60]!r}")
            for i, (what, ok) in enumerate((("a step >= 0", step >= 0),
                                            ("an epoch >= 0", epoch >= 0),
                                            ("a number", _real(value)))):
                if not ok:  # named by the item at fault, as the row holds it
                    raise invalid(f"{where}[{i + at + 1}]", f"expected {what}, found "
                                  f"{printable(repr((step, epoch, value)[i]))[:40]}")
        for name, count in (self.counts or {}).items():
            kept = len(self.history.get(name, ()))
            if count < kept or printable(name) != name:  # each value kept was counted
                raise invalid(f"counts.{printable(name)}", f"a count >= {kept} (the values "
                              f"kept) of a printable name, found {count!r}")


#: The largest loss sum a checkpoint may hold: float32's range (a larger one is no sum of
#: the losses a step computes, and would overflow once one more is added).
MAX_LOSS_SUM = 1e38


def _small(value: Any) -> bool:
    # NaN and infinities are a diverged loss, kept as it was (TerminateOnNaN judges it);
    # a finite value past float32's range is no sum of a step's losses.
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            return False
        number = float(value.detach().float().cpu())
    elif value is None:
        return True
    elif _real(value):
        number = float(value)
    else:
        return False
    return not math.isfinite(number) or abs(number) <= MAX_LOSS_SUM


@attrs.frozen
class LossesState:
    """The loss keeper's state: the unpublished sum, the step it began at, the last loss."""

    since: int = attrs.field(validator=_COUNT)
    sum: Any = None
    last: Any = None

    def __attrs_post_init__(self) -> None:
        for name in ("sum", "last"):
            if not _small(getattr(self, name)):
                found = printable(repr(getattr(self, name)))[:40]
                raise invalid(name, f"expected a number of at most {MAX_LOSS_SUM:g} in "
                                    f"magnitude (or not finite), found {found}")


def _same(a: Any, b: Any) -> bool:
    return bool(a == b or (math.isnan(a) and math.isnan(b)))


def check_pending(metrics: MetricsState, limit: int | None, shown: Path | str) -> None:
    """Each value not yet written is also in its name's history (the store keeps one
    record in both), unless that history is full and dropped it.

    Raises:
        DamagedFile: a value not yet written that its history does not hold.
    """
    for i, (name, step, epoch, value, _wall) in enumerate(metrics.pending):
        rows = metrics.history.get(name, ())
        if (limit is None or len(rows) < limit) and not any(
                (s, e) == (step, epoch) and _same(v, value) for s, e, v, _ in rows):
            raise DamagedFile(shown, f"run.metrics.pending[{i}]", (
                "expected a value its history holds (the store keeps both), found one it "
                "does not"))


@attrs.frozen
class RunRecord:
    """The top-level fields of a checkpoint's ``run`` a resume reads, with their bounds:
    every rank's division agrees with rank 0's and with the ranks recorded."""

    clock: Clock
    epoch_open: bool
    written: tuple[str, ...]
    rng: Any
    data: DataState
    metrics: MetricsState | None = None
    losses: LossesState | None = None
    events_offset: int | None = attrs.field(default=None, validator=_COUNT)
    ranks: tuple[RankPart, ...] | None = None

    def __attrs_post_init__(self) -> None:
        for i, name in enumerate(self.written):
            if printable(name) != name or not 0 < len(name) <= 4096:
                raise invalid(f"written[{i}]", "expected a printable file name, found "
                              f"{printable(name)[:60]!r}")
        if self.ranks is not None and not 1 <= len(self.ranks) <= MAX_RANKS:
            raise invalid("ranks", f"expected 1 to {MAX_RANKS:,} ranks, found none")
        for where, split in self.splits():
            world = 1 if self.ranks is None else len(self.ranks)
            if split.ranks != world:
                raise invalid(f"{where}.ranks", f"expected the {world} rank(s) the run "
                              f"recorded, found {split.ranks!r}")
            first = self.splits()[0][1]
            if (split.done, split.start, split.order.get("seed")) != (
                    first.done, first.start, first.order.get("seed")):
                raise invalid(where, "expected the same division as rank 0's")

    def splits(self) -> list[tuple[str, Split]]:
        """Each rank's division (one process: the run's), by its key path."""
        if self.ranks is None:
            return [] if self.data.split is None else [("data.split", self.data.split)]
        return [(f"ranks[{i}].data.split", part.data.split)
                for i, part in enumerate(self.ranks) if part.data.split is not None]


def _auto_states(table: Any) -> Iterator[tuple[str, Any]]:
    """Each ``every("auto")`` node state in a trigger table's state (composites nest
    their parts' states by index), by key path."""
    triggers = table.get("triggers") if isinstance(table, Mapping) else None
    stack: list[tuple[str, Any, int]] = [("run.table.triggers", triggers, 0)]
    while stack:
        where, value, depth = stack.pop()
        if not isinstance(value, Mapping) or depth > MAX_DEPTH:
            continue
        if "decider" in value or "next" in value:
            yield where, value
            continue
        stack.extend((f"{where}.{printable(str(k))}", v, depth + 1) for k, v in value.items())


def check_run(run: Mapping[str, Any], shown: Path | str,
              position: DataPosition | None = None, history: int | None = 10_000
              ) -> RunRecord:
    """``run`` checked as a resume reads it; ``position``: the run's data, against which
    the epoch's division is checked (counts within its stretches, an order to replay).

    Raises:
        DamagedFile: the first field at fault, by key path.
    """
    record = structure(run, RunRecord, shown, "run")
    step = record.clock.now.step
    if record.losses is not None:
        published = max((r[0] for r in (record.metrics.history.get("train/loss", ())
                                        if record.metrics is not None else ())), default=0)
        if not published <= record.losses.since <= step:
            raise DamagedFile(shown, "run.losses.since", (
                f"expected the step train/loss was last published at, from {published} to "
                f"{step}, found {record.losses.since}"))
    if record.metrics is not None:
        check_pending(record.metrics, history, shown)
    for where, state in _auto_states(run.get("table")):
        structure(state, AutoState, shown, where).check_next(step, shown, where)
    splits = record.splits()
    if position is not None and record.epoch_open and splits:
        where, split = splits[0]
        position.check_split(split, record.clock.now.epoch, shown, f"run.{where}")
    return record
