"""Planning: simulate a spec over its run's shape and collect the firings.

``plan_spec(spec)`` is what ``schedtrain plan`` prints, as a value: the firings
(a ``FiringLog``), the table (what is evaluated every step) and whether the list was
cut at ``MAX_FIRINGS``. Rendering lives in ``schedtrain.planning.render``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Final, Literal

import attrs

from schedtrain.errors import Error
from schedtrain.planning.stops import stop_rules
from schedtrain.retention import Best, SaverKind, parse_keep, saver_keep
from schedtrain.schedule.collector import collector_paused
from schedtrain.schedule.firings import Firing, FiringLog
from schedtrain.schedule.table import TriggerTable
from schedtrain.simulation.files import SaveFiles, SaverFiles, planned_files
from schedtrain.simulation.metric_stream import MetricRecord, StreamMetrics
from schedtrain.simulation.simclock import RunShape
from schedtrain.simulation.simulate import Simulation
from schedtrain.spec import Spec
from schedtrain.spec.deadlines import resolve_deadline
from schedtrain.time import Time

__all__ = ["MAX_ALWAYS_STEPS", "MAX_FIRINGS", "Plan", "PlanError", "plan_spec"]

#: A plan stops collecting firings here, so a mistaken `every = "1 step"` over 10^9
#: steps reports quickly instead of filling memory.
MAX_FIRINGS: Final = 100_000
#: Beyond this many steps, a callback evaluated at every step makes a plan too slow.
MAX_ALWAYS_STEPS: Final = 5_000_000


class PlanError(Error, ValueError):
    """A plan that cannot be made: no run length, a class not imported, too costly."""


@attrs.frozen
class Plan:
    """A simulated run of a spec.

    Args:
        spec: the spec planned.
        shape: the run's shape.
        log: every firing, in order (at most ``MAX_FIRINGS``).
        table: the compiled table, for what it reports (``always_evaluated``).
        truncated: the run had more firings than ``log`` holds.
        notes: what the plan cannot predict exactly, one sentence each.
        stopped: where and why a callback stops the run (``schedtrain.planning.stops``),
            or ``None``: the log ends with that event's firings and ``train_end`` there.
        keep: each saver's files and retention policy (``ModelSaver``, ``MinSaver``,
            ``MaxSaver``, ``TopKSaver``).
        files: after each of their saves, the checkpoint files its folder holds.
        ranked: a metric stream was given, so ``Best`` rules ranked the saves by it.
    """

    spec: Spec
    shape: RunShape
    log: FiringLog
    table: TriggerTable
    truncated: bool = False
    notes: tuple[str, ...] = ()
    stopped: str | None = None
    keep: Mapping[str, SaverFiles] = attrs.field(factory=dict)
    files: tuple[SaveFiles, ...] = ()
    ranked: bool = False

    @property
    def always(self) -> tuple[str, ...]:
        """Callbacks evaluated at every step (no clock part bounds them)."""
        return self.table.always_evaluated


def _shape(spec: Spec, epochs: int | None, steps_per_epoch: int | None) -> RunShape:
    try:
        shape = spec.clock.shape(epochs=epochs, steps_per_epoch=steps_per_epoch)
    except ValueError as exc:
        raise PlanError(f"{spec.path}: {exc}") from None
    if shape is not None:
        return shape
    clock = spec.clock
    missing = []
    if epochs is None and clock.epochs is None and clock.epoch_lengths is None:
        missing.append("epochs")
    if (steps_per_epoch is None and clock.steps_per_epoch is None and not clock.epoch_lengths
            and not clock.per_batch):
        missing.append("steps_per_epoch")
    hint = ""
    if "steps_per_epoch" in missing and spec.run is not None and spec.run.task:
        hint = "; or --import to count the steps per epoch from [run] task's data"
    raise PlanError(
        f"{spec.path}: plan needs the run's length: set {' and '.join(missing)} in [clock] "
        f"or pass {' and '.join('--' + m.replace('_', '-') for m in missing)}{hint}")


def _deadline(spec: Spec) -> Time | None:
    """``[run] deadline`` as a duration from the start, the start being now (a plan is
    made just before launching); the scheduler's job end is not known to a plan."""
    if spec.run is None or spec.run.deadline is None:
        return None
    now = time.time()
    end = resolve_deadline(spec.run.deadline, start=now, env={})
    assert end is not None
    return Time(max(end - now, 0.0), "s")


@collector_paused()  # the simulation and the firings it keeps (see simulate())
def plan_spec(
    spec: Spec,
    metrics: Iterable[MetricRecord] | None = None,
    *,
    epochs: int | None = None,
    steps_per_epoch: int | None = None,
    shape: RunShape | None = None,
    max_firings: int = MAX_FIRINGS,
    host: str | None = None,
) -> Plan:
    """Simulate ``spec`` over its ``[clock]`` shape (``epochs``, ``steps_per_epoch`` or a
    whole ``shape`` override it), with an optional metric stream; ``host`` (``--host``)
    names its host verbs' files as that host writes them.

    Raises:
        PlanError: no run length, a custom trigger class that was not imported, or a
            callback evaluated at every step of a very long run.
    """
    if spec.unimported:
        raise PlanError(f"{spec.path}: custom trigger {spec.unimported[0]!r} is not imported; "
                        "plan it with --import (which imports and runs that module)")
    shape = shape if shape is not None else _shape(spec, epochs, steps_per_epoch)
    sim = Simulation(spec.schedule(), shape, metrics=None if metrics is None else list(metrics),
                     sanity_eval=bool(spec.clock.sanity_eval), deadline=_deadline(spec))
    always = sim.table.always_evaluated
    if always and shape.total_steps > MAX_ALWAYS_STEPS:
        raise PlanError(
            f"{spec.path}: {', '.join(always)} would be evaluated at each of "
            f"{shape.total_steps:,} steps; give each a clock part (e.g. every = \"1 epoch\") "
            "or plan a shorter run with --epochs/--steps-per-epoch")
    notes = _notes(spec)
    rules = stop_rules(spec)
    stopped: str | None = None
    firings: list[Firing] = []
    keep = _policies(spec, host)
    values: dict[int, dict[str, float]] = {}
    truncated = False
    for firing in sim.iter_firings():
        if len(firings) >= max_firings:
            truncated = True
            break
        firings.append(firing)
        if firing.callback in keep and sim.metrics is not None:
            values[len(firings) - 1] = _values(keep[firing.callback], sim.metrics)
        rule = rules.get(firing.callback)
        why = rule(firing, sim.metrics) if rule is not None and stopped is None else None
        if why is not None:
            sim.stop()  # the rest of this event's firings, then train_end here
            where = (f"epoch {firing.epoch}" if firing.event == "epoch_end"
                     else f"{firing.event} of step {firing.step}")
            stopped = f"the run stops at {where} (step {firing.step}): {why}"
    index = {id(f): i for i, f in enumerate(firings)}
    files = planned_files(firings, keep, None if sim.metrics is None
                          else lambda f: values.get(index[id(f)], {}))
    return Plan(spec, shape, FiringLog(firings), sim.table, truncated=truncated, notes=notes,
                stopped=stopped, keep=keep, files=tuple(files),
                ranked=sim.metrics is not None)


#: ``--host`` -> how its save verb names its files (``SaverFiles.kind``).
_HOST_FILES: dict[str, Literal["lightning", "transformers", "host"]] = {
    "lightning": "lightning", "transformers": "transformers"}


def _policies(spec: Spec, host: str | None = None) -> dict[str, SaverFiles]:
    """Each saver's files and ``keep`` (a ``ModelSaver``'s default: the newest 3; a
    callback without type that has ``keep``: a host verb's saves, named as ``host``
    names them)."""
    out = {}
    verb = _HOST_FILES.get(host or "", "host")  # another host: by the verb's step
    for name, cb in spec.callbacks.items():
        args = cb.args
        if cb.type == "ModelSaver":
            out[name] = SaverFiles("model", parse_keep(args.get("keep", 3)))
        elif cb.type is None and "keep" in args:  # a host verb's saves (by its step)
            out[name] = SaverFiles(verb, parse_keep(args["keep"]))
        elif cb.type in ("MinSaver", "MaxSaver"):
            mode: Literal["min", "max"] = "min" if cb.type == "MinSaver" else "max"
            monitor = args.get("monitor", "val/loss" if mode == "min" else "val/accuracy")
            filename = args.get("filename") or f"{mode}-{monitor.replace('/', '-')}.pt"
            kind: SaverKind = "MinSaver" if mode == "min" else "MaxSaver"
            out[name] = SaverFiles("best", saver_keep(kind, args.get("keep")), monitor,
                                   mode, filename)
        elif cb.type == "TopKSaver":
            monitor, mode = args.get("monitor", "val/loss"), args.get("mode", "min")
            k = args.get("save_top_k", 1)
            policy = saver_keep("TopKSaver", args["keep"], monitor, mode) if "keep" in args \
                else Best(k, monitor, mode) if k else None
            out[name] = SaverFiles("topk", policy, monitor, mode,
                                   save_last=args.get("save_last", True))
    return out


def _values(saver: SaverFiles, metrics: StreamMetrics) -> dict[str, float]:
    """The values a save's files depend on, as the stream has them now."""
    out = {}
    for name in saver.monitors():
        got = metrics.latest(name)
        if got is not None:
            out[name] = got.value
    return out


def _notes(spec: Spec) -> tuple[str, ...]:
    """What the simulated clock cannot know about ``spec``'s run."""
    return tuple(
        f"callbacks.{name} (GradientAccumulationScheduler) changes the micro-batches per "
        "step by epoch: the plan takes [clock] epoch_lengths (in steps) as given and "
        "batches_per_step as constant, so batch-, sample- and token-unit firings are not "
        "predicted exactly"
        for name, cb in spec.callbacks.items() if cb.type == "GradientAccumulationScheduler")
