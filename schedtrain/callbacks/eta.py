"""The time a running run has left, for the progress line (``ProgressBar``).

``RunEta`` listens to this process's firings as a metric sink (each firing's ``duration``,
measured by the dispatcher once any sink listens: nothing is added to a step where
nothing fires) and simulates the run's schedule once, at its first estimate, to know the
planned firings still to come. Its estimate is ``schedtrain.planning.eta``'s: the steps
left at the measured seconds per quiet step, plus each callback's planned firings still
to come at its mean measured seconds per firing (a callback that has not fired yet in
this process counts 0 s).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from schedtrain.callbacks.base import Callback
from schedtrain.planning.costs import Costs
from schedtrain.planning.eta import PlannedFirings, eta
from schedtrain.simulation.simclock import RunShape
from schedtrain.simulation.simulate import Simulation
from schedtrain.time import Timestamp

__all__ = ["RunEta"]


class RunEta:
    """Measures one process's firings and estimates the time its run has left."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._before = 0.0  # seconds of the firings at steps before ``_step``
        self._at_step = 0.0  # seconds of the firings at ``_step``
        self._step = -1
        self._start: tuple[int, float] = (0, 0.0)  # (step, seconds) when this process began
        self._plan: PlannedFirings | None = None
        self._planned = False

    # -- a metric sink ----------------------------------------------------------------------
    def scalars(self, records: Sequence[Any]) -> None:
        """Values are not its business."""

    def firing(self, callback: str, event: str, ts: Timestamp, wall: float) -> None:
        """Never called: the store calls ``firing_timed``."""

    def firing_timed(self, callback: str, event: str, ts: Timestamp, wall: float,
                     duration: float) -> None:
        """Add one firing's measured seconds."""
        self._sums[callback] = self._sums.get(callback, 0.0) + duration
        self._counts[callback] = self._counts.get(callback, 0) + 1
        if ts.step != self._step:
            self._before += self._at_step
            self._at_step, self._step = 0.0, ts.step
        self._at_step += duration

    def close(self) -> None:
        """Nothing to release."""

    # -- the estimate ------------------------------------------------------------------------
    def start(self, cb: Callback) -> None:
        """Listen to the firings of ``cb``'s trainer from now (its ``before_train``)."""
        self._start = (cb.now.step, cb.now.seconds)
        cb.metrics.sinks.append(self)

    def stop(self, cb: Callback) -> None:
        """Stop listening (its ``after_train``)."""
        if self in cb.metrics.sinks:
            cb.metrics.sinks.remove(self)

    def seconds_left(self, cb: Callback) -> float | None:
        """The ETA at ``cb``'s current firing, or ``None`` before the first step of this
        process or when the run's length is not known."""
        now, (step0, seconds0) = cb.now, self._start
        done = now.step - step0
        plan = self._planned_firings(cb)
        # The firing now running (this callback's): its event places it in the plan.
        recent = getattr(getattr(cb.trainer, "dispatch", None), "firings", None)
        last = recent[-1] if recent else None
        if done <= 0 or plan is None or last is None or last.callback != cb.name:
            return None
        to_come = plan.to_come(last.callback, last.event, now.step)
        if to_come is None:
            return None
        fired = self._before + (self._at_step if self._step < now.step else 0.0)
        per_step = max(now.seconds - seconds0 - fired, 0.0) / done
        means = {n: (self._sums[n] / c,) for n, c in self._counts.items()}
        return eta(max(plan.total_steps - now.step, 0), to_come,
                   Costs(means, per_step, done))

    def _planned_firings(self, cb: Callback) -> PlannedFirings | None:
        """The run's planned firings, simulated once (``None``: its length is unknown)."""
        if not self._planned:
            self._planned = True
            # Only schedtrain's Trainer knows its schedule and length (a host's loop,
            # Lightning's or the HF Trainer's, has no config: it shows no ETA).
            trainer = cb.trainer
            schedule, config = trainer.schedule, trainer.config
            per_epoch = trainer.steps_in_epoch
            if schedule is None or config is None:
                return None
            epochs, cap = config.max_epochs, config.max_steps
            if epochs is None and cap is not None and per_epoch:
                epochs = math.ceil(cap / per_epoch)
            if per_epoch and epochs:
                shape = RunShape.build(epochs=epochs, steps_per_epoch=per_epoch,
                                       max_steps=cap)
                self._plan = PlannedFirings(Simulation(schedule, shape)
                                            .iter_firings(), shape.total_steps)
        return self._plan
