"""``HostControl``: run control for a schedule inside a host (Lightning, the HF Trainer,
Ignite, a loop of your own): signals and cloud preemption notices, ``before_deadline``'s
deadline, and live retime through a folder.

Give it to the host's schedule callback (``control=HostControl("runs/lm", ...)``, the
same keyword in every host, and ``ScheduleDriver(..., control=...)``). The driver binds it
to its table and clock, opens it at ``train_start`` and calls ``drain`` at the end of
each optimizer step where it takes its slow path, after that step's firings: a
requested preemption is then kept in ``driver.preempt_requested`` and the host saves its
own way (Lightning's checkpoint, HF's, Ignite's ``Checkpoint``) and exits 75
(``HostPreempted``). A quiet step still costs one comparison: the next step the
control needs (``inbox.limit``: 0 once a signal or a notice arrives) is compared only
on steps where no trigger is due.

The folder holds what ``schedtrain retime DIR NEW`` reads and writes: ``run.json`` (this
job's status, pid, schedule and per-batch events), ``retime.json`` (a request),
``retime.answer.json`` and ``retimes.json`` (the retimes applied, replayed by a resumed
run after its checkpoint's step); ``.lock`` while the host trains. The host's own
checkpoints carry the schedule's text (``driver.state_dict()["schedule"]``).

Behind it is the own loop's owner of run control (``training.control.RunControl``), built
as ``schedtrain train`` builds it: the same inbox, notice poller, retimer and journal, so
a host's signals, notices and retimes follow the own loop's rules.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from schedtrain.callbacks.base import Callback
from schedtrain.errors import Preempted
from schedtrain.planning.changes import canonical
from schedtrain.schedule.schedule import Schedule
from schedtrain.schedule.table import TriggerTable
from schedtrain.spec.deadlines import DEFAULT_SIGNALS, check_deadline, check_notice, check_signals
from schedtrain.training.control import RunControl
from schedtrain.training.control.inbox import Inbox
from schedtrain.training.control.retime import Retimer
from schedtrain.training.control.schedule_change import ScheduleChange
from schedtrain.training.run_dir import RunDirectory

_T = TypeVar("_T")

__all__ = ["EXIT_PREEMPTED", "HostControl", "HostPreempted"]

#: A preempted host run's exit status (``EX_TEMPFAIL``, as ``schedtrain train``'s).
EXIT_PREEMPTED = 75


class HostPreempted(Preempted, SystemExit):
    """A host run preempted (a signal, a cloud notice) after its step and the host's own
    checkpoint: the process exits 75 with one line said, no traceback. A ``SystemExit``
    (a script that catches ``Exception`` broadly still exits: Python reads its ``code``),
    and the own loop's ``Preempted`` (``except schedtrain.Error`` catches it)."""

    def __init__(self, signal: str, step: int, checkpoint: str | Path | None) -> None:
        super().__init__(signal, step, checkpoint)
        where = f"checkpoint {checkpoint}" if checkpoint is not None else "no checkpoint"
        self.line = f"preempted by {signal} after step {step}: {where}"
        self.args = (self.line,)
        self.code = EXIT_PREEMPTED  # what the interpreter exits with


def _refuse(key: str, why: str | None) -> None:
    if why is not None:
        raise ValueError(f"HostControl({key}=...): {why}")


class HostControl:
    """Run control for a host's schedule (see the module docstring): the options a host
    callback is given, and the folder's ``run.json`` and lock around the one owner of run
    control (``training.control.RunControl``, as ``schedtrain train`` builds it), which
    the driver binds to its table and clock.

    Args:
        run_dir: the folder ``schedtrain retime`` is pointed at (``None``: no retime
            through a folder; ``retimer.retime`` still works). The host's preemption
            checkpoint goes there when the host has no place of its own.
        preempt_signals: the signals that preempt (``[run] preempt_signals``).
        handle_signals: install their handlers (main thread only, while training).
        preempt_notice: a cloud's metadata server to poll (``[run] preempt_notice``:
            ``"aws"``, ``"gce"``, ``"aws+http://HOST:PORT"``...).
        deadline: the run's deadline (``[run] deadline``: an ISO time or ``"23 h"``);
            ``SLURM_JOB_END_TIME`` is read too.
    """

    def __init__(self, run_dir: str | Path | None = None, *,
                 preempt_signals: Sequence[str] = DEFAULT_SIGNALS, handle_signals: bool = True,
                 preempt_notice: str | None = None, deadline: str | None = None) -> None:
        _refuse("preempt_signals", check_signals(preempt_signals))
        if preempt_notice is not None:
            _refuse("preempt_notice", check_notice(preempt_notice))
        if deadline is not None:
            _refuse("deadline", check_deadline(deadline))
        if not isinstance(handle_signals, bool):
            _refuse("handle_signals", f"expected True or False, got {handle_signals!r}")
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.signals = tuple(preempt_signals)
        self.handle_signals, self.notice, self.deadline = handle_signals, preempt_notice, deadline
        self.directory = None if self.run_dir is None else RunDirectory(self.run_dir)
        self._owner: RunControl | None = None
        self._clock: Any = None
        self._table: TriggerTable | None = None

    # -- the driver binds it -------------------------------------------------------------
    def bind(self, *, table: TriggerTable, clock: Any, callbacks: Mapping[str, Callback],
             schedule: Schedule | None, metrics: frozenset[str] = frozenset()) -> None:
        """Serve one driver: its table, clock, schedtrain callbacks by name and schedule
        (``None``: a compiled table, which has no stored form to retime)."""
        if self._table is not None and self._table is not table:
            raise ValueError("this HostControl already serves another schedule: give each "
                             "host callback its own")
        self._table, self._clock = table, clock
        # A callback bound to a host function keeps no state of schedtrain's: a plain
        # Callback stands for it where a retime resets a changed trigger's callback.
        by_name = {n: callbacks.get(n) or Callback() for n in table.names}
        self._owner = RunControl.build(
            table=table, callbacks=by_name, position=lambda: (clock.step, clock.epoch),
            time_ns=lambda: clock.time_ns,
            change=ScheduleChange(canonical(schedule) if schedule is not None else None),
            predicates=table.predicates or {}, produced=metrics, run_dir=self.run_dir,
            directory=self.directory, handle_signals=self.handle_signals,
            signals=self.signals, notice=self.notice, deadline=self.deadline)

    @property
    def owner(self) -> RunControl:
        """The run's control (the driver bound it)."""
        if self._owner is None:
            raise RuntimeError("HostControl is not bound yet: give it to a host's schedule "
                               "callback (control=...) first")
        return self._owner

    @property
    def inbox(self) -> Inbox:
        """The requests from other threads (signals, notices) and the next step drained."""
        return self.owner.inbox

    @property
    def retimer(self) -> Retimer:
        """Live retime's Python API: ``retimer.retime(schedule)`` (the driver bound it)."""
        return self.owner.retimer

    def reports_every_batch(self) -> None:
        """The host calls the driver's ``batch_end`` after every micro-batch (Lightning
        does): a retime may add ``batch_end`` triggers (``run.json``'s ``batch_events``)."""
        self.owner.reports_every_batch()

    @property
    def schedule_text(self) -> str | None:
        """The schedule the run runs now (canonical TOML; ``None``: no stored form)."""
        return self.retimer.change.text

    # -- the run -------------------------------------------------------------------------
    @contextlib.contextmanager
    def open(self, *, fresh: bool, resumed: bool) -> Iterator[None]:
        """Around training: the folder locked and said ``running`` in ``run.json``, and
        run control opened (signals, the notice poller, the deadline to the table; a
        fresh run forgets an earlier run's retimes in the folder). The way it ends is
        recorded: ``preempted`` (``HostPreempted``), ``failed`` (another exception),
        ``finished``."""
        owner, directory = self.owner, self.directory
        if directory is not None:
            directory.acquire()
        outcome = "failed"
        try:
            with owner.open(fresh=fresh, resumed=resumed):
                self._record("running")
                owner.inbox.set_limit(self.next_step)
                try:
                    yield
                except HostPreempted:
                    outcome = "preempted"
                    raise
                outcome = "finished"
        finally:
            with contextlib.suppress(OSError):
                self._record(outcome)
            if directory is not None:
                directory.release()

    def _record(self, status: str) -> None:
        if self.directory is not None:
            retimer, clock = self.retimer, self._clock
            self.directory.record(status, step=clock.step, epoch=clock.epoch,
                                  schedule=retimer.change.text,
                                  batch_events=list(retimer.fires))

    def collect(self) -> bool:
        """Before the step's firings: a notice's deadline to the table (its
        ``before_deadline`` triggers are looked at there). Returns whether one came."""
        return self.owner.collect()

    def drain(self, step: int, due: bool) -> str | None:
        """After the step's firings, on the slow path: retimes replayed at this step, a
        waiting retime request applied. Returns the name of a requested preemption
        (``"SIGTERM"``, ``"the AWS preemption notice"``) once a step end's triggers have
        seen its deadline (a notice that came during the firings waits for the next step
        end, as in the own loop), else ``None``."""
        return self._adopting(lambda: self.owner.drain(step, due))

    def _adopting(self, change: Callable[[], _T]) -> _T:
        """``change`` (a retime applied, or a checkpoint's schedule taken), and what it
        returns; a table that adopted another schedule fires ``batch_end`` where the new
        one listens (a host reports every batch end, or its retimes add none:
        ``reports_every_batch``)."""
        table = self._table
        assert table is not None
        before = table.triggers
        found = change()
        if table.triggers is not before:
            table.needs_batch_end = bool(table.listeners("batch_end"))
        return found

    @property
    def next_step(self) -> float:
        """The next step the driver must take its slow path for (a replayed retime, a
        look for a request)."""
        return self.owner.next_step

    def replay(self, run: Mapping[str, Any]) -> None:
        """A checkpoint's state on resume (its ``schedule`` and ``clock``): the table
        takes the schedule it was saved with, and the retimes after its step are replayed
        there."""
        self._adopting(lambda: self.owner.replay(run))

    def waiting_bits(self) -> int:
        """Nothing for other ranks: a host's control runs on one process."""
        return 0

    def take(self, bits: int) -> None:
        """Nothing from other ranks (one process)."""


def say_preempted(exc: HostPreempted) -> None:
    """The preemption's one line, on standard error (a ``SystemExit`` prints none)."""
    print(f"schedtrain: {exc.line}", file=sys.stderr, flush=True)
