"""The run's journal: what a resumed run replays besides its checkpoint, in one order.

A checkpoint holds the run's state at its step; two things that happened around it live
in the run directory instead, and a resume replays them, always in this order:

1. **Retimes** (``RUN_DIR/retimes.json``, written by live retime): the table takes the
   schedule the checkpoint was taken with, and the retimes applied after the checkpoint's
   step are queued to be applied again at their steps (``Retimer.replay``). First,
   because the checkpoint is then checked against the schedule it was taken with.
2. **Interval decisions** of savers with ``every("auto")``, read back from
   ``events.jsonl`` while it still holds what the killed run wrote (it is cut back to the
   checkpoint's length when the run directory opens): a decision the checkpoint missed
   is made again as the killed run made it.

A fresh run forgets the retimes of an earlier run in its directory; a run that starts
over there (nothing valid to resume) replays them from the start.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from schedtrain.callbacks.autosave import read_decisions
from schedtrain.planning.requests import (
    ANSWER_FILE,
    HISTORY_FILE,
    REQUEST_FILE,
    History,
    read_history,
)
from schedtrain.readback import DamagedFile
from schedtrain.schedule.schedule import Schedule
from schedtrain.training.control.retime import Retimer, adopt

__all__ = ["RunJournal"]


class RunJournal:
    """Replays retimes, then interval decisions (the module's order).

    Args:
        retimer: the run's live retime (its table, schedule and queue of replays).
        callbacks: the run's callbacks (those with ``every("auto")`` read their decisions).
        schedule: the run's schedule as built (``None``: no decisions to read).
        events: ``events.jsonl`` (``None``: not written here).
    """

    def __init__(self, *, retimer: Retimer, callbacks: Iterable[Any],
                 schedule: Schedule | None, events: Path | None) -> None:
        self.retimer, self.callbacks = retimer, list(callbacks)
        self.schedule, self.events = schedule, events

    def replay(self, run: Mapping[str, Any]) -> None:
        """A checkpoint's ``run`` section, before it is checked and restored."""
        self._retimes(run)
        if (self.events is not None and self.schedule is not None
                and run.get("events_offset") is not None):
            read_decisions(self.callbacks, self.schedule, self.events)

    def _retimes(self, run: Mapping[str, Any]) -> None:
        """When this run's history starts from this trainer's schedule, the table takes
        the schedule the checkpoint was taken with, and the retimes after it are queued."""
        retimer = self.retimer
        history = self._read_history()
        saved, step = run.get("schedule"), int(run["clock"]["now"]["step"])
        if history is None:
            return
        texts = history.texts()
        at = [i for i, t in enumerate(texts) if t == saved
              and (i == 0 or history.applied[i - 1].step <= step)]
        if not at:
            return
        i = at[-1]
        if i:
            try:
                new = retimer._compile(texts[i], HISTORY_FILE)
            except Exception as exc:  # the journal's text, not this run's: refused
                where = (retimer.run_dir / HISTORY_FILE if retimer.run_dir is not None
                         else HISTORY_FILE)
                raise DamagedFile(where, f"applied[{i - 1}].schedule",
                                  f"expected a schedule this run can take: {exc}") from None
            adopt(retimer.table, new, tuple(retimer.table.names))
            retimer.change.text = texts[i]
        retimer.replay = list(history.applied[i:])

    def start_over(self) -> None:
        """A run that starts over in its directory replays its retimes from the start."""
        history = self._read_history()
        self.retimer.replay = list(history.applied) if history is not None else []

    def forget(self) -> None:
        """A fresh run: no retimes of an earlier run in its directory."""
        retimer = self.retimer
        retimer.history, retimer.replay = None, []
        if retimer.directory is not None:
            for name in (HISTORY_FILE, REQUEST_FILE, ANSWER_FILE):
                retimer.directory.remove_file(name)  # a directory there: refused, one line

    def _read_history(self) -> History | None:
        """``retimes.json`` when it starts from this run's schedule.

        Raises:
            DamagedFile: it is damaged: the retimes a resume would replay are unknown.
        """
        retimer = self.retimer
        history = read_history(retimer.run_dir) if retimer.run_dir is not None else None
        if history is None or history.base != retimer.change.text:
            retimer.history = None
            return None
        retimer.history = history
        return history
