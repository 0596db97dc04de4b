"""Metric triggers: ``improved`` (a new best value) and ``plateau`` (no new best for a while).

Both look only at *new* values of the metric (its count grew since they last
looked), so evaluating them at every step does not count a stale value twice.
They carry state (the best value, the wait), saved by ``state_dict``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import attrs

from schedtrain.errors import ArgumentError
from schedtrain.readback import state_number
from schedtrain.time import MAX_COUNT, Timestamp
from schedtrain.triggers.base import Trigger
from schedtrain.triggers.protocol import ANY_TIME, Due, Explanation, Node, Point

__all__ = ["Improved", "MetricTrigger", "Plateau", "better", "early_stop", "improved", "plateau"]

Mode = Literal["min", "max"]


def _check_metric(_i: object, _a: object, value: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ArgumentError("metric", f"`metric` must be a metric name such as 'val/loss', "
                            f"got {value!r}", expected="a metric name", found=repr(value))


def _check_mode(_i: object, _a: object, value: str) -> None:
    if value not in ("min", "max"):
        raise ArgumentError("mode", f"`mode` must be 'min' or 'max', got {value!r}",
                            expected="'min' or 'max'", found=repr(value))


def _to_delta(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ArgumentError("min_delta", f"`min_delta` must be a number >= 0, got {value!r}",
                            expected="a number >= 0", found=repr(value))
    return float(value)


def _check_delta(_i: object, _a: object, value: float) -> None:
    if not value >= 0 or value == float("inf"):
        raise ArgumentError("min_delta", f"`min_delta` must be a finite number >= 0, got "
                            f"{value!r}", expected="a finite number >= 0", found=repr(value))


def better(value: float, best: float | None, mode: str, min_delta: float) -> bool:
    """Whether ``value`` is a new best: beats ``best`` (``None``: there is none yet) by
    more than ``min_delta`` in the direction ``mode``."""
    if best is None:
        return True
    if mode == "min":
        return value < best - min_delta
    return value > best + min_delta


def early_stop(value: float, *, best: float | None, wait: int, monitor: str, mode: str,
               min_delta: float, patience: int, check_finite: bool = True,
               stopping_threshold: float | None = None,
               divergence_threshold: float | None = None,
               ) -> tuple[float | None, int, str | None]:
    """One check of ``EarlyStopping`` with ``patience`` (also what ``plan`` models):
    the new best, the new count of checks without one, and why training stops now
    (``None``: it goes on). Lightning's order: a value that is not finite
    (``check_finite``), one strictly better than ``stopping_threshold``, one strictly
    worse than ``divergence_threshold``, then ``patience`` checks without a new best."""
    if check_finite and not math.isfinite(value):
        was = "none" if best is None else f"{best:.4g}"
        return best, wait, f"{monitor} = {value} is not finite (best {was})"
    lower = mode == "min"
    if stopping_threshold is not None and (value < stopping_threshold if lower
                                           else value > stopping_threshold):
        sign = "<" if lower else ">"
        return best, wait, (f"{monitor} = {value:.4g} {sign} stopping_threshold "
                            f"{stopping_threshold:.4g}")
    if divergence_threshold is not None and (value > divergence_threshold if lower
                                             else value < divergence_threshold):
        sign = ">" if lower else "<"
        return best, wait, (f"{monitor} = {value:.4g} {sign} divergence_threshold "
                            f"{divergence_threshold:.4g}")
    if better(value, best, mode, min_delta):
        return value, 0, None
    wait += 1
    if wait < patience:
        return best, wait, None
    return best, wait, (f"{monitor} did not improve for {patience} checks (best "
                        f"{'none' if best is None else f'{best:.4g}'})")


class MetricTrigger(Trigger):
    """What ``improved`` and ``plateau`` share: one metric, read where it is put, judged
    against the best so far in a ``mode`` with a ``min_delta``."""

    metric: str
    mode: Mode
    min_delta: float
    _node: ClassVar[type[_MetricNode]]

    @property
    def dynamic(self) -> bool:
        return True

    def metrics(self) -> frozenset[str]:
        return frozenset((self.metric,))

    def compile(self) -> Node:
        return self._node(self)

    def _args(self) -> str:
        """The arguments between the metric and the mode in ``repr``."""
        return ""

    def __repr__(self) -> str:
        extra = f", min_delta={self.min_delta!r}" if self.min_delta else ""
        return (f"{type(self).__name__.lower()}({self.metric!r}{self._args()}, "
                f"mode={self.mode!r}{extra})")


@attrs.frozen(repr=False)
class Improved(MetricTrigger):
    """True when a new value of ``metric`` beats the best so far by more than ``min_delta``."""

    metric: str = attrs.field(validator=_check_metric)
    mode: Mode = attrs.field(default="min", validator=_check_mode)
    min_delta: float = attrs.field(default=0.0, converter=_to_delta, validator=_check_delta)


@attrs.frozen(repr=False)
class Plateau(MetricTrigger):
    """True once ``patience`` new values in a row fail to beat the best; then counts anew."""

    metric: str = attrs.field(validator=_check_metric)
    patience: int = attrs.field()
    mode: Mode = attrs.field(default="min", validator=_check_mode)
    min_delta: float = attrs.field(default=0.0, converter=_to_delta, validator=_check_delta)

    @patience.validator
    def _check_patience(self, _a: object, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ArgumentError("patience", f"`patience` must be a whole number >= 1, got "
                                f"{value!r}", expected="a whole number >= 1", found=repr(value))

    def _args(self) -> str:
        return f", patience={self.patience}"


class _MetricNode:
    """Shared machinery: look at new values only; state is best, seen count and wait."""

    def __init__(self, trigger: MetricTrigger) -> None:
        self.trigger = trigger
        self.best: float | None = None
        self.seen = 0
        self.wait = 0

    def _judge(self, value: float) -> tuple[bool, float | None, int, str]:
        """For a new value: (fires, new best, new wait, why)."""
        raise NotImplementedError

    def _step(self, pt: Point, commit: bool) -> tuple[bool | None, str]:
        t = self.trigger
        if pt.metrics is None:
            return None, "needs metric values"
        mv = pt.metrics.latest(t.metric)
        if mv is None:
            return False, f"{t.metric} has no value yet"
        if mv.count <= self.seen:
            return False, f"no new value of {t.metric}"
        fired, best, wait, why = self._judge(float(mv.value))
        if commit:
            self.seen, self.best, self.wait = mv.count, best, wait
        return fired, why

    def evaluate(self, pt: Point) -> bool | None:
        return self._step(pt, commit=True)[0]

    def bound(self, event: str, last: Timestamp) -> Due:
        return ANY_TIME

    def explain(self, pt: Point) -> Explanation:
        value, why = self._step(pt, commit=False)
        return Explanation(repr(self.trigger), value, why)

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "seen": self.seen, "wait": self.wait}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # checked whole before any is taken (a crafted one: PartStateError by key)
        best = state_number(state, "best", none=True, real=True)
        seen = state_number(state, "seen", low=0, high=MAX_COUNT, whole=True)
        # a plateau's wait stays below its patience (it fires and restarts at it)
        patience = getattr(self.trigger, "patience", 1)
        wait = state_number(state, "wait", low=0, high=patience - 1, whole=True)
        self.best, self.seen, self.wait = (None if best is None else float(best)), seen, wait


class _ImprovedNode(_MetricNode):
    def _judge(self, value: float) -> tuple[bool, float | None, int, str]:
        t = self.trigger
        new = better(value, self.best, t.mode, t.min_delta)
        best = value if new else self.best
        return new, best, 0, f"{t.metric}={value:g}, best before {_show(self.best)}"


class _PlateauNode(_MetricNode):
    trigger: Plateau

    def _judge(self, value: float) -> tuple[bool, float | None, int, str]:
        t = self.trigger
        best: float | None
        if better(value, self.best, t.mode, t.min_delta):
            best, wait = value, 0
        else:
            best, wait = self.best, self.wait + 1
        fired = wait >= t.patience
        why = f"{t.metric}={value:g}, {wait}/{t.patience} values without a new best"
        return fired, best, 0 if fired else wait, why


Improved._node = _ImprovedNode
Plateau._node = _PlateauNode


def _show(best: float | None) -> str:
    return "none" if best is None else f"{best:g}"


def improved(metric: str, mode: Mode = "min", min_delta: float = 0.0) -> Improved:
    """Fire when ``metric`` reaches a new best (``mode`` "min" or "max")."""
    return Improved(metric, mode, min_delta)


def plateau(metric: str, patience: int, mode: Mode = "min", min_delta: float = 0.0) -> Plateau:
    """Fire after ``patience`` new values of ``metric`` without a new best."""
    return Plateau(metric, patience, mode, min_delta)
