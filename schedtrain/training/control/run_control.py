"""``RunControl``: the one owner of what changes a run from outside its loop.

The loop, the lifecycle, the agreement between ranks and a host's driver talk to it and
to nothing else of run control::

    lifecycle ── open(fresh, resumed) ──┐      signals, notice poller, old retimes,
                 replay(run) (resume) ──┤      the run's deadline to the table
    loop ─────── next_step (limit) ─────┤
                 collect() (before step_end: what this step end's triggers see)
                 drain(step, due) ──────┼──→ Inbox (signal, notice + deadline, landed save)
    agreement ── waiting_bits()/take() ─┤    Retimer (replays, requests)
    host ─────── drain(step, due) ──────┘    RunJournal (retimes, then auto decisions)

It is built before the run state and the agreement (``RunControl.build``), which take
what they need of it in their constructors (``replay``; ``waiting_bits``/``take``).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from schedtrain.callbacks.base import Callback
from schedtrain.distributed.comm import Comm
from schedtrain.monitors.jsonl import JsonlWriter
from schedtrain.planning.changes import canonical
from schedtrain.schedule.schedule import Schedule
from schedtrain.schedule.table import TriggerTable
from schedtrain.spec.deadlines import DEFAULT_SIGNALS, signals_of
from schedtrain.training.control.inbox import Inbox, deadline_on_clock, handle_signals
from schedtrain.training.control.journal import RunJournal
from schedtrain.training.control.notice import watch_notices
from schedtrain.training.control.retime import Retimer, RunFolder
from schedtrain.training.control.schedule_change import ScheduleChange

__all__ = ["RETIME", "RunControl"]

#: ``waiting_bits``: a live retime request waits on the chief (every rank takes it).
RETIME: Final = 1


def _nothing() -> None:
    """No background save to collect (a host saves its own way)."""


class RunControl:
    """Run control's owner (built by ``build``).

    Args:
        inbox: the requests from other threads and processes, and the loop's limit.
        retimer: live retime (``trainer.retimer``).
        journal: what a resume replays besides the checkpoint.
        table: the run's compiled table (its deadline is set here).
        comm: the ranks' communicator (``None``: one process).
        time_ns: the clock's training time now (the axis deadlines are put on).
        collect_save: commit (or fail) a background save that landed.
        signals: the signals that preempt (``None``: none are handled).
        notice: ``[run] preempt_notice`` (``None``: no poller).
        deadline: ``[run] deadline`` (``None``: the scheduler's job end, if any).
    """

    def __init__(self, *, inbox: Inbox, retimer: Retimer, journal: RunJournal,
                 table: TriggerTable, comm: Comm | None, time_ns: Callable[[], int],
                 collect_save: Callable[[], None],
                 signals: tuple[signal.Signals, ...] | None, notice: str | None,
                 deadline: str | None) -> None:
        self.inbox, self.retimer, self.journal = inbox, retimer, journal
        self.table, self.comm, self.time_ns = table, comm, time_ns
        self.collect_save, self.signals = collect_save, signals
        self.notice, self.deadline = notice, deadline
        #: the last agreement carried the chief's word that a retime request waits
        self._asked = False
        #: ``collect`` ran at this slow path (before ``step_end``): ``drain`` leaves what
        #: arrived since then to the next step end, whose triggers will see it
        self._collected = False

    @classmethod
    def build(cls, *, table: TriggerTable, callbacks: Mapping[str, Callback],
              position: Callable[[], tuple[int, int]], time_ns: Callable[[], int],
              schedule: Schedule | None = None, change: ScheduleChange | None = None,
              predicates: Mapping[str, Any] | None = None,
              produced: frozenset[str] = frozenset(),
              run_dir: Path | None = None, directory: RunFolder | None = None,
              events: JsonlWriter | None = None, comm: Comm | None = None,
              collect_save: Callable[[], None] = _nothing, handle_signals: bool = True,
              signals: Sequence[str] = DEFAULT_SIGNALS, notice: str | None = None,
              deadline: str | None = None) -> RunControl:
        """Run control for a run: the own loop's assembly, or a host's driver.

        Args:
            table: the compiled table; callbacks: the callbacks by name.
            position: the clock's ``(step, epoch)`` now; time_ns: its training time.
            schedule: the schedule as built (``every("auto")`` decisions replayed).
            change: the run's schedule and its rule at resume (default: ``schedule``'s
                canonical text, refused when changed).
            predicates, produced: what the table was compiled with.
            run_dir: the folder a retime request is looked for in (``None``: none).
            directory: the chief's run directory (``run.json``, the request removed).
            events: ``events.jsonl`` (``None``: not written here).
            comm: the ranks' communicator (``None``: one process).
            collect_save: commit a background save that landed (the loop's saves).
            handle_signals, signals: route these signals to the inbox (main thread).
            notice: a cloud's notice server to poll; deadline: ``[run] deadline``.
        """
        if change is None:
            change = ScheduleChange(canonical(schedule) if schedule is not None else None)
        retimer = Retimer(
            table=table, change=change, callbacks=callbacks, predicates=dict(predicates or {}),
            produced=produced, run_dir=run_dir, directory=directory,
            events=events, comm=comm, position=position)
        journal = RunJournal(retimer=retimer, callbacks=callbacks.values(), schedule=schedule,
                             events=events.path if events is not None else None)
        return cls(inbox=Inbox(), retimer=retimer, journal=journal, table=table, comm=comm,
                   time_ns=time_ns, collect_save=collect_save,
                   signals=signals_of(signals) if handle_signals else None, notice=notice,
                   deadline=deadline)

    # -- the lifecycle -------------------------------------------------------------------------
    @contextlib.contextmanager
    def open(self, *, fresh: bool, resumed: bool) -> Iterator[None]:
        """Around training: a fresh run forgets an earlier run's retimes, one that starts
        over (neither ``fresh`` nor ``resumed``) replays them from the start, and a
        retime replayed at the step the run goes on from is applied now; the run's
        deadline goes to the table (before it is attached); signals and the notice
        poller route to the inbox until the block ends."""
        inbox = self.inbox
        inbox.requested = inbox.deadline = None
        if fresh:
            self.journal.forget()
        elif not resumed:
            self.journal.start_over()
        self.retimer.poll(self.retimer.position()[0], due=False, replay_only=True)
        ns = deadline_on_clock(self.comm, self.time_ns(), self.deadline)
        self.table.deadline_ns = None  # this fit's own: a host's table is attached already
        if ns is not None:
            self.table.set_deadline(ns)
        with contextlib.ExitStack() as stack:
            if self.signals is not None:
                stack.enter_context(handle_signals(inbox, self.signals))
            stack.enter_context(watch_notices(inbox, self.notice, self.comm))
            yield

    def reports_every_batch(self) -> None:
        """The loop (a host) reports every batch end: a retime may add ``batch_end``
        triggers (``run.json``'s ``batch_events``, which the retime command reads)."""
        self.retimer.fires = ("batch_end",)

    def start_over(self) -> None:
        """The run starts over in its directory (nothing valid to resume): its journal's
        retimes are read now, so a damaged one refuses the resume before anything is
        changed (``open`` queues them again)."""
        self.journal.start_over()

    def replay(self, run: Mapping[str, Any]) -> None:
        """A checkpoint's ``run`` section on resume, before it is checked: the journal's
        retimes, then its interval decisions (``control.journal``)."""
        self.journal.replay(run)

    # -- the loop ------------------------------------------------------------------------------
    @property
    def next_step(self) -> float:
        """The next step the loop must take its slow path at for run control: a retime
        replayed there, or one process's look for a request."""
        retimer = self.retimer
        return min(retimer.next_step, retimer.look_step)

    def collect(self) -> bool:
        """What arrived since the last slow path and this step end's triggers must see:
        a notice's deadline to the table (``before_deadline``), a background save that
        landed committed (or its failure raised). Returns whether a deadline was given."""
        self._collected = True
        inbox, given = self.inbox, False
        if inbox.deadline is not None:
            deadline = inbox.take_deadline(self.time_ns())
            if deadline is not None:
                self.table.set_deadline(deadline)
                given = True
        if inbox.woken:
            inbox.woken = False
            self.collect_save()
        return given

    def drain(self, step: int, due: bool, *, look: bool = False) -> str | None:
        """The slow path's call after ``step_end`` (``due``: a trigger was due, where ranks
        agree; ``look``: the loop folded its losses here, so one process looks for a
        request now): what ``collect`` does, unless it ran before this ``step_end`` (a
        notice that came during it waits for the next step end), retimes replayed at
        this step, a waiting request applied. Returns the name of a requested
        preemption that may be acted on now (its deadline already seen by a step end),
        else ``None``."""
        given = False if self._collected else self.collect()
        self._collected = False
        asked, self._asked = due and self._asked, self._asked and not due
        self.retimer.poll(step, due, asked=asked, look=look)
        inbox = self.inbox
        return inbox.requested if inbox.deadline is None and not given else None

    # -- the agreement -------------------------------------------------------------------------
    def waiting_bits(self) -> int:
        """What the chief carries to every rank in their next agreement (``RETIME``)."""
        retimer = self.retimer
        return RETIME if retimer.chief and retimer.waiting() else 0

    def take(self, bits: int) -> None:
        """The bits the ranks agreed on (the chief's ``waiting_bits``)."""
        self._asked = bool(bits & RETIME)
