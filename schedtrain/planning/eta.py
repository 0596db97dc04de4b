"""A running run's ETA: the steps left and the planned firings still to come, at measured costs.

``PlannedFirings(log)`` indexes a simulated run's firings once; ``to_come(callback,
event, step)`` counts, per callback, the planned firings after that firing (a few
binary searches, so a progress line may ask at each of its firings). ``eta`` applies the
cost model of ``plan --costs`` (``costs.time_left``) to them:

    ETA = steps left x seconds per quiet step + sum over callbacks of
          (planned firings still to come x that callback's mean seconds per firing)

Firings that depend on a metric or condition are counted as planned (the most the run
may spend); a run that stops early ends sooner.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping

from schedtrain.planning.costs import Costs, time_left
from schedtrain.schedule.firings import Firing

__all__ = ["PlannedFirings", "eta"]


class PlannedFirings:
    """A run's planned firings, indexed by callback.

    Args:
        log: the firings, in order (``simulate()``'s log, or an iterator of it).
        total_steps: the run's steps.
        cap: index at most this many firings; the callbacks' firings past the last
            indexed step are taken at the rate they fire before it.
    """

    def __init__(self, log: Iterable[Firing], total_steps: int, cap: int = 100_000) -> None:
        self.total_steps = total_steps
        self._positions: dict[str, list[int]] = {}
        self._at: dict[tuple[str, str, int], int] = {}
        self.truncated = False
        self.last_step = 0
        for i, f in enumerate(log):
            if i >= cap:
                self.truncated = True
                break
            self._positions.setdefault(f.callback, []).append(i)
            self._at.setdefault((f.callback, f.event, f.step), i)
            self.last_step = f.step

    def to_come(self, callback: str, event: str, step: int) -> dict[str, int] | None:
        """Per callback, the planned firings after ``callback``'s firing at ``event`` of
        ``step`` (``None``: the plan has no such firing)."""
        where = self._at.get((callback, event, step))
        if where is None:
            return None
        counts = {name: len(pos) - bisect.bisect_right(pos, where)
                  for name, pos in self._positions.items()}
        if self.truncated and self.last_step > 0:
            beyond = (self.total_steps - self.last_step) / self.last_step
            for name, pos in self._positions.items():
                counts[name] += round(len(pos) * beyond)
        return counts


def eta(steps_left: int, to_come: Mapping[str, int], costs: Costs) -> float:
    """Seconds left: ``steps_left`` quiet steps and the firings ``to_come``, at ``costs``."""
    return time_left(steps_left, to_come, costs)
