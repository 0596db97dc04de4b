"""The one rule set of a run's options (``[run]`` and ``Trainer``'s keywords): each key's
range and vocabulary, and that the keys fit together, each problem at ``run.<key>``.

``RunConfig`` runs it when built (``spec.run``), the loaders before building one, so a
``RunConfig`` is valid by construction. Below ``RunConfig``: it reads ``RunFields``.
"""

from __future__ import annotations

import math
import re
from typing import Final

from schedtrain.distributed.vocabulary import REDUCE_OPS, STRATEGIES
from schedtrain.errors import ArgumentError, Problem
from schedtrain.spec.deadlines import check_deadline, check_notice, check_signals
from schedtrain.spec.failures import check_failures
from schedtrain.spec.outputs import check_outputs
from schedtrain.spec.problems import Problems, Rel
from schedtrain.spec.run_fields import (
    BUSY_RULES,
    MODES,
    PRECISIONS,
    SCHEDULE_CHANGES,
    STAGING,
    RunFields,
)
from schedtrain.time import MAX_COUNT

__all__ = ["argument_error", "check_run", "check_whole", "one_of"]

_TASK_RE: Final = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
_DEVICE_RE: Final = re.compile(r"auto|cpu|cuda|mps|cuda:(?P<index>[0-9]{1,4})")
#: torch keeps a device index in 8 bits.
MAX_DEVICE_INDEX: Final = 127


def check_whole(problems: Problems, where: Rel, value: int | None, least: int) -> None:
    """Record a problem at ``where`` unless ``value`` is ``None`` or a whole number from
    ``least`` to ``MAX_COUNT``."""
    if value is not None and not least <= value <= MAX_COUNT:
        problems.add(where, f"expected a whole number >= {least}, found {value}",
                     expected=f"a whole number >= {least}", found=value)


def check_run(run: RunFields, problems: Problems, *, in_process: bool = False) -> None:
    """Add the problems of a run's options: the one rule set of ``[run]`` and of
    ``Trainer``'s keywords (``spec.config``), each at ``run.<key>``; ``in_process``: the
    options of a ``Trainer`` made in Python, whose process may keep a ``memory://``
    checkpoint folder."""
    if run.task is not None and not _TASK_RE.fullmatch(run.task):
        problems.expect(("run", "task"), "'module:function'", run.task)
    for key in ("max_epochs", "max_steps", "grad_accum", "keep_firings"):
        check_whole(problems, ("run", key), getattr(run, key), 1)
    check_whole(problems, ("run", "sanity_eval_batches"), run.sanity_eval_batches, 0)
    for key, allowed in (("checkpoint_mode", MODES), ("checkpoint_busy", BUSY_RULES),
                         ("checkpoint_staging", STAGING), ("precision", PRECISIONS),
                         ("strategy", STRATEGIES), ("schedule_change", SCHEDULE_CHANGES)):
        value = getattr(run, key)
        if value not in allowed:
            problems.expect(("run", key), one_of(allowed), value)
    share = run.checkpoint_write_share
    if share is not None and not 0 < share <= 1:
        problems.expect(("run", "checkpoint_write_share"), "a number > 0 and <= 1", share)
    device = _DEVICE_RE.fullmatch(run.device)
    if device is None or int(device["index"] or 0) > MAX_DEVICE_INDEX:
        problems.expect(("run", "device"), f"'auto', 'cpu', 'cuda', 'cuda:N' (N from 0 to "
                                           f"{MAX_DEVICE_INDEX}) or 'mps'", run.device)
    if run.grad_clip is not None and not (run.grad_clip > 0 and math.isfinite(run.grad_clip)):
        problems.expect(("run", "grad_clip"), "a finite number > 0", run.grad_clip)
    if not 0 <= run.seed <= MAX_COUNT:
        problems.expect(("run", "seed"), f"a whole number from 0 to {MAX_COUNT}", run.seed)
    for name, op in run.reduce.items():
        if op not in REDUCE_OPS:
            problems.expect(("run", "reduce", name), one_of(REDUCE_OPS), op)
    for key, why in (("deadline", run.deadline is not None and check_deadline(run.deadline)),
                     ("preempt_signals", check_signals(list(run.preempt_signals))),
                     ("preempt_notice",
                      run.preempt_notice is not None and check_notice(run.preempt_notice))):
        if why:
            problems.add(("run", key), why, found=repr(getattr(run, key)))
    check_outputs(run, problems, in_process=in_process)
    check_failures(run, problems)


def one_of(allowed: tuple[str, ...]) -> str:
    """``'a', 'b' or 'c'``."""
    quoted = [repr(x) for x in allowed]
    return f"{', '.join(quoted[:-1])} or {quoted[-1]}" if len(quoted) > 1 else quoted[0]




def argument_error(problems: Problems) -> ArgumentError:
    """The first of ``problems`` (at ``run.<key>``) as an ``ArgumentError`` naming the
    keyword; the others in its notes."""
    first, *rest = problems.items
    error = _argument_error(first)
    for problem in rest:
        error.add_note(str(_argument_error(problem)))
    return error


def _argument_error(problem: Problem) -> ArgumentError:
    key = problem.path.removeprefix("run.").split(".")[0].split("[")[0]
    where = problem.path.removeprefix("run.")
    return ArgumentError(key, f"`{where}`: {problem.message}", expected=problem.expected,
                         found=problem.found)
