"""A simulated run retimed at a step: ``simulate(...).continue_with(new, at=step)``.

It predicts what a live retime (``schedtrain retime``, ``trainer.retimer.retime``) or a
resume with ``--schedule-change apply`` does: the old schedule up to the end of step
``at``, then the new one from that point, by the resume rules: the clock goes on where
it was (a periodic grid stays on the run's counters, an ``at`` point already passed
never fires), and a callback whose trigger is unchanged keeps its trigger's state while
a changed or new one starts afresh.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any, Final

from schedtrain.schedule.firings import Firing, FiringLog
from schedtrain.schedule.schedule import Schedule
from schedtrain.simulation.simclock import PH_EPOCH_END, PH_STEP

__all__ = ["AFTER", "SimulatedRun", "kept_triggers", "retimed", "to_resume_point"]

#: Where a resumed (or retimed) run continues: after that step's ``step_end`` or its
#: ``epoch_end``.
AFTER: Final = {"step_end": PH_STEP, "epoch_end": PH_EPOCH_END}


def to_resume_point(sim: Any, step: int, phase: str) -> None:
    """Move a ``Simulation``'s clock to where a checkpoint taken there resumes: the
    simulation jumps between firings, and a resumed table takes its clock's position as
    evaluated. (Typed ``Any``: this module sits below ``simulate``, which uses it.)"""
    sh, clock = sim.shape, sim.clock
    if not 1 <= step <= sh.total_steps:
        return
    epoch = sh.first_epoch_starting(step, after=False) - 1
    if phase == "epoch_end" and sh.start(epoch + 1) == step:
        if clock.key < (step, PH_EPOCH_END, 0):
            clock.to_epoch_end(epoch)
    elif clock.key < (step, PH_STEP, 0):
        clock.to_step_end(step)


def kept_triggers(old: Schedule, new: Schedule) -> tuple[str, ...]:
    """The callbacks whose trigger state carries over: in both, with equal triggers."""
    a, b = old.triggers(), new.triggers()
    return tuple(n for n in b if n in a and a[n] == b[n])


def retimed(make: Callable[[Schedule], Any], old: Schedule, new: Schedule, *, at: int,
            phase: str = "step_end",
            kept: Iterable[str] | None = None) -> tuple[tuple[Firing, ...], Any, Any]:
    """A run of ``old`` retimed to ``new`` after step ``at`` (its ``step_end``, or its
    ``epoch_end`` with ``phase="epoch_end"``), by the resume rules: ``old``'s firings up
    to there, then two simulations at that point to iterate on, ``old``'s own and
    ``new``'s (``make``: a fresh ``Simulation`` of a schedule over the run). ``kept``:
    the callbacks whose trigger state carries over (default: ``kept_triggers``).
    ``SimulatedRun.continue_with`` and ``planning.changes.continue_with`` both are this."""
    if phase not in AFTER:
        raise ValueError(f"phase must be one of {sorted(AFTER)}, got {phase!r}")
    first = make(old)
    before = tuple(first.iter_firings((at, AFTER[phase], 10**9)))
    to_resume_point(first, at, phase)
    state: dict[str, Any] = copy.deepcopy(first.state_dict())
    keep = set(kept_triggers(old, new) if kept is None else kept)
    state["table"] = {"triggers": {n: s for n, s in state["table"]["triggers"].items()
                                   if n in keep}}
    second = make(new)
    second.load_state_dict(state)
    return before, first, second


class SimulatedRun(FiringLog):
    """``simulate()``'s firings, which also know how to continue with another schedule.

    Args:
        firings: the run's firings.
        schedule: the schedule simulated.
        make: a fresh ``Simulation`` of a schedule over the same run (shape, metrics...).
    """

    def __init__(self, firings: Iterable[Firing], schedule: Schedule,
                 make: Callable[[Schedule], Any]) -> None:
        super().__init__(firings)
        self._schedule, self._make = schedule, make

    def continue_with(self, new: Schedule, *, at: int, phase: str = "step_end",
                      kept: Iterable[str] | None = None) -> FiringLog:
        """The run retimed to ``new`` after step ``at`` (its ``step_end``, or its
        ``epoch_end`` with ``phase="epoch_end"``): this schedule's firings up to there,
        then ``new``'s. ``kept``: the callbacks whose trigger state carries over
        (default: those whose trigger is unchanged)."""
        if isinstance(at, bool) or not isinstance(at, int) or at < 0:
            raise ValueError(f"at must be a step (a whole number >= 0), got {at!r}")
        before, _, second = retimed(self._make, self._schedule, new, at=at, phase=phase,
                                    kept=kept)
        return FiringLog((*before, *second.iter_firings()))
