"""What ``check`` and ``plan`` learn about a spec beyond loading it: what ``train`` would
refuse (``--import``: its very checks), callbacks judging stale metrics, the run's shape
from ``[run]`` and the task."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import IO, Any

from schedtrain.errors import (
    PATH_LIMIT,
    SHOWN_PROBLEMS,
    Error,
    ScheduleError,
    number_text,
    one_line,
    shorten,
    with_head,
)
from schedtrain.spec import Spec

__all__ = ["UsageError", "check_spec", "checked", "derived_clock", "hosted", "plan_task",
           "print_warnings", "size_argument", "stale_notes"]


class UsageError(Error):
    """Bad input found after argument parsing (exit 2, message only)."""


def hosted(spec: Spec, host: str | None) -> bool:
    """Whether ``spec``'s schedule runs inside a host (``--host``, or no ``[run]``): the
    host then produces the metrics and writes the checkpoints, not schedtrain's Trainer."""
    return host is not None or spec.run is None


def check_spec(spec: Spec, do_import: bool, host: str | None = None
               ) -> tuple[Any, list[str]]:
    """What ``train`` would refuse in ``spec``: without ``--import`` what is known without
    importing anything; with it, ``train``'s own checks (``prepare_run``), which build
    the callbacks and the task. Returns what ``prepare_run`` built (or ``None``) and
    warnings. A schedule for a host (``hosted``) has its typed callbacks checked, and no
    metric read is judged: the host's own metrics are unknown here."""
    from schedtrain.spec.metrics import gate_notes, metric_problems, static_producers
    from schedtrain.spec.readiness import train_problems

    notes = gate_notes(spec)
    if not do_import:
        if hosted(spec, host):
            return None, notes
        problems = train_problems(spec)
        more, found = metric_problems(spec, *static_producers(spec))
        if problems or more:
            raise ScheduleError([*problems, *more])
        return None, found + notes
    try:
        from schedtrain.training.from_spec import (
            Prepared,
            build_callbacks,
            porting_notes,
            prepare_run,
        )
    except ImportError as exc:
        raise UsageError(f"--import checks callbacks and the task with schedtrain.training "
                         f"(and torch), which cannot be imported: {exc}") from None
    if hosted(spec, host):  # its typed callbacks, and the lineage hooks they define
        bindings = build_callbacks(spec, untyped_ok=True)
        return Prepared(bindings, None), porting_notes(bindings) + notes
    prepared = prepare_run(spec)
    return prepared, list(prepared.notes) + notes


def checked(spec: Spec, do_import: bool, host: str | None = None
            ) -> tuple[Spec, list[str]]:
    """``check``'s checks of ``spec`` (``schedtrain retime`` makes them too, on the new
    spec): the spec with its ``[clock]`` completed, and the warnings besides the spec's
    own (``spec.warnings``), stale metrics over that shape included.

    Raises:
        ScheduleError: what ``train`` would refuse.
    """
    prepared, notes = check_spec(spec, do_import, host)
    task = prepared.task if prepared is not None else None
    # a host's run has no schedtrain task to count
    counts = do_import and not hosted(spec, host)
    spec, shape_notes = derived_clock(spec, counts, task)
    return spec, notes + shape_notes + stale_notes(spec, prepared)


def print_warnings(path: str, notes: Sequence[str], err: IO[str]) -> None:
    """One line per warning (the same one once), the first ``SHOWN_PROBLEMS``."""
    notes = list(dict.fromkeys(notes))
    for note in notes[:SHOWN_PROBLEMS]:
        print(with_head(f"warning: {one_line(path, PATH_LIMIT)}: ", note), file=err)
    if len(notes) > SHOWN_PROBLEMS:
        print(f"warning: {path}: ... and {len(notes) - SHOWN_PROBLEMS} more warnings", file=err)


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

    huge = number_text(text)
    if huge is not None:
        raise argparse.ArgumentTypeError(f"expected a size such as '4GB', got {huge}")
    try:
        return parse_size(text)
    except OverflowError:  # float('1e999') * the unit is infinite: no size
        raise argparse.ArgumentTypeError(
            f"expected a size such as '4GB', got {shorten(text)!r}: too large") from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
