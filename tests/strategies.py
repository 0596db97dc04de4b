"""Hypothesis strategies: random trigger trees and run shapes, plus a brute-force oracle.

The oracle walks every evaluation point of a run one by one and evaluates
triggers from their *definitions* (written here independently of the library's
evaluation code), so comparing it with the jumping simulation checks both the
semantics and the table's skipping.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

from hypothesis import strategies as st

from schedtrain import Schedule, Time, Timestamp, Unit
from schedtrain.triggers import (
    AllOf,
    AnyOf,
    At,
    Every,
    Not,
    On,
    Trigger,
    Window,
    all_of,
    any_of,
    at,
    every,
    not_,
    on,
    window,
)

COUNTING_UNITS = [Unit.STEP, Unit.EPOCH, Unit.BATCH, Unit.SAMPLE, Unit.TOKEN, Unit.SECOND]
EVENTS = ["train_start", "epoch_start", "step_end", "epoch_end", "train_end", "batch_end"]


@st.composite
def periodic(draw: st.DrawFn) -> Trigger:
    unit = draw(st.sampled_from(COUNTING_UNITS))
    k = draw(st.integers(1, 12))
    off = draw(st.integers(0, 2 * k))
    return every(k, unit, offset=off if off else None)


@st.composite
def points(draw: st.DrawFn) -> Trigger:
    unit = draw(st.sampled_from(COUNTING_UNITS))
    ps = draw(st.lists(st.integers(1, 60), min_size=1, max_size=4))
    return at(*(Time(p, unit) for p in ps))


@st.composite
def windows(draw: st.DrawFn) -> Trigger:
    unit = draw(st.sampled_from([Unit.STEP, Unit.EPOCH, Unit.SAMPLE]))
    start = draw(st.none() | st.integers(0, 40))
    stop = draw(st.none() | st.integers(1, 80))
    if start is None and stop is None:
        start = 1
    if start is not None and stop is not None and stop <= start:
        stop = start + 1
    return window(
        None if start is None else Time(start, unit), None if stop is None else Time(stop, unit)
    )


lifecycle = st.sampled_from(EVENTS).map(on)
leaves = st.one_of(periodic(), periodic(), points(), lifecycle, windows())


def clock_triggers(max_leaves: int = 6) -> st.SearchStrategy[Trigger]:
    """Random clock-only trigger trees (no conditions or metrics)."""
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.lists(children, min_size=2, max_size=3).map(lambda ts: all_of(*ts)),
            st.lists(children, min_size=2, max_size=3).map(lambda ts: any_of(*ts)),
            children.map(not_),
        ),
        max_leaves=max_leaves,
    )


@st.composite
def schedules(draw: st.DrawFn, max_callbacks: int = 4) -> Schedule:
    n = draw(st.integers(1, max_callbacks))
    return Schedule({f"cb{i}": draw(clock_triggers()) for i in range(n)})


@dataclass(frozen=True)
class Shape:
    epoch_lengths: tuple[int, ...]
    batches_per_step: int
    samples_per_batch: int
    tokens_per_batch: int
    seconds_per_step: float

    def kwargs(self) -> dict[str, object]:
        return {
            "epoch_lengths": list(self.epoch_lengths),
            "batches_per_step": self.batches_per_step,
            "samples_per_batch": self.samples_per_batch,
            "tokens_per_batch": self.tokens_per_batch,
            "seconds_per_step": self.seconds_per_step,
        }


@st.composite
def shapes(draw: st.DrawFn, max_epochs: int = 5, max_len: int = 25) -> Shape:
    lengths = draw(st.lists(st.integers(1, max_len), min_size=1, max_size=max_epochs))
    return Shape(
        tuple(lengths),
        draw(st.integers(1, 3)),
        draw(st.integers(0, 4)),
        draw(st.sampled_from([0, 3, 7, 10])),
        draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5])),
    )


# -- the oracle -----------------------------------------------------------------------


OPT_IN = {"batch_end", "eval_start", "eval_step_end", "eval_end", "preempt"}


def _events_of(t: Trigger) -> tuple[set[str], bool]:
    """(events named, evaluated at every default event too) — DESIGN section 3."""
    from oracle import _events

    return _events(t)


def evaluated_at(t: Trigger, event: str) -> bool:
    """Whether a callback with trigger ``t`` is evaluated at ``event``."""
    named, default = _events_of(t)
    return event in named or (default and event not in OPT_IN)


def holds(t: Trigger, event: str, now: Timestamp, prev: Timestamp) -> bool:
    """A trigger's truth at a point, straight from the definitions in DESIGN §3."""
    if isinstance(t, Every):
        if event != t.unit.event:
            return False
        k = t.period.base
        off = t.offset.base if t.offset is not None else 0
        lo, hi = prev.get(t.unit.counter), now.get(t.unit.counter)
        # the least grid point off + n*k (n >= 0, not 0) above lo; does it reach hi?
        n = max(0, -(-(lo + 1 - off) // k))
        g = off + n * k
        if g == 0:
            g = k
        return lo < g <= hi
    if isinstance(t, At):
        if event != t.unit.event:
            return False
        lo, hi = prev.get(t.unit.counter), now.get(t.unit.counter)
        return any(lo < p.base <= hi for p in t.points)
    if isinstance(t, On):
        return event == t.event
    if isinstance(t, Window):
        v = now.get(t.counter)
        return (t.start is None or v >= t.start.base) and (t.stop is None or v < t.stop.base)
    if isinstance(t, AllOf):
        return all(holds(c, event, now, prev) for c in t.triggers)
    if isinstance(t, AnyOf):
        return any(holds(c, event, now, prev) for c in t.triggers)
    if isinstance(t, Not):
        return not holds(t.trigger, event, now, prev)
    raise TypeError(t)


def evaluation_points(shape: Shape) -> Iterator[tuple[str, Timestamp, Timestamp]]:
    """Every evaluation point of a run, one by one: ``(event, now, prev)``."""
    B = shape.batches_per_step
    ns_per_step = round(Fraction(repr(shape.seconds_per_step)) * 10**9)

    def ts(step: int, batch: int, epoch: int, in_epoch: int, sample: int, token: int,  # noqa: PLR0917
           ns: int) -> Timestamp:
        return Timestamp(step, batch, epoch, in_epoch, sample, token, time_ns=ns)

    step = batch = sample = token = ns = 0
    now = Timestamp()
    yield "train_start", now, now
    last_step_end = now
    for e, length in enumerate(shape.epoch_lengths):
        now = ts(step, batch, e, 0, sample, token, ns)
        yield "epoch_start", now, now
        for i in range(length):
            for _ in range(B):
                batch += 1
                sample += shape.samples_per_batch
                token += shape.tokens_per_batch
                now = ts(step, batch, e, i, sample, token, ns)
                yield "batch_end", now, ts(step, batch - 1, e, i, sample, token, ns)
            step += 1
            ns = step * ns_per_step
            now = ts(step, batch, e, i + 1, sample, token, ns)
            yield "step_end", now, last_step_end
            last_step_end = now
        now = ts(step, batch, e + 1, length, sample, token, ns)
        yield "epoch_end", now, ts(step, batch, e, length, sample, token, ns)
    yield "train_end", now, now


def brute_force(schedule: Schedule, shape: Shape) -> list[tuple[str, str, Timestamp]]:
    """Every firing of a run, evaluating every callback at every point where it is evaluated."""
    names = schedule.names
    trigs = [e.trigger for e in schedule.entries]
    return [(name, event, now) for event, now, prev in evaluation_points(shape)
            for name, t in zip(names, trigs, strict=True)
            if evaluated_at(t, event) and holds(t, event, now, prev)]
