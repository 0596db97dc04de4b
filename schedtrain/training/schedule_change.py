"""A resume whose schedule is not the checkpoint's: refused, or applied by the rules.

Every checkpoint stores the run's schedule as canonical TOML (``run.schedule``). A
resume compares it with this run's: equal, the run goes on; different, it is refused
(``ScheduleChanged``, with the diff of the next firings) unless the rule is
``"apply"``, which keeps, resets or drops each callback's saved state as
``planning.changes`` documents. A checkpoint without a stored schedule (an earlier
version's) resumes as an unknown schedule, with a line saying so. Every rank reads the
same checkpoint and decides alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from schedtrain.errors import Error
from schedtrain.planning.changes import Carry, ScheduleDiff, carry, diff_texts
from schedtrain.simulation.simclock import RunShape

__all__ = ["RULES", "ScheduleChange", "ScheduleChanged"]

#: What a resume does with a changed schedule (``Trainer(schedule_change=...)``).
RULES: Final = ("refuse", "apply")


class ScheduleChanged(Error, ValueError):
    """A resume refused: the checkpoint was saved with another schedule."""

    def __init__(self, message: str, diff: ScheduleDiff) -> None:
        super().__init__(message)
        self.diff = diff


@attrs.define
class ScheduleChange:
    """This run's schedule, the rule for a changed one, and what a resume found.

    Args:
        text: this run's schedule as canonical TOML (``None``: it has none).
        rule: ``"refuse"`` or ``"apply"``.
        shape: the run's shape for the diff of the next firings (``None``: unknown).
    """

    text: str | None
    rule: str = "refuse"
    shape: Callable[[], RunShape | None] = lambda: None
    #: the rules applied at the last resume (``None``: the schedule did not change)
    carried: Carry | None = None
    #: the ``schedule_change`` line for ``events.jsonl``, until it is written
    record: dict[str, Any] | None = None
    #: lines to show once (the chief shows them)
    notes: list[str] = attrs.field(factory=list)

    def check(self, path: Path, run: Mapping[str, Any]) -> None:
        """Compare the checkpoint's schedule with this run's; raise ``ScheduleChanged``
        when it differs and the rule is ``"refuse"``."""
        self.carried, self.record = None, None
        saved = run.get("schedule")
        shown = str(path)
        if "schedule" not in run:
            self.notes.append(f"checkpoint {shown!r} has no stored schedule (an earlier "
                              "version wrote it): it resumes with this run's, unchecked")
            return
        if saved is None or self.text is None:
            self.notes.append(f"checkpoint {shown!r}: a schedule with a Python trigger "
                              "(when(fn)) has no stored form; resuming unchecked")
            return
        if saved == self.text:
            return
        step = int(run["clock"]["now"]["step"])
        # Taken inside an epoch: after a step_end; otherwise after the epoch's end.
        phase = "step_end" if run.get("epoch_open", True) else "epoch_end"
        diff = self._diff(saved, step, phase)
        rules = carry(saved, self.text)
        if self.rule != "apply":
            raise ScheduleChanged(_refusal(shown, step, diff, rules), diff)
        self.carried = rules
        epoch = int(run["clock"]["now"]["epoch"])
        self.record = {"kind": "schedule_change", "step": step, "epoch": epoch,
                       "rule": "apply", **diff.to_dict()}
        self.notes.append(f"the schedule changed at step {step}: applying the new one "
                          "(schedule_change = \"apply\")")
        self.notes += self.carried.lines()

    def _diff(self, saved: str, step: int, phase: str) -> ScheduleDiff:
        assert self.text is not None
        try:
            shape = self.shape()
        except ValueError:
            shape = None
        return diff_texts(saved, self.text, shape=shape, from_step=step, phase=phase,
                          files=("checkpoint's schedule", "this run's schedule"))

    def kept(self, states: Mapping[str, Any]) -> dict[str, Any]:
        """Of saved per-callback ``states``, those the resume keeps (all, when the
        schedule did not change)."""
        if self.carried is None:
            return dict(states)
        keep = set(self.carried.kept)
        return {n: s for n, s in states.items() if n in keep}


def _refusal(path: str, step: int, diff: ScheduleDiff, rules: Carry) -> str:
    saved = sorted(rules.kept + rules.reset + rules.removed)
    ours = sorted(rules.kept + rules.reset + rules.added)
    also = (f" (saved with callbacks {saved}, this run has {ours})"
            if rules.added or rules.removed else "")
    return (f"checkpoint {path!r} was saved with another schedule{also}; resuming at step "
            f"{step} would change it as follows:\n{diff.table().rstrip()}\n"
            "to resume with the new schedule, give --schedule-change apply "
            "(Trainer(schedule_change=\"apply\")); the rules are in docs/checkpoints.md")
