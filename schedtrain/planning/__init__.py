"""Planning a spec before it runs: its firings over the run's shape, and how to show them.

``plan`` simulates a loaded spec (``plan_spec`` -> ``Plan``); ``render`` turns a plan into
a table, JSON or a PNG timeline. ``schedtrain plan`` is a thin shell over these.
"""

from schedtrain.planning.plan import MAX_ALWAYS_STEPS as MAX_ALWAYS_STEPS
from schedtrain.planning.plan import MAX_FIRINGS as MAX_FIRINGS
from schedtrain.planning.plan import Plan as Plan
from schedtrain.planning.plan import PlanError as PlanError
from schedtrain.planning.plan import plan_spec as plan_spec

__all__ = ["MAX_ALWAYS_STEPS", "MAX_FIRINGS", "Plan", "PlanError", "plan_spec"]
