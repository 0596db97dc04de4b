"""The trigger algebra: when callbacks run.

Build triggers with the factories and compose them with ``&``, ``|`` and ``~``::

    every(500, "steps") & ~at("1000 steps") | on("train_end")
"""

from schedtrain.events import DEFAULT_EVENTS as DEFAULT_EVENTS
from schedtrain.events import EventSet as EventSet
from schedtrain.triggers.auto import AutoEvery as AutoEvery
from schedtrain.triggers.auto import auto_every as auto_every
from schedtrain.triggers.base import MAX_DEPTH as MAX_DEPTH
from schedtrain.triggers.base import AllOf as AllOf
from schedtrain.triggers.base import AnyOf as AnyOf
from schedtrain.triggers.base import Not as Not
from schedtrain.triggers.base import Trigger as Trigger
from schedtrain.triggers.base import all_of as all_of
from schedtrain.triggers.base import any_of as any_of
from schedtrain.triggers.base import not_ as not_
from schedtrain.triggers.conditions import When as When
from schedtrain.triggers.conditions import parse_condition as parse_condition
from schedtrain.triggers.conditions import when as when
from schedtrain.triggers.deadline import BeforeDeadline as BeforeDeadline
from schedtrain.triggers.deadline import before_deadline as before_deadline
from schedtrain.triggers.lifecycle import On as On
from schedtrain.triggers.lifecycle import on as on
from schedtrain.triggers.metric import Improved as Improved
from schedtrain.triggers.metric import Plateau as Plateau
from schedtrain.triggers.metric import improved as improved
from schedtrain.triggers.metric import plateau as plateau
from schedtrain.triggers.periodic import Every as Every
from schedtrain.triggers.periodic import every as every
from schedtrain.triggers.points import At as At
from schedtrain.triggers.points import at as at
from schedtrain.triggers.protocol import ANY_TIME as ANY_TIME
from schedtrain.triggers.protocol import NEVER as NEVER
from schedtrain.triggers.protocol import Due as Due
from schedtrain.triggers.protocol import Explanation as Explanation
from schedtrain.triggers.protocol import MetricsView as MetricsView
from schedtrain.triggers.protocol import MetricValue as MetricValue
from schedtrain.triggers.protocol import Point as Point
from schedtrain.triggers.protocol import due_on as due_on
from schedtrain.triggers.windows import Window as Window
from schedtrain.triggers.windows import window as window

__all__ = [
    "ANY_TIME",
    "DEFAULT_EVENTS",
    "MAX_DEPTH",
    "NEVER",
    "AllOf",
    "AnyOf",
    "At",
    "AutoEvery",
    "BeforeDeadline",
    "Due",
    "EventSet",
    "Every",
    "Explanation",
    "Improved",
    "MetricValue",
    "MetricsView",
    "Not",
    "On",
    "Plateau",
    "Point",
    "Trigger",
    "When",
    "Window",
    "all_of",
    "any_of",
    "at",
    "auto_every",
    "before_deadline",
    "due_on",
    "every",
    "improved",
    "not_",
    "on",
    "parse_condition",
    "plateau",
    "when",
    "window",
]  # fmt: skip
