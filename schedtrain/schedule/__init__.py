"""The schedule and what it compiles to.

A ``Schedule`` names callbacks and says when each runs (``schedule``); its static checks
(``analysis``) run once, and it compiles into a ``TriggerTable`` (``table``) that keeps
each callback's next due point in a ``DueBook`` (``dues``), so a step on which nothing
can fire costs one comparison. ``firings`` holds the record of what fired, and
``tensorpack`` tensorpack's scheduling wrappers (``PeriodicTrigger``...) as sugar over
``Scheduled``. Nothing here imports torch.
"""

from schedtrain.schedule.firings import Firing as Firing
from schedtrain.schedule.firings import FiringLog as FiringLog
from schedtrain.schedule.schedule import HookGate as HookGate
from schedtrain.schedule.schedule import Schedule as Schedule
from schedtrain.schedule.schedule import Scheduled as Scheduled
from schedtrain.schedule.table import Runner as Runner
from schedtrain.schedule.table import TableExplanation as TableExplanation
from schedtrain.schedule.table import TriggerTable as TriggerTable
from schedtrain.schedule.tensorpack import EnableCallbackIf as EnableCallbackIf
from schedtrain.schedule.tensorpack import PeriodicCallback as PeriodicCallback
from schedtrain.schedule.tensorpack import PeriodicTrigger as PeriodicTrigger

__all__ = [
    "EnableCallbackIf", "Firing", "FiringLog", "HookGate", "PeriodicCallback",
    "PeriodicTrigger", "Runner", "Schedule", "Scheduled", "TableExplanation", "TriggerTable",
]  # fmt: skip
