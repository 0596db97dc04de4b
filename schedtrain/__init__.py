"""schedtrain: training callbacks say what to do; a declarative trigger algebra says when.

The core (time, clock, triggers, table, schedule, simulation, testing) never imports
torch. Names below are loaded on first use, so ``import schedtrain`` itself is cheap;
``from schedtrain import every, Schedule`` imports just what it names.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any, Final

from schedtrain import compat as _compat
from schedtrain._version import __version__ as __version__
from schedtrain.lazy import LazyNames

_compat.install()  # moved import paths keep working, with a warning (schedtrain.compat)

#: Public name -> the module that defines it. ``Trainer``, ``Task`` and ``Callback``
#: need torch: they import it when first named, never at ``import schedtrain``.
_EXPORTS: Final = {
    "Clock": "schedtrain.clock", "Error": "schedtrain.errors",
    "PortingWarning": "schedtrain.errors",
    "ScheduleError": "schedtrain.errors", "ScheduleWarning": "schedtrain.errors",
    "SpecError": "schedtrain.errors", "StopTraining": "schedtrain.errors",
    "Schedule": "schedtrain.schedule", "Scheduled": "schedtrain.schedule",
    "Firing": "schedtrain.schedule", "FiringLog": "schedtrain.schedule",
    "next_firing": "schedtrain.simulation", "simulate": "schedtrain.simulation",
    "Time": "schedtrain.time", "Timestamp": "schedtrain.time", "Unit": "schedtrain.time",
    "Trigger": "schedtrain.triggers", "all_of": "schedtrain.triggers",
    "any_of": "schedtrain.triggers", "at": "schedtrain.triggers",
    "every": "schedtrain.triggers", "improved": "schedtrain.triggers",
    "not_": "schedtrain.triggers", "on": "schedtrain.triggers",
    "plateau": "schedtrain.triggers", "when": "schedtrain.triggers",
    "window": "schedtrain.triggers",
    "Trainer": "schedtrain.training", "Task": "schedtrain.training",
    "Callback": "schedtrain.callbacks",
}  # fmt: skip

#: Internals that left the top level: still found there for one minor version, with a
#: warning naming where they live now.
_MOVED_OUT: Final = {
    "LoopClock": "schedtrain.clock", "SimClock": "schedtrain.simulation",
    "TriggerTable": "schedtrain.schedule",
}

__all__ = [
    "Callback", "Clock", "Error", "Firing", "FiringLog", "PortingWarning", "Schedule",
    "ScheduleError", "ScheduleWarning", "Scheduled", "SpecError", "StopTraining", "Task",
    "Time", "Timestamp", "Trainer", "Trigger", "Unit", "all_of", "any_of", "at", "every",
    "improved", "next_firing", "not_", "on", "plateau", "simulate", "when", "window",
]  # fmt: skip


def _moved_out(name: str) -> Any:
    moved = _MOVED_OUT.get(name)
    if moved is None:
        raise AttributeError(f"module 'schedtrain' has no attribute {name!r}")
    warnings.warn(f"schedtrain.{name} moved to {moved}.{name}; import it from there (the "
                  f"top-level name stops working in {_compat.REMOVED_IN})",
                  DeprecationWarning, stacklevel=3)
    return getattr(importlib.import_module(moved), name)  # not cached: warns each time


_NAMES = LazyNames(__name__, globals(), _EXPORTS, other=_moved_out)
__getattr__ = _NAMES.load
__dir__ = _NAMES.names


if TYPE_CHECKING:  # what static tools see; at run time the names load on first use
    from schedtrain.callbacks import Callback as Callback
    from schedtrain.clock import Clock as Clock
    from schedtrain.errors import Error as Error
    from schedtrain.errors import PortingWarning as PortingWarning
    from schedtrain.errors import ScheduleError as ScheduleError
    from schedtrain.errors import ScheduleWarning as ScheduleWarning
    from schedtrain.errors import SpecError as SpecError
    from schedtrain.errors import StopTraining as StopTraining
    from schedtrain.schedule import Firing as Firing
    from schedtrain.schedule import FiringLog as FiringLog
    from schedtrain.schedule import Schedule as Schedule
    from schedtrain.schedule import Scheduled as Scheduled
    from schedtrain.simulation import next_firing as next_firing
    from schedtrain.simulation import simulate as simulate
    from schedtrain.time import Time as Time
    from schedtrain.time import Timestamp as Timestamp
    from schedtrain.time import Unit as Unit
    from schedtrain.training import Task as Task
    from schedtrain.training import Trainer as Trainer
    from schedtrain.triggers import Trigger as Trigger
    from schedtrain.triggers import all_of as all_of
    from schedtrain.triggers import any_of as any_of
    from schedtrain.triggers import at as at
    from schedtrain.triggers import every as every
    from schedtrain.triggers import improved as improved
    from schedtrain.triggers import not_ as not_
    from schedtrain.triggers import on as on
    from schedtrain.triggers import plateau as plateau
    from schedtrain.triggers import when as when
    from schedtrain.triggers import window as window
