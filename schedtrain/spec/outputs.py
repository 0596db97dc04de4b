"""Checks of where a run's outputs go, in the ``[run]`` table: its sinks and their
cadence, where its checkpoints are stored, and the formats its weights are exported in."""

from __future__ import annotations

from typing import Final

from schedtrain.errors import did_you_mean
from schedtrain.spec.problems import Problems
from schedtrain.spec.run_fields import EXPORT_FORMATS, RunFields
from schedtrain.time import Time, Unit
from schedtrain.urls import is_url, missing_package, redact, url_problem

__all__ = ["EXPORT_FORMATS", "SINKS", "check_outputs", "sink_period_problem"]


def check_outputs(run: RunFields, problems: Problems, *, in_process: bool = False) -> None:
    """Add the problems of ``run``'s sinks, checkpoint storage and exports."""
    _check_sinks(run, problems)
    _check_storage(run, problems, in_process)
    _check_export(run, problems)


def _check_storage(run: RunFields, problems: Problems, in_process: bool) -> None:
    where = ("run", "checkpoint_dir")
    if run.checkpoint_dir is None:
        if run.storage_options:
            problems.add(("run", "storage_options"), "storage_options apply to a URL "
                         "checkpoint_dir; none is given", expected="a checkpoint_dir URL "
                         "beside it", found="no checkpoint_dir")
        return
    if not run.checkpoint_dir.strip():
        problems.expect(where, "a folder or a URL such as 's3://bucket/run/checkpoints'",
                        run.checkpoint_dir)
    elif is_url(run.checkpoint_dir):
        shown = redact(run.checkpoint_dir)
        problem = url_problem(run.checkpoint_dir)
        # memory:// serves the Python process that writes and resumes it (a test); a
        # spec's run is a new process, which could resume nothing from it.
        if in_process and run.checkpoint_dir.lower().startswith("memory://"):
            problem = None
        missing = missing_package(run.checkpoint_dir)
        if problem is not None:
            problems.add(where, problem, expected="a folder, or an object store URL "
                         "without credentials such as 's3://bucket/run/checkpoints'",
                         found=shown)
        elif missing is not None:
            problems.add(where, missing, expected="its package installed", found=shown)
    elif run.storage_options:
        problems.add(("run", "storage_options"), "storage_options apply to a URL "
                     f"checkpoint_dir, not the folder {run.checkpoint_dir!r}",
                     expected="a URL checkpoint_dir", found=run.checkpoint_dir)


#: ``[run] sinks`` values.
SINKS: Final = ("jsonl", "console", "tensorboard")


def _check_sinks(run: RunFields, problems: Problems) -> None:
    seen: set[str] = set()
    for i, sink in enumerate(run.sinks):
        if sink not in SINKS:
            problems.add(("run", "sinks", i), f"unknown sink {sink!r}{did_you_mean(sink, SINKS)}"
                         f"; expected {', '.join(repr(x) for x in SINKS)}",
                         expected=" or ".join(repr(x) for x in SINKS), found=sink)
        elif sink in seen:
            problems.add(("run", "sinks", i), f"sink {sink!r} is listed twice",
                         expected="each sink once", found=sink)
        seen.add(sink)
    for sink, period in run.sink_every.items():
        where = ("run", "sink_every", sink)
        if sink == "jsonl":
            problems.add(where, "events.jsonl keeps every value (resume and `plan --metrics` "
                                "read it); give a cadence to 'console' or 'tensorboard'",
                         expected="'console' or 'tensorboard'", found=sink)
        elif sink not in run.sinks:
            problems.add(where, f"{sink!r} is not in run.sinks ({list(run.sinks)}); add it "
                                f"there{did_you_mean(sink, SINKS)}",
                         expected="a sink listed in run.sinks", found=sink)
        message = sink_period_problem(period)
        if message is not None:
            problems.add(where, message, expected="a period such as '1 epoch' or "
                                                  "'100 steps'", found=period)


def _check_export(run: RunFields, problems: Problems) -> None:
    seen: set[str] = set()
    for i, fmt in enumerate(run.export):
        if fmt not in EXPORT_FORMATS:
            problems.add(("run", "export", i), f"unknown export format {fmt!r}"
                         f"{did_you_mean(fmt, EXPORT_FORMATS)}; expected "
                         f"{', '.join(repr(x) for x in EXPORT_FORMATS)}",
                         expected=" or ".join(repr(x) for x in EXPORT_FORMATS), found=fmt)
        elif fmt in seen:
            problems.add(("run", "export", i), f"export format {fmt!r} is listed twice",
                         expected="each format once", found=fmt)
        seen.add(fmt)
    if run.export and run.strategy == "fsdp":
        problems.add(("run", "export"), "export is not available with strategy = 'fsdp' "
                     "(the weights are sharded)", expected="no export, or strategy 'ddp'",
                     found=list(run.export))


def sink_period_problem(period: str) -> str | None:
    """Why ``period`` cannot be a sink's cadence, or ``None``: scalars carry their step
    and epoch, so a whole number of steps or epochs."""
    try:
        t = Time.parse(period)
    except (ValueError, TypeError) as exc:
        return f"expected a period such as '1 epoch' or '100 steps', found {period!r} ({exc})"
    if t.unit not in (Unit.STEP, Unit.EPOCH) or not (isinstance(t.value, int) and t.value >= 1):
        return (f"expected a whole number >= 1 of steps or epochs (values are stamped with "
                f"those), found {period!r}")
    return None
