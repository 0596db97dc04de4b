"""``ScheduledHyperParamSetter``: set an optimizer hyper-parameter from a schedule.

tensorpack semantics: ``schedule=[(point, value), ...]`` with points in epochs
(or steps with ``step_based=True``); the value of a point applies once that many
epochs (steps) have completed, so ``(0, 0.1)`` is the value from the start and
``(3, 0.01)`` the value from the fourth epoch on. Before the first point the
optimizer's own value is left alone. ``interp`` says what happens between two
points: ``"step"`` (the default) keeps the earlier point's value, ``"linear"`` and
``"cosine"`` (half a cosine wave, flat at both ends) go from one value to the next;
every listed point gets its value exactly, and after the last point the last value holds.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from typing import Any, ClassVar

from schedtrain.callbacks.base import Callback
from schedtrain.callbacks.params import param_problem
from schedtrain.triggers import Trigger, any_of, at, every, on

__all__ = ["INTERPOLATIONS", "ScheduledHyperParamSetter"]

#: How a value goes from one point to the next.
INTERPOLATIONS = ("step", "linear", "cosine")


class ScheduledHyperParamSetter(Callback):
    """Set ``param`` (e.g. ``"lr"``) in every optimizer param group from ``schedule``.

    Default trigger: at train start and every epoch (epoch-based); at train start and
    at each listed step (step-based, piecewise); at train start and every step
    (step-based, interpolated).

    Args:
        param: the param-group key (``"lr"``, ``"momentum"``, ``"weight_decay"``...).
        schedule: ``[(point, value), ...]`` with increasing points.
        interp: ``"step"`` (piecewise constant; ``None`` means the same), ``"linear"``
            or ``"cosine"``.
        step_based: points are steps rather than epochs.
    """

    may_stop_alone: ClassVar[bool] = False

    def __init__(self, param: str, schedule: Sequence[Sequence[float]],
                 interp: str | None = "step", step_based: bool = False) -> None:
        interp = interp or "step"
        if interp not in INTERPOLATIONS:
            raise ValueError(f"`interp` must be one of {', '.join(map(repr, INTERPOLATIONS))}, "
                             f"got {interp!r}")
        points: list[tuple[float, float]] = []
        for i, item in enumerate(schedule):
            try:
                p, v = item
                points.append((float(p), float(v)))
            except (TypeError, ValueError):
                raise ValueError(f"`schedule[{i}]` must be a (point, value) pair, "
                                 f"got {item!r}") from None
        if not points:
            raise ValueError("`schedule` must have at least one (point, value) pair")
        if any(b[0] <= a[0] for a, b in itertools.pairwise(points)):
            raise ValueError(f"`schedule` points must increase, got {[p for p, _ in points]}")
        if any(p < 0 for p, _ in points):
            raise ValueError("`schedule` points must be >= 0")
        self.param = param
        self.points = points
        self.interp = interp
        self.step_based = step_based
        trigger: Trigger
        if not step_based:
            trigger = any_of(on("train_start"), every("1 epoch"))
        elif interp == "step":
            steps = [int(p) for p, _ in points if p >= 1]
            trigger = (any_of(on("train_start"), at(*[f"{s} steps" for s in steps]))
                       if steps else on("train_start"))
        else:
            trigger = any_of(on("train_start"), every("1 step"))
        self.default_trigger = trigger  # type: ignore[misc]

    def value_at(self, point: float) -> float | None:
        """The value for ``point`` completed epochs (steps), or ``None`` before the first."""
        xs = [p for p, _ in self.points]
        i = bisect.bisect_right(xs, point) - 1
        if i < 0:
            return None
        if self.interp == "step" or i == len(xs) - 1:
            return self.points[i][1]
        (x0, y0), (x1, y1) = self.points[i], self.points[i + 1]
        frac = (point - x0) / (x1 - x0)
        if self.interp == "cosine":
            frac = (1 - math.cos(math.pi * frac)) / 2
        return y0 + (y1 - y0) * frac

    def optimizer_problem(self, optimizer: Any) -> str | None:
        """Why this setter cannot set ``param`` in ``optimizer`` (``check`` asks)."""
        return param_problem(optimizer, self.param)

    def _setup(self) -> None:
        problem = self.optimizer_problem(self.optimizer)
        if problem is not None:
            raise ValueError(f"callback {self.name!r} (ScheduledHyperParamSetter): "
                             f"`param`: {problem}")

    def _trigger(self) -> None:
        now = self.now
        value = self.value_at(now.step if self.step_based else now.epoch)
        if value is None:
            return
        for group in self.optimizer.param_groups:
            group[self.param] = value

    def state_dict(self) -> dict[str, Any]:
        return {}
