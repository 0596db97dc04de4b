"""What ``check`` and ``plan`` learn about a spec beyond loading it: what ``train`` would
refuse (``--import``: its very checks), callbacks judging stale metrics, the run's shape
from ``[run]`` and the task."""

from __future__ import annotations

import argparse
from typing import Any

from schedtrain.errors import Error, ScheduleError
from schedtrain.spec import Spec

__all__ = ["UsageError", "check_spec", "derived_clock", "plan_task", "size_argument",
           "stale_notes"]


class UsageError(Error):
    """Bad input found after argument parsing (exit 2, message only)."""


def check_spec(spec: Spec, do_import: bool) -> tuple[Any, list[str]]:
    """What ``train`` would refuse in ``spec``: without ``--import`` what is known without
    importing anything; with it, ``train``'s own checks (``prepare_run``), which build
    the callbacks and the task. Returns what ``prepare_run`` built (or ``None``) and
    warnings."""
    from schedtrain.spec.metrics import metric_problems, static_producers
    from schedtrain.spec.readiness import train_problems

    if not do_import:
        problems = train_problems(spec) if spec.run is not None else []
        more, notes = metric_problems(spec, *static_producers(spec))
        if problems or more:
            raise ScheduleError([*problems, *more])
        return None, notes
    try:
        from schedtrain.training.from_spec import prepare_run
    except ImportError as exc:
        raise UsageError(f"--import checks callbacks and the task with schedtrain.training "
                         f"(and torch), which cannot be imported: {exc}") from None
    prepared = prepare_run(spec)
    return prepared, list(prepared.notes)


def stale_notes(spec: Spec, prepared: Any) -> list[str]:
    """Callbacks judging a metric where it is not new, over the planned shape: what the
    built callbacks produce (``--import``), else what the built-ins are known to."""
    from schedtrain.planning import staleness

    produces = (staleness.static_producers_by_callback(spec) if prepared is None else
                {n: tuple(cb.produces) for n, cb in prepared.bindings.items()})
    return staleness.stale_notes(spec, produces)


def derived_clock(spec: Spec, do_import: bool, task: Any = None) -> tuple[Spec, list[str]]:
    """``[clock]``'s missing keys from ``[run]`` (and, with ``--import``, the steps per
    epoch counted from the task's data: ``task`` when built already), with a warning for
    each disagreement."""
    from schedtrain.spec.shape import derive_clock

    counted = None
    if do_import and spec.run is not None and spec.run.task:
        try:
            from schedtrain.training.from_spec import count_steps_per_epoch
        except ImportError as exc:
            raise UsageError(f"--import counts the task's batches with schedtrain.training "
                             f"(and torch), which cannot be imported: {exc}") from None
        counted = count_steps_per_epoch(spec, task)
    return derive_clock(spec, counted)


def plan_task(spec: Spec) -> Any:
    """``[run] task`` built as ``train`` builds it (seeded), for ``plan --import``; ``None``
    without one."""
    if spec.run is None or not spec.run.task:
        return None
    try:
        from schedtrain.training.data_position import seed_everything
        from schedtrain.training.from_spec import load_task
    except ImportError as exc:
        raise UsageError(f"--import builds the task with schedtrain.training (and torch), "
                         f"which cannot be imported: {exc}") from None
    seed_everything(spec.run.seed)
    return load_task(spec, spec.run.task)


def size_argument(text: str) -> int:
    """``--checkpoint-size``: a size such as ``4GB``, in bytes."""
    from schedtrain.planning.disk import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
