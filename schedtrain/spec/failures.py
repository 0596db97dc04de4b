"""``[run] mtbf``, ``failure_rate`` and ``max_checkpoint_overhead``: what ``every = "auto"``
reads to pick a checkpoint interval (``triggers.auto``), checked and converted here.

``mtbf`` is a duration (``"6 h"``), ``failure_rate`` failures per hour (one of the two);
``max_checkpoint_overhead`` the most of the time saves may take, ``"2%"`` or ``0.02``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from schedtrain.schedule.analysis import Located
from schedtrain.spec.problems import Problems
from schedtrain.spec.registry import BUILTINS
from schedtrain.spec.run_fields import RunFields
from schedtrain.time import Time
from schedtrain.triggers.auto import AutoEvery

__all__ = ["check_auto_triggers", "check_failures", "mtbf_seconds", "overhead_fraction",
           "rate_needed", "without_mistyped_mtbf"]

#: What ``mtbf`` is, for its refusals.
_DURATION = "a duration such as '6 h' or '90 min'"


def _mtbf(text: str) -> float:
    """``text``'s duration in seconds (``ValueError`` for anything else)."""
    t = Time.parse(text)
    if t.counter != "time_ns" or t.base <= 0:
        raise ValueError(f"expected a positive duration, got {text!r}")
    return t.base / 1e9


def _overhead(value: str | float) -> float:
    """``"2%"`` or ``0.02`` as a fraction in (0, 1] (``ValueError`` otherwise)."""
    if isinstance(value, str):
        text = value.strip()
        got = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a share of the time, got {value!r}")
    else:
        got = float(value)
    if not (math.isfinite(got) and 0 < got <= 1):
        raise ValueError(f"expected a share of the time in (0%, 100%], got {value!r}")
    return got


def check_failures(run: RunFields, problems: Problems) -> None:
    """Add the problems of ``mtbf``, ``failure_rate`` and ``max_checkpoint_overhead``."""
    if run.mtbf is not None:
        try:
            _mtbf(run.mtbf)
        except ValueError:
            problems.expect(("run", "mtbf"), _DURATION, run.mtbf)
    rate = run.failure_rate
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        problems.expect(("run", "failure_rate"), "failures per hour, a finite number > 0", rate)
    if run.mtbf is not None and rate is not None:
        problems.add(("run", "failure_rate"), "give `mtbf` or `failure_rate`, not both",
                     expected="one of mtbf, failure_rate", found="both")
    if run.max_checkpoint_overhead is not None:
        try:
            _overhead(run.max_checkpoint_overhead)
        except ValueError:
            problems.expect(("run", "max_checkpoint_overhead"), "a share of the time such as "
                            "'2%' or 0.02 (more than 0, at most 100%)", run.max_checkpoint_overhead)


def without_mistyped_mtbf(run: dict[str, object], problems: Problems) -> dict[str, object]:
    """``[run]`` without an ``mtbf`` that is not text, refused at ``run.mtbf`` as the
    duration it should be (not as "a string"); the other keys are still checked."""
    if "mtbf" not in run or isinstance(run["mtbf"], str):
        return run
    problems.expect(("run", "mtbf"), _DURATION, run["mtbf"])
    return {k: v for k, v in run.items() if k != "mtbf"}


def mtbf_seconds(run: RunFields | None) -> float | None:
    """The declared mean time between failures in seconds (``None``: neither key given)."""
    if run is None:
        return None
    if run.mtbf is not None:
        return _mtbf(run.mtbf)
    return None if run.failure_rate is None else 3600.0 / run.failure_rate


def overhead_fraction(run: RunFields | None) -> float | None:
    """``max_checkpoint_overhead`` as a fraction (``None``: not given)."""
    if run is None or run.max_checkpoint_overhead is None:
        return None
    return _overhead(run.max_checkpoint_overhead)


def rate_needed(data: Mapping[str, object], *, schedule_only: bool) -> bool:
    """Whether a document's ``every = "auto"`` is refused for want of a failure rate.

    Not where ``[run]`` gives ``mtbf`` or ``failure_rate`` (a wrong one is refused at its
    own key, once), nor where ``[run]`` is not a table (refused as such); and, for a
    ``schedule_only`` document without ``[run]`` (a checkpoint's stored schedule, a
    running job's, a retime's new one), not at all: the rate is its run's, and the run
    already has it (a saver without one is refused when it is built)."""
    if "run" not in data:
        return not schedule_only
    run = data["run"]
    return isinstance(run, Mapping) and not {"mtbf", "failure_rate"} & set(run)


def check_auto_triggers(located: Mapping[str, Located], types: Mapping[str, str],
                        rate_needed: bool, problems: Problems) -> None:
    """``every = "auto"`` needs ``[run] mtbf`` or ``failure_rate`` (where ``rate_needed``:
    see ``rate_needed``), and a ``ModelSaver`` to measure its saves (a built-in of another
    type measures none): one line per use, at the key path it was written at. A user's
    class is judged when it is bound."""
    for name, loc in located.items():
        for node in loc.walk():
            if not isinstance(node.trigger, AutoEvery):
                continue
            if rate_needed:
                problems.add(node.path, 'every = "auto" picks the checkpoint interval from the '
                             "failure rate: set [run] mtbf (such as \"6 h\") or failure_rate "
                             "(failures per hour)", expected="[run] mtbf or failure_rate",
                             found="neither")
            kind = types.get(name)
            if kind in BUILTINS and kind != "ModelSaver":
                problems.add(node.path, 'every = "auto" picks a checkpoint interval from the '
                             f"measured cost of each save, and {kind} measures none: use it "
                             'on a ModelSaver, or give an interval (every = "500 steps")',
                             expected="a ModelSaver", found=kind)
