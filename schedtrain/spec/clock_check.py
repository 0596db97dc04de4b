"""Checking the ``[clock]`` table: each key's range, and that the keys fit together."""

from __future__ import annotations

import math

from schedtrain.spec.model import ClockSpec
from schedtrain.spec.problems import Problems
from schedtrain.spec.run_check import check_whole

__all__ = ["check_clock"]


def check_clock(clock: ClockSpec, problems: Problems) -> None:
    """Range-check ``[clock]`` and that its keys fit together."""
    # Keys left out (most, in a schedule's [clock]) are not checked: ``check_whole``
    # passes ``None``, and is not called for it (a live retime checks its schedule here).
    before = len(problems.items)
    for key in ("epochs", "steps_per_epoch", "batches_per_step", "max_steps",
                "batches_per_epoch"):
        if (whole := getattr(clock, key)) is not None:
            check_whole(problems, ("clock", key), whole, 1)
    for key in ("samples_per_batch", "tokens_per_batch"):
        value = getattr(clock, key)
        if not isinstance(value, tuple):
            if value is not None:
                check_whole(problems, ("clock", key), value, 0)
            continue
        if not value:
            problems.expect(("clock", key), "a number, or a non-empty list of one epoch's "
                            "batches", [])
        for i, n in enumerate(value):
            check_whole(problems, ("clock", key, i), n, 0)
    for i, n in enumerate(clock.epoch_lengths or ()):
        check_whole(problems, ("clock", "epoch_lengths", i), n, 1)
    if clock.epoch_lengths is not None:
        if not clock.epoch_lengths:
            problems.expect(("clock", "epoch_lengths"), "a non-empty list of step counts", [])
        if clock.steps_per_epoch is not None:
            problems.add(("clock", "epoch_lengths"), "give `steps_per_epoch` or "
                         "`epoch_lengths`, not both", found="both")
        elif clock.epochs is not None and clock.epochs != len(clock.epoch_lengths):
            problems.add(("clock", "epochs"), f"epochs = {clock.epochs} but epoch_lengths has "
                         f"{len(clock.epoch_lengths)} entries",
                         expected=f"{len(clock.epoch_lengths)}", found=clock.epochs)
    if len(problems.items) == before and (why := clock.per_batch_problem()) is not None:
        problems.add(("clock", "batches_per_epoch"), why)
    sps = clock.seconds_per_step
    if sps is not None and not (math.isfinite(sps) and 0 <= sps <= 1e9):
        problems.add(("clock", "seconds_per_step"), f"expected a number >= 0 and at most 1e9, "
                     f"found {sps}", expected="a number >= 0", found=sps)
