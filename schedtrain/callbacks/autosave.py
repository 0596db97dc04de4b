"""``AutoPacing``: what a saver whose trigger is ``every("auto")`` measures and decides.

A save's cost ``C`` is what it takes from training: the time from the firing to the
checkpoint's landing (committed), less the steps trained meanwhile at the step time
measured outside saves. In ``"sync"`` mode no step runs meanwhile, so it is the loop's
stall; in ``"async"`` mode it is the stall for the host copy plus what the background
write slowed the steps it overlapped by. The step time is measured from the previous
landing (or the start of training) to this firing. Each landing feeds the trigger's
``Decider`` (Young/Daly), whose interval places the firing after next; each decision
is put as the metrics ``checkpoint/interval`` (steps) and ``checkpoint/cost`` (seconds),
lines of ``events.jsonl``.
"""

from __future__ import annotations

import time
from typing import Any

from schedtrain.spec.failures import mtbf_seconds, overhead_fraction
from schedtrain.triggers import Trigger
from schedtrain.triggers.auto import AutoEvery, Decider

__all__ = ["AutoPacing", "auto_deciders"]


def auto_deciders(trigger: Trigger) -> list[Decider]:
    """The deciders of the ``AutoEvery`` parts of ``trigger``."""
    found = [trigger.decider] if isinstance(trigger, AutoEvery) else []
    for child in trigger.children():
        found.extend(auto_deciders(child))
    return found


class AutoPacing:
    """Measures a saver's saves and feeds its ``every("auto")`` deciders."""

    def __init__(self, deciders: list[Decider]) -> None:
        self.deciders = deciders
        self._since: tuple[float, int] | None = None  # the last landing (or the start)
        self._fired: tuple[float, int] | None = None  # the firing in flight

    @classmethod
    def of(cls, callback: Any) -> AutoPacing | None:
        """For ``callback`` (a saver) when its trigger has ``every("auto")``, configured
        from its trainer's ``[run] mtbf`` and ``max_checkpoint_overhead``; else ``None``.

        Raises:
            ValueError: the run declares no failure rate, or runs on several processes.
        """
        trainer = callback.trainer
        schedule = getattr(trainer, "schedule", None)
        name = callback.name
        if schedule is None or name is None or name not in schedule.names:
            return None
        deciders = auto_deciders(schedule[name])
        if not deciders:
            return None
        config = getattr(trainer, "config", None)
        mtbf = mtbf_seconds(config)
        if mtbf is None:
            raise ValueError(f"callback {name!r}: every('auto') picks the interval from the "
                             "failure rate: give the run mtbf ('6 h') or failure_rate")
        if getattr(trainer, "world_size", 1) > 1:
            raise ValueError(f"callback {name!r}: every('auto') runs on one process only "
                             "(each rank would measure its own interval)")
        for d in deciders:
            d.configure(mtbf, overhead_fraction(config))
        return cls(deciders)

    def started(self, step: int) -> None:
        """Training starts (or resumes) at ``step``: step times count from now."""
        self._since = (time.monotonic(), step)

    def fired(self, step: int) -> None:
        """The saver fired at ``step``: its save is asked for now."""
        self._fired = (time.monotonic(), step)

    def landed(self, step: int) -> list[dict[str, Any]]:
        """The save landed with the clock at ``step``: the decisions it leads to."""
        now = time.monotonic()
        fired, since = self._fired, self._since
        self._fired, self._since = None, (now, step)
        if fired is None or since is None or fired[1] <= since[1]:
            return []  # no step between the last landing and this firing to time
        step_s = (fired[0] - since[0]) / (fired[1] - since[1])
        cost = (now - fired[0]) - (step - fired[1]) * step_s
        return [d.decide(fired[1], cost, step_s) for d in self.deciders]
