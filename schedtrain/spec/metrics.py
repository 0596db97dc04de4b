"""Metrics a spec reads, checked against those its callbacks and the trainer produce.

A metric read by a trigger (``plateau``, ``improved``, an ``if`` condition) or by a
callback's ``monitor`` argument that nothing produces never changes: a saver saves
nothing, an early stop never stops. ``check`` refuses it when it knows every producer
(built-ins without import, every callback once built), and warns when a callback it
cannot see into (a user class, one bound from Python) might produce it; ``train``
refuses it before training. A spec without ``[run]`` is not judged: whoever runs it (a
host, callbacks bound from Python) produces metrics ``check`` cannot see. An
``EarlyStopping`` without ``patience`` whose trigger has no metric part would stop the
first time it fires: refused too.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, Final

from schedtrain.errors import Problem, ScheduleError
from schedtrain.schedule.table import TriggerTable
from schedtrain.spec.model import Spec
from schedtrain.triggers.metric import MetricTrigger

__all__ = ["TRAINER_METRICS", "check_early_stopping", "gate_notes", "metric_problems",
           "metric_reads", "static_producers"]

#: What the trainer itself puts, whatever the callbacks.
TRAINER_METRICS: Final = ("train/loss",)


def _inference(args: Mapping[str, Any]) -> tuple[str, ...]:
    prefix = args.get("prefix", "val")
    inferencers = args.get("inferencers")
    if not inferencers:
        return tuple(f"{prefix}/{m}" for m in ("loss", "accuracy", "error"))
    names: list[str] = []
    for table in inferencers:  # validated by the registry before this runs
        kind = table.get("type")
        if kind == "ScalarStats":
            prefix = table.get("prefix", "val")
            names += [f"{prefix}/{n}" for n in table.get("names", ["loss"])]
        elif kind == "ClassificationError":
            names.append(table.get("name", f"val-error-top{table.get('k', 1)}"))
        else:
            names.append(table["name"])
    return tuple(names)


def _averages(args: Mapping[str, Any]) -> tuple[str, ...]:
    suffix = args.get("suffix", "_ema")
    return tuple(f"{m}{suffix}" for m in args.get("metrics", ["train/loss"]))


def _nothing(_args: Mapping[str, Any]) -> tuple[str, ...]:
    return ()


#: Built-in type -> the metrics it puts, from its TOML arguments. A built-in not listed
#: is treated like a user class: it may produce anything.
BUILTIN_PRODUCES: Final[Mapping[str, Callable[[Mapping[str, Any]], tuple[str, ...]]]] = {
    "InferenceRunner": _inference,
    "ModelSaver": _nothing, "MinSaver": _nothing, "MaxSaver": _nothing,
    "ScheduledHyperParamSetter": _nothing, "EarlyStopping": _nothing,
    "TerminateOnNaN": _nothing, "ProgressBar": _nothing,
    "HumanHyperParamSetter": _nothing, "SendStat": _nothing, "InjectShell": _nothing,
    "MovingAverageSummary": _averages, "LRScheduler": _nothing, "TopKSaver": _nothing,
    "PrintProgress": _nothing, "PrintMetrics": _nothing,
    "GradientAccumulationScheduler": _nothing,
    # GPUUtilizationTracker and LearningRateMonitor name their metrics after the devices
    # and param groups found at run time: treated as possibly producing anything.
}


def metric_reads(spec: Spec) -> Iterator[tuple[str, str]]:
    """``(key path, metric)`` for each metric the spec's triggers and ``monitor``
    arguments read, in file order."""
    for name, cb in spec.callbacks.items():
        located = spec.located.get(name)
        if located is not None:
            for node in located.walk():
                if not node.children:
                    for metric in sorted(node.trigger.metrics()):
                        yield node.path, metric
        monitor = cb.args.get("monitor")
        if isinstance(monitor, str):
            yield f"callbacks.{name}.monitor", monitor


def static_producers(spec: Spec) -> tuple[set[str], list[str]]:
    """What the spec's callbacks produce, known without importing them, and the
    callbacks that may produce more (user classes, untyped, unlisted built-ins)."""
    produced = set(TRAINER_METRICS)
    unknown = []
    for name, cb in spec.callbacks.items():
        known = BUILTIN_PRODUCES.get(cb.type) if cb.type is not None else None
        if known is None:
            unknown.append(name)
        else:
            produced.update(known(cb.args))
    return produced, unknown


def _closest_first(metric: str, names: Collection[str]) -> list[str]:
    ratio = {n: difflib.SequenceMatcher(None, metric, n).ratio() for n in names}
    return sorted(names, key=lambda n: (-ratio[n], n))


def metric_problems(spec: Spec, produced: Collection[str],
                    unknown: Collection[str] = ()) -> tuple[list[Problem], list[str]]:
    """Reads of metrics nothing in ``produced`` puts: problems, or warnings when
    callbacks in ``unknown`` might put them.

    Returns:
        ``(problems, warnings)``; each names the key path, the metric and the metrics
        that do exist, closest match first.
    """
    problems: list[Problem] = []
    notes: list[str] = []
    for path, metric in metric_reads(spec):
        if metric in produced:
            continue
        shown = ", ".join(repr(n) for n in _closest_first(metric, produced))
        what = f"metric {metric!r} is never produced"
        if unknown:
            notes.append(f"{path}: {what} by a built-in callback or the trainer (produced: "
                         f"{shown}); unless {', '.join(repr(u) for u in unknown)} puts it, "
                         "it will never change")
        else:
            problems.append(Problem(path, f"{what}: no callback and not the trainer puts "
                                          f"it, so it would never change; produced: {shown}",
                                    spec.path, expected="a produced metric", found=metric))
    return problems, notes


def check_early_stopping(spec: Spec) -> list[Problem]:
    """``EarlyStopping`` without ``patience`` stops the first time its trigger fires:
    its trigger needs a metric part (``plateau``, ``improved``, an ``if``)."""
    problems = []
    for name, cb in spec.callbacks.items():
        if cb.type != "EarlyStopping" or "patience" in cb.args:
            continue
        located = spec.located.get(name)
        if located is not None and not any(n.trigger.metrics() for n in located.walk()):
            monitor = cb.args.get("monitor", "val/loss")
            problems.append(Problem(
                f"callbacks.{name}.trigger",
                f"EarlyStopping without `patience` stops the first time its trigger fires, "
                f"and {cb.trigger!r} reads no metric, so it would stop at its first firing; "
                f"give the trigger a metric part, e.g. trigger = {{ all = [{{ every = "
                f"\"1 epoch\" }}, {{ plateau = \"{monitor}\", patience = 3 }}] }}, or give "
                "`patience = N` to count checks without improvement itself", spec.path,
                expected="a trigger with a metric part, or `patience`",
                found=repr(cb.trigger)))
    return problems


def gate_notes(spec: Spec) -> list[str]:
    """A callback whose trigger judges a metric (``plateau``, ``improved``) and has no
    clock part is evaluated at every event, every step included: a note suggesting a
    clock gate, so it is judged where the metric has a new value."""
    if spec.unimported:  # a custom trigger not imported: its table cannot be built
        return []
    try:
        with warnings.catch_warnings():  # the spec's own warnings are reported by check
            warnings.simplefilter("ignore")
            schedule = spec.schedule()
            if schedule.analyze().problems:
                return []  # reported by check itself
    except ScheduleError:  # reported by check itself
        return []
    judged_by: dict[str, set[str]] = {}
    for entry in schedule.entries:
        todo, judged = [entry.trigger], set[str]()
        while todo:
            t = todo.pop()
            todo.extend(t.children())
            if isinstance(t, MetricTrigger):
                judged |= t.metrics()
        if judged:
            judged_by[entry.default_name()] = judged
    if not judged_by:
        return []
    # Only the triggers that judge a metric are compiled: a callback's own trigger decides
    # whether it is evaluated at every step.
    table = TriggerTable([(e.default_name(), e.trigger) for e in schedule.entries
                          if e.default_name() in judged_by])
    notes = []
    for name in table.always_evaluated:
        metric = sorted(judged_by[name])[0]
        notes.append(
            f"callbacks.{name}.trigger: judges {metric!r} and has no clock part: it is "
            f"evaluated at every event, every step too; gate it where {metric!r} "
            f"is new: trigger = {{ all = [{{ every = \"1 epoch\" }}, ...] }}")
    return notes
