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

from schedtrain.errors import Error, SpecError, describe, one_line, shorten, summarized
from schedtrain.planning.changes import Carry, ScheduleDiff, carry, diff_texts
from schedtrain.planning.deletions import Present, saved_records
from schedtrain.planning.stored import StoredSchedule
from schedtrain.retention import Policy
from schedtrain.simulation.simclock import RunShape

__all__ = ["RULES", "ScheduleChange", "ScheduleChanged", "StoredScheduleError"]

#: What a resume does with a changed schedule (``Trainer(schedule_change=...)``).
RULES: Final = ("refuse", "apply")


class ScheduleChanged(Error, ValueError):
    """A resume refused: the checkpoint was saved with another schedule."""

    def __init__(self, message: str, diff: ScheduleDiff | None) -> None:
        super().__init__(message)
        self.diff = diff


class StoredScheduleError(ScheduleChanged):
    """A resume refused: the checkpoint's stored schedule cannot be read (not text, or not
    a valid schedule), so nothing can say what resuming with this run's would change."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(one_line(
            f"checkpoint {path!r} holds a stored schedule that cannot be read ({why}); "
            "it was not written by schedtrain as it is: nothing was resumed, changed or "
            "deleted; resume from another checkpoint (--resume PATH)"), None)


def _read(saved: object) -> StoredSchedule | str:
    """A checkpoint's stored schedule, parsed and read; or why it is not one. Only the
    schedule is judged: what ``[run]`` decides (a failure rate for ``every = "auto"``)
    is this run's, which it has."""
    if not isinstance(saved, str):
        return f"expected canonical TOML text, found {describe(saved)}"
    try:
        found = StoredSchedule.parse(saved, "stored schedule")
        found.spec()
    except SpecError as exc:
        first = exc.problems[0] if exc.problems else None
        return (f"{len(exc.problems)} problem{'' if len(exc.problems) == 1 else 's'}, the "
                f"first: {first}" if first is not None else str(exc))
    return found


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
    #: this run's savers whose files a diff follows: name -> its ``keep``
    savers: Callable[[], Mapping[str, Policy | None]] = dict
    #: raises ``RunEnded`` when the run resumed at a step (the checkpoint's) had ended
    #: with its end unchanged: a requeue of an ended run has nothing to do, whatever
    #: schedule its checkpoint holds, so it is asked before the schedules are compared
    ended: Callable[[int], None] | None = None
    #: the rules applied at the last resume (``None``: the schedule did not change)
    carried: Carry | None = None
    #: the ``schedule_change`` line for ``events.jsonl``, until it is written
    record: dict[str, Any] | None = None
    #: lines to show once (the chief shows them)
    notes: list[str] = attrs.field(factory=list)
    #: ``text`` parsed (``stored``), kept until the text changes
    _parsed: StoredSchedule | None = attrs.field(default=None, init=False, repr=False)

    def check(self, path: Path | str, run: Mapping[str, Any],
              present: Present | None = None) -> None:
        """Compare the checkpoint's schedule with this run's; raise ``ScheduleChanged``
        when it differs and the rule is ``"refuse"``. ``present``: which of a saver's
        files are there now (``None``: as its ``keep`` left them)."""
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
        if self.ended is not None:
            self.ended(step)
        was = _read(saved)
        if isinstance(was, str):
            raise StoredScheduleError(shown, was)
        # Taken inside an epoch: after a step_end; otherwise after the epoch's end.
        phase = "step_end" if run.get("epoch_open", True) else "epoch_end"
        diff = self._diff(was, step, phase, run.get("callbacks"), present)
        rules = carry(was, self._own())
        if self.rule != "apply":
            raise ScheduleChanged(_refusal(shown, step, diff, rules), diff)
        self.carried = rules
        epoch = int(run["clock"]["now"]["epoch"])
        self.record = {"kind": "schedule_change", "step": step, "epoch": epoch,
                       "rule": "apply", **diff.to_dict()}
        self.notes.append(f"the schedule changed at step {step}: applying the new one "
                          "(schedule_change = \"apply\")")
        self.notes += summarized(self.carried.lines(), more="more callbacks")

    def stored(self) -> StoredSchedule | None:
        """This run's schedule parsed, once for each text it holds (``None``: none)."""
        if self.text is None:
            return None
        if self._parsed is None or self._parsed.text != self.text:
            self._parsed = StoredSchedule.parse(self.text, "running schedule")
        return self._parsed

    def take(self, new: StoredSchedule) -> None:
        """This run's schedule is now ``new`` (a live retime's, already parsed)."""
        self.text, self._parsed = new.text, new

    def _own(self) -> StoredSchedule:
        found = self.stored()
        assert found is not None
        return found

    def _diff(self, saved: StoredSchedule, step: int, phase: str, states: object,
              present: Present | None) -> ScheduleDiff:
        try:
            shape = self.shape()
        except ValueError:
            shape = None
        keep = self.savers()
        return diff_texts(saved, self._own(), shape=shape, from_step=step, phase=phase,
                          files=("checkpoint's schedule", "this run's schedule"),
                          keep=keep, saved=saved_records(states, keep),
                          present=present)

    def kept(self, states: Mapping[str, Any]) -> dict[str, Any]:
        """Of saved per-callback ``states``, those the resume keeps (all, when the
        schedule did not change)."""
        if self.carried is None:
            return dict(states)
        keep = set(self.carried.kept)
        return {n: s for n, s in states.items() if n in keep}


def _names(names: list[str], limit: int = 4) -> str:
    """A list of callback names, the first ``limit`` of thousands, each readable (the
    line stays within the 300 characters of a message)."""
    shown = ", ".join(repr(shorten(n, 60)) for n in names[:limit])
    more = f", ... and {len(names) - limit:,} more" if len(names) > limit else ""
    return f"[{shown}{more}]"


def _refusal(path: str, step: int, diff: ScheduleDiff, rules: Carry) -> str:
    saved = _names(sorted(rules.kept + rules.reset + rules.removed))
    ours = _names(sorted(rules.kept + rules.reset + rules.added))
    also = (f" (saved with callbacks {saved}, this run has {ours})"
            if rules.added or rules.removed else "")
    return (f"checkpoint {path!r} was saved with another schedule{also}; resuming at step "
            f"{step} would change it as follows:\n{diff.table().rstrip()}\n"
            "to resume with the new schedule, give --schedule-change apply "
            "(Trainer(schedule_change=\"apply\")); the rules are in docs/checkpoints.md")
