"""Planning a spec before it runs: its firings over the run's shape, and how to show them.

``plan`` simulates a loaded spec (``plan_spec`` -> ``Plan``); ``render`` turns a plan into
a table, JSON or a PNG timeline. ``schedtrain plan`` is a thin shell over these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from schedtrain.lazy import LazyNames

#: Public name -> the module that defines it: loaded on first use (PEP 562), so a module
#: of this package that a run reads (``planning.requests``) does not import the planner.
_EXPORTS: Final = {
    "MAX_ALWAYS_STEPS": "schedtrain.planning.plan",
    "MAX_FIRINGS": "schedtrain.planning.plan",
    "Plan": "schedtrain.planning.plan",
    "PlanError": "schedtrain.planning.plan",
    "plan_spec": "schedtrain.planning.plan",
}  # fmt: skip

__all__ = ["MAX_ALWAYS_STEPS", "MAX_FIRINGS", "Plan", "PlanError", "plan_spec"]


_NAMES = LazyNames(__name__, globals(), _EXPORTS)
__getattr__ = _NAMES.load
__dir__ = _NAMES.names


if TYPE_CHECKING:  # what static tools see; at run time the names load on first use
    from schedtrain.planning.plan import MAX_ALWAYS_STEPS as MAX_ALWAYS_STEPS
    from schedtrain.planning.plan import MAX_FIRINGS as MAX_FIRINGS
    from schedtrain.planning.plan import Plan as Plan
    from schedtrain.planning.plan import PlanError as PlanError
    from schedtrain.planning.plan import plan_spec as plan_spec
