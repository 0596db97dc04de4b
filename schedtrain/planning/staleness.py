"""Callbacks that judge a metric at firings where it has no new value.

A saver ranks the weights it saves by ``monitor`` (``MinSaver``, ``MaxSaver``,
``TopKSaver``); ``EarlyStopping`` with ``patience`` counts each firing as a check.
Fired at a step where nothing put a new value of that metric, the value is older than
the weights: the savers save nothing ranked then (they refuse to), and the stopper
counts a check that saw nothing new. The schedule is simulated over the run's shape
(as ``plan`` does) and each such firing is found: ``check`` and ``train`` warn.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from schedtrain.planning.plan import PlanError, plan_spec
from schedtrain.spec import Spec
from schedtrain.spec.direction import callback_direction
from schedtrain.spec.metrics import BUILTIN_PRODUCES, TRAINER_METRICS

__all__ = ["judged_metrics", "stale_notes", "static_producers_by_callback"]

#: How many stale firings a warning lists before "...".
SHOWN = 3


def judged_metrics(spec: Spec) -> dict[str, str]:
    """Callback name -> the metric it judges at each of its firings."""
    out = {}
    for name, cb in spec.callbacks.items():
        keeper = callback_direction(cb.type, cb.args)
        if keeper is None or (cb.type == "EarlyStopping" and "patience" not in cb.args):
            continue  # EarlyStopping without patience stops on its (metric) trigger
        out[name] = keeper[1]
    return out


def static_producers_by_callback(spec: Spec) -> dict[str, tuple[str, ...]]:
    """Callback name -> what it produces, for the built-ins known without importing."""
    return {name: BUILTIN_PRODUCES[cb.type](cb.args) for name, cb in spec.callbacks.items()
            if cb.type is not None and cb.type in BUILTIN_PRODUCES}


def stale_notes(spec: Spec, produces: Mapping[str, Collection[str]]) -> list[str]:
    """A warning for each callback that judges a metric at firings where it is not new.

    Args:
        spec: a spec whose ``[clock]`` gives the run's shape (without one: no warning).
        produces: callback name -> the metrics it puts, for the callbacks known.
    """
    judged = {n: m for n, m in judged_metrics(spec).items() if m not in TRAINER_METRICS
              and any(m in p for p in produces.values())}  # else: nothing known puts it
    if not judged:
        return []
    try:
        plan = plan_spec(spec)
    except (PlanError, ValueError):
        return []  # no shape, or one that cannot be simulated: nothing to say
    new_at: dict[str, int] = {}  # metric -> the step a producer last fired at
    stale: dict[str, list[str]] = {n: [] for n in judged}
    fired: dict[str, int] = dict.fromkeys(judged, 0)
    for f in plan.log:
        for metric in produces.get(f.callback, ()):
            new_at[metric] = f.step
        if f.callback in judged:
            fired[f.callback] += 1
            if new_at.get(judged[f.callback]) != f.step:
                where = (f"epoch {f.epoch}" if f.event == "epoch_end" else
                         f"step {f.step}" if f.event == "step_end" else f"{f.event}@{f.step}")
                stale[f.callback].append(where)
    notes = []
    for name, places in stale.items():
        if not places:
            continue
        metric, kind = judged[name], spec.callbacks[name].type
        makers = [n for n, p in produces.items() if metric in p]
        shown = ", ".join(places[:SHOWN]) + (", ..." if len(places) > SHOWN else "")
        what = ("counts a check without a new value as no improvement"
                if kind == "EarlyStopping" else
                "would rank the weights by an older value, so it saves nothing there")
        notes.append(
            f"callbacks.{name}.trigger: {kind} judges {metric!r}, but {len(places)} of its "
            f"{fired[name]} planned firings ({shown}) come where "
            f"{' or '.join(map(repr, makers))} put no new value: it {what}; fire it where "
            f"{makers[0]!r} fires (its trigger, after it)")
    return notes
