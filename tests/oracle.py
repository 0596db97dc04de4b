"""A reference for the firing rules, written from DESIGN section 3 and docs/concepts.md alone.

It visits every evaluation point of a run in order, evaluates every callback at every
event its own trigger can be true at, and decides each trigger from its definition
(it shares no evaluation code with the library). Metric values come from a stream: a
value stamped at step ``k`` is visible from step ``k``'s ``step_end`` on, one stamped at
epoch ``e`` from that epoch's ``epoch_end`` on (never, if that epoch is cut short).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from schedtrain import Schedule, Timestamp
from schedtrain.triggers import (
    AllOf,
    AnyOf,
    At,
    Every,
    Improved,
    Not,
    On,
    Plateau,
    Trigger,
    When,
    Window,
)

OPT_IN = {"batch_end", "eval_start", "eval_step_end", "eval_end", "preempt"}
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "==": operator.eq, "!=": operator.ne,
}

#: Condition text -> its syntax tree, registered by the strategies that write conditions:
#: ("cmp", metric, op, number) | ("and" | "or", [trees]) | ("not", tree)
CONDITIONS: dict[str, Any] = {}


@dataclass(frozen=True)
class RunSpec:
    """A run's shape, as the reference walks it."""

    epoch_lengths: tuple[int, ...]
    batches_per_step: int = 1
    #: one number for every batch, or a tuple: one epoch's batches in order
    samples_per_batch: int | tuple[int, ...] = 0
    tokens_per_batch: int | tuple[int, ...] = 0
    seconds_per_step: float = 0.0
    max_steps: int | None = None
    #: (("step" | "epoch", k), metric name, value), in the order they are put
    metrics: tuple[tuple[tuple[str, int], str, float], ...] = ()
    #: micro-batches in each epoch: its last step takes what is left (``None``: whole steps)
    batches_per_epoch: int | None = None


def _per_batch(rate: int | tuple[int, ...], index: int) -> int:
    """What the ``index``-th batch of an epoch adds."""
    return rate if isinstance(rate, int) else rate[index]


def _events(t: Trigger) -> tuple[set[str], bool]:
    """(events named, evaluated at every default event too)."""
    if isinstance(t, Every | At):
        return {t.unit.event}, False
    if isinstance(t, On):
        return {t.event}, False
    if isinstance(t, AllOf):
        # a part with no clock part restricts nothing; the clock parts' events must meet
        parts = [_events(c) for c in t.triggers]
        clocked = [n for n, d in parts if not d]
        if not clocked:
            return set().union(*(n for n, _ in parts)), True
        return set.intersection(*clocked), False
    if isinstance(t, AnyOf):
        named, default = set(), False
        for c in t.triggers:
            n2, d2 = _events(c)
            named, default = named | n2, default or d2
        return named, default
    return set(), True  # no clock part: a window, a condition, a metric trigger, a not


def evaluated_at(t: Trigger, event: str) -> bool:
    """Whether a callback with trigger ``t`` is evaluated at ``event``."""
    named, default = _events(t)
    return event in named or (default and event not in OPT_IN)


def _dynamic(t: Trigger) -> bool:
    if isinstance(t, When | Improved | Plateau):
        return True
    return any(_dynamic(c) for c in t.children())


@dataclass
class _Point:
    event: str
    now: Timestamp
    prev: Timestamp
    visible: dict[str, list[float]]


def _crossed(points: Sequence[int], lo: int, hi: int) -> bool:
    return any(lo < p <= hi for p in points)


def _grid_crossed(t: Every, lo: int, hi: int) -> bool:
    k = t.period.base
    off = t.offset.base if t.offset is not None else 0
    n = max(0, -(-(lo + 1 - off) // k))  # the least n with off + n*k > lo
    g = off + n * k
    return lo < (g if g > 0 else k) <= hi


def _condition(tree: Any, visible: dict[str, list[float]]) -> bool:
    kind = tree[0]
    if kind == "cmp":
        _, name, op, number = tree
        values = visible.get(name)
        return bool(values) and _OPS[op](values[-1], number)
    if kind == "not":
        return not _condition(tree[1], visible)
    results = [_condition(c, visible) for c in tree[1]]
    return all(results) if kind == "and" else any(results)


@dataclass
class _Callback:
    name: str
    trigger: Trigger
    state: dict[tuple[int, ...], dict[str, Any]] = field(default_factory=dict)

    def value(self, t: Trigger, pt: _Point, key: tuple[int, ...] = ()) -> bool:
        if isinstance(t, Every):
            c = t.period.counter
            return pt.event == t.unit.event and _grid_crossed(t, pt.prev.get(c), pt.now.get(c))
        if isinstance(t, At):
            c = t.unit.counter
            return pt.event == t.unit.event and _crossed([p.base for p in t.points],
                                                         pt.prev.get(c), pt.now.get(c))
        if isinstance(t, On):
            return pt.event == t.event
        if isinstance(t, Window):
            v = pt.now.get(t.counter)
            return ((t.start is None or v >= t.start.base)
                    and (t.stop is None or v < t.stop.base))
        if isinstance(t, When):
            return _condition(CONDITIONS[t.text], pt.visible)
        if isinstance(t, Improved | Plateau):
            return self._metric(t, pt, key)
        kids = list(enumerate(t.children()))
        if isinstance(t, AllOf):
            # clock parts first; dynamic parts only where every clock part holds
            static = [self.value(c, pt, (*key, i)) for i, c in kids if not _dynamic(c)]
            if not all(static):
                return False
            # a list, not a generator: every dynamic part sees the point (their state)
            return all([self.value(c, pt, (*key, i)) for i, c in kids if _dynamic(c)])  # noqa: C419
        if isinstance(t, AnyOf):
            return any([self.value(c, pt, (*key, i)) for i, c in kids])  # noqa: C419
        if isinstance(t, Not):
            return not self.value(t.trigger, pt, (*key, 0))
        raise TypeError(t)

    def _metric(self, t: Improved | Plateau, pt: _Point, key: tuple[int, ...]) -> bool:
        s = self.state.setdefault(key, {"best": None, "seen": 0, "wait": 0})
        values = pt.visible.get(t.metric, [])
        if len(values) <= s["seen"]:
            return False  # no new value since last looked
        s["seen"] = len(values)
        v, best = values[-1], s["best"]
        better = best is None or (v < best - t.min_delta if t.mode == "min"
                                  else v > best + t.min_delta)
        if better:
            s["best"] = v
        if isinstance(t, Improved):
            return better
        s["wait"] = 0 if better else s["wait"] + 1
        if s["wait"] >= t.patience:
            s["wait"] = 0
            return True
        return False


def firings(schedule: Schedule, run: RunSpec) -> list[tuple[str, str, Timestamp]]:
    """Every firing of ``run``, in order: ``(callback, event, clock)``."""
    cbs = [_Callback(e.default_name(), e.trigger) for e in schedule.entries]
    out: list[tuple[str, str, Timestamp]] = []
    B = run.batches_per_step
    ns = round(Fraction(repr(run.seconds_per_step)) * 10**9)

    # Values in the order they become visible (several at once: in stream order).
    shown: list[int] = []

    def visible(now: Timestamp) -> dict[str, list[float]]:
        for i, ((unit, k), _, _) in enumerate(run.metrics):
            if i not in shown and (now.step if unit == "step" else now.epoch) >= k:
                shown.append(i)
        seen: dict[str, list[float]] = {}
        for i in shown:
            _, name, value = run.metrics[i]
            seen.setdefault(name, []).append(value)
        return seen

    def emit(event: str, now: Timestamp, prev: Timestamp) -> None:
        pt = _Point(event, now, prev, visible(now))
        for cb in cbs:
            if evaluated_at(cb.trigger, event) and cb.value(cb.trigger, pt):
                out.append((cb.name, event, now))

    def ts(step: int, batch: int, epoch: int, in_epoch: int, sample: int,  # noqa: PLR0917
           token: int) -> Timestamp:
        return Timestamp(step, batch, epoch, in_epoch, sample, token, time_ns=step * ns)

    step = batch = sample = token = 0
    now = Timestamp()
    emit("train_start", now, now)
    last_step_end = now
    epochs_done = 0
    for e, length in enumerate(run.epoch_lengths):
        now = ts(step, batch, e, 0, sample, token)
        emit("epoch_start", now, now)
        cut = False
        in_epoch = 0  # batches of this epoch done
        for i in range(length):
            left = B if run.batches_per_epoch is None else run.batches_per_epoch - in_epoch
            for _ in range(min(B, left)):
                batch += 1
                sample += _per_batch(run.samples_per_batch, in_epoch)
                token += _per_batch(run.tokens_per_batch, in_epoch)
                in_epoch += 1
                emit("batch_end", ts(step, batch, e, i, sample, token),
                     ts(step, batch - 1, e, i, sample, token))
            step += 1
            now = ts(step, batch, e, i + 1, sample, token)
            emit("step_end", now, last_step_end)
            last_step_end = now
            if run.max_steps is not None and step >= run.max_steps:
                cut = i + 1 < length
                break
        if cut:
            break
        epochs_done = e + 1
        now = ts(step, batch, e + 1, now.step_in_epoch, sample, token)
        emit("epoch_end", now, ts(step, batch, e, now.step_in_epoch, sample, token))
        if run.max_steps is not None and step >= run.max_steps:
            break
    now = ts(step, batch, epochs_done, now.step_in_epoch, sample, token)
    emit("train_end", now, now)
    return out
