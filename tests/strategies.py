"""Hypothesis strategies: random trigger trees and run shapes, plus a brute-force oracle.

The oracle walks every evaluation point of a run one by one and evaluates
triggers from their *definitions* (written here independently of the library's
evaluation code), so comparing it with the jumping simulation checks both the
semantics and the table's skipping.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def _events_of(t: Trigger) -> set[str] | None:
    if isinstance(t, Every | At):
        return {t.unit.event}
    if isinstance(t, On):
        return {t.event}
    if isinstance(t, AllOf):
        sets = [s for c in t.triggers if (s := _events_of(c)) is not None]
        return set.intersection(*sets) if sets else None
    if isinstance(t, AnyOf):
        out: set[str] = set()
        for c in t.triggers:
            s = _events_of(c)
            if s is None:
                return None
            out |= s
        return out
    return None


def holds(t: Trigger, event: str, now: Timestamp, prev: Timestamp) -> bool:
    """A trigger's truth at a point, straight from the definitions in DESIGN §3."""
    if isinstance(t, Every):
        if event != t.unit.event:
            return False
        k = t.period.base
        off = t.offset.base if t.offset is not None else 0
        lo, hi = prev.get(t.unit.counter), now.get(t.unit.counter)
        n = 0
        while off + n * k <= hi:
            g = off + n * k
            if g > 0 and lo < g <= hi:
                return True
            n += 1
        return False
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


def brute_force(schedule: Schedule, shape: Shape) -> list[tuple[str, str, Timestamp]]:
    """Every firing of a run, evaluating every callback at every point."""
    names = schedule.names
    trigs = [e.trigger for e in schedule.entries]
    evs = [_events_of(t) for t in trigs]
    with_batches = any(e is not None and "batch_end" in e for e in evs)
    out: list[tuple[str, str, Timestamp]] = []
    B = shape.batches_per_step

    def emit(event: str, now: Timestamp, prev: Timestamp) -> None:
        for name, t, ev in zip(names, trigs, evs, strict=True):
            if ev is not None and event not in ev:
                continue
            if holds(t, event, now, prev):
                out.append((name, event, now))

    step = batch = sample = token = 0
    seconds = 0.0
    now = Timestamp()
    emit("train_start", now, now)
    last_step_end = now
    for e, length in enumerate(shape.epoch_lengths):
        now = Timestamp(step, batch, e, 0, sample, token, seconds)
        emit("epoch_start", now, now)
        for i in range(length):
            for _ in range(B):
                batch += 1
                sample += shape.samples_per_batch
                token += shape.tokens_per_batch
                now = Timestamp(step, batch, e, i, sample, token, seconds)
                if with_batches:
                    prev = Timestamp(step, batch - 1, e, i, sample, token, seconds)
                    emit("batch_end", now, prev)
            step += 1
            seconds = step * shape.seconds_per_step
            now = Timestamp(step, batch, e, i + 1, sample, token, seconds)
            emit("step_end", now, last_step_end)
            last_step_end = now
        now = Timestamp(step, batch, e + 1, length, sample, token, seconds)
        emit("epoch_end", now, Timestamp(step, batch, e, length, sample, token, seconds))
    emit("train_end", now, now)
    return out
