"""Building a run's parts: each from the options and the parts it depends on."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from schedtrain.callbacks.base import (
    STOP_PLACES_BEYOND_TRIGGER,
    Callback,
    overrides,
    stops_alone,
)
from schedtrain.clock import LoopClock
from schedtrain.distributed.agreement import Agreement, Alone
from schedtrain.distributed.comm import Comm
from schedtrain.schedule.table import TriggerTable
from schedtrain.training.losses import LossKeeper
from schedtrain.training.preempt import Guard

__all__ = ["make_agreement"]


def make_agreement(comm: Comm | None, *, callbacks: Mapping[str, Callback],
                   reduce: Mapping[str, str], clock: LoopClock, guard: Guard,
                   on_preempt: Callable[[str], None], table: TriggerTable,
                   losses: LossKeeper, max_steps: int | None) -> Alone:
    """What the loop and the dispatcher settle with other ranks (``Alone`` without any)."""
    if comm is None:
        return Alone(clock=clock, guard=guard, on_preempt=on_preempt)
    # A stop flag is agreed after an event only where a callback that may stop alone ran
    # (or could have asked outside its trigger): decided from the classes, the same on
    # every rank.
    alone = {n: stops_alone(cb) for n, cb in callbacks.items()}
    hooks_alone = any(alone[n] and any(overrides(cb, h) for h in STOP_PLACES_BEYOND_TRIGGER)
                      for n, cb in callbacks.items())
    return Agreement(clock=clock, guard=guard, on_preempt=on_preempt, comm=comm, table=table,
                     losses=losses, max_steps=max_steps, alone=alone, hooks_alone=hooks_alone,
                     reduce_ops=reduce)
