"""What ``check`` and ``plan`` learn about a spec beyond loading it: what ``train`` would
refuse (``--import``: its very checks), callbacks judging stale metrics, the run's shape
from ``[run]`` and the task."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import IO, Any, Final

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
from schedtrain.readback import MAX_LIST
from schedtrain.spec import Spec

#: The most processes ``--nproc`` or ``WORLD_SIZE`` may say: as many as a run's state may
#: record (``training.redivide.MAX_RANKS``, which needs torch to import).
MAX_RANKS: Final = MAX_LIST

__all__ = ["MAX_RANKS", "UsageError", "check_spec", "checked", "counted_processes",
           "derived_clock", "hosted", "one_process_note", "plan_task", "print_warnings",
           "processes", "size_argument", "stale_notes"]


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


def checked(spec: Spec, do_import: bool, host: str | None = None, *,
            nproc: int | None = None, path: str | None = None) -> tuple[Spec, list[str]]:
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
    processes_counted = counted_processes(spec, counts, nproc)
    if path is not None:
        one_process_note(path, spec, processes_counted, counts)
    spec, shape_notes = derived_clock(spec, counts, task, processes_counted)
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


def processes(given: int | None) -> int | None:
    """The processes a run's steps are counted for: ``--nproc`` (``given``), else the
    environment's ``WORLD_SIZE`` (under ``torchrun``), else ``None`` (not said).

    Raises:
        UsageError: ``WORLD_SIZE`` is not a whole number from 1 to ``MAX_RANKS``.
    """
    if given is not None:
        return given
    text = os.environ.get("WORLD_SIZE")
    if text is None or not text.strip():
        return None
    try:
        value = int(text) if len(text) <= 20 else -1
    except ValueError:
        value = -1
    if not 1 <= value <= MAX_RANKS:
        raise UsageError(f"WORLD_SIZE (environment): expected a number of processes from 1 "
                         f"to {MAX_RANKS:,}, found {shorten(text)!r}; --nproc N overrides it")
    return value


def counted_processes(spec: Spec, counts: bool, given: int | None) -> int | None:
    """``processes`` where the steps per epoch are counted from ``spec``'s task
    (``counts``: ``--import``, not for a host), else ``None``.

    Raises:
        UsageError: ``--nproc`` (``given``) where no steps are counted.
    """
    if counts and spec.run is not None and spec.run.task:
        return processes(given)
    if given is not None:
        raise UsageError(f"{spec.path}: --nproc divides the steps per epoch counted from "
                         "the [run] task: give --import, with a spec whose [run] has a task")
    return None


def one_process_note(path: str, spec: Spec, nproc: int | None, counted: bool) -> None:
    """A note on stderr where ``spec``'s steps were counted from its task (``counted``)
    for one process while its ``[run]`` asks for several (``strategy`` "ddp" or "fsdp"):
    a rank of a DDP job takes a share of each epoch."""
    run = spec.run
    if not counted or nproc is not None or run is None or not run.task \
            or run.strategy not in ("ddp", "fsdp"):
        return
    print(with_head(f"note: {one_line(path, PATH_LIMIT)}: ", (
        f"[run] strategy = \"{run.strategy}\": the steps per epoch are counted for one "
        "process; give --nproc N (or set WORLD_SIZE) to count a rank's share on N")),
        file=sys.stderr)


def derived_clock(spec: Spec, do_import: bool, task: Any = None,
                  nproc: int | None = None) -> tuple[Spec, list[str]]:
    """``[clock]``'s missing keys from ``[run]`` (and, with ``--import``, the steps per
    epoch counted from the task's data: ``task`` when built already; a rank's share on
    ``nproc`` processes, divided as the run divides it), with a warning for each
    disagreement."""
    from schedtrain.spec.shape import derive_clock

    counted = None
    if do_import and spec.run is not None and spec.run.task:
        try:
            from schedtrain.training.from_spec import count_steps_per_epoch
        except ImportError as exc:
            raise UsageError(f"--import counts the task's batches with schedtrain.training "
                             f"(and torch), which cannot be imported: {exc}") from None
        counted = count_steps_per_epoch(spec, task, nproc or 1)
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
