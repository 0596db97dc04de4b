"""schedtrain: training callbacks say what to do; a declarative trigger algebra says when.

The core (time, clock, triggers, table, schedule, simulation, testing) never imports torch.
"""

from schedtrain.clock import Clock as Clock
from schedtrain.clock import LoopClock as LoopClock
from schedtrain.errors import ScheduleError as ScheduleError
from schedtrain.errors import ScheduleWarning as ScheduleWarning
from schedtrain.errors import SpecError as SpecError
from schedtrain.errors import StopTraining as StopTraining
from schedtrain.schedule import Schedule as Schedule
from schedtrain.schedule import Scheduled as Scheduled
from schedtrain.simulation import Firing as Firing
from schedtrain.simulation import FiringLog as FiringLog
from schedtrain.simulation import SimClock as SimClock
from schedtrain.simulation import next_firing as next_firing
from schedtrain.simulation import simulate as simulate
from schedtrain.table import TriggerTable as TriggerTable
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

__version__ = "0.1.0"

__all__ = [
    "Clock", "Firing", "FiringLog", "LoopClock", "Schedule", "ScheduleError", "ScheduleWarning",
    "Scheduled", "SimClock", "SpecError", "StopTraining", "Time", "Timestamp", "Trigger",
    "TriggerTable", "Unit", "all_of", "any_of", "at", "every", "improved", "next_firing",
    "not_", "on", "plateau", "simulate", "when", "window",
]  # fmt: skip
