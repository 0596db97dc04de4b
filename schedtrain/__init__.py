"""schedtrain: training callbacks say what to do; a declarative trigger algebra says when.

The core (time, clock, triggers, table, schedule, simulation, testing) never imports
torch. Names below are loaded on first use, so ``import schedtrain`` itself is cheap;
``from schedtrain import every, Schedule`` imports just what it names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

from schedtrain import compat as _compat

__version__ = "0.1.0"

_compat.install()  # moved import paths keep working, with a warning (schedtrain.compat)

#: Public name -> the module that defines it.
_EXPORTS: Final = {
    "Clock": "schedtrain.clock", "LoopClock": "schedtrain.clock",
    "PortingWarning": "schedtrain.errors",
    "ScheduleError": "schedtrain.errors", "ScheduleWarning": "schedtrain.errors",
    "SpecError": "schedtrain.errors", "StopTraining": "schedtrain.errors",
    "Schedule": "schedtrain.schedule", "Scheduled": "schedtrain.schedule",
    "Firing": "schedtrain.schedule", "FiringLog": "schedtrain.schedule",
    "SimClock": "schedtrain.simulation", "next_firing": "schedtrain.simulation",
    "simulate": "schedtrain.simulation", "TriggerTable": "schedtrain.schedule",
    "Time": "schedtrain.time", "Timestamp": "schedtrain.time", "Unit": "schedtrain.time",
    "Trigger": "schedtrain.triggers", "all_of": "schedtrain.triggers",
    "any_of": "schedtrain.triggers", "at": "schedtrain.triggers",
    "every": "schedtrain.triggers", "improved": "schedtrain.triggers",
    "not_": "schedtrain.triggers", "on": "schedtrain.triggers",
    "plateau": "schedtrain.triggers", "when": "schedtrain.triggers",
    "window": "schedtrain.triggers",
}  # fmt: skip

__all__ = [
    "Clock", "Firing", "FiringLog", "LoopClock", "PortingWarning", "Schedule", "ScheduleError",
    "ScheduleWarning",
    "Scheduled", "SimClock", "SpecError", "StopTraining", "Time", "Timestamp", "Trigger",
    "TriggerTable", "Unit", "all_of", "any_of", "at", "every", "improved", "next_firing",
    "not_", "on", "plateau", "simulate", "when", "window",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'schedtrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:  # what static tools see; at run time the names load on first use
    from schedtrain.clock import Clock as Clock
    from schedtrain.clock import LoopClock as LoopClock
    from schedtrain.errors import PortingWarning as PortingWarning
    from schedtrain.errors import ScheduleError as ScheduleError
    from schedtrain.errors import ScheduleWarning as ScheduleWarning
    from schedtrain.errors import SpecError as SpecError
    from schedtrain.errors import StopTraining as StopTraining
    from schedtrain.schedule import Firing as Firing
    from schedtrain.schedule import FiringLog as FiringLog
    from schedtrain.schedule import Schedule as Schedule
    from schedtrain.schedule import Scheduled as Scheduled
    from schedtrain.schedule import TriggerTable as TriggerTable
    from schedtrain.simulation import SimClock as SimClock
    from schedtrain.simulation import next_firing as next_firing
    from schedtrain.simulation import simulate as simulate
    from schedtrain.time import Time as Time
    from schedtrain.time import Timestamp as Timestamp
    from schedtrain.time import Unit as Unit
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
