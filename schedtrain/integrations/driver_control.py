"""A driver's side of run control (``control=HostControl(...)``), torch-free.

``ControlledSteps`` is the part of ``ScheduleDriver`` that talks to run control, through
the calls every owner of it has (``Control``): bound when the driver is built, opened at
``train_start`` (fresh, or resumed from a state that ``load_state_dict`` replayed), and
drained at each step end where the driver takes its slow path, after that step's
firings. The quiet step compares the step with the trigger table's ``step_due`` and,
only when that says quiet, with ``inbox.limit`` (the next step the control needs: 0 once
a signal or notice arrived).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from schedtrain.clock import LoopClock
    from schedtrain.integrations.ranks import RankAgreement
    from schedtrain.schedule.schedule import Schedule
    from schedtrain.schedule.table import TriggerTable

__all__ = ["AUTO_REFUSED", "Control", "ControlledSteps", "refuse_auto"]

#: Why each host cannot pace ``every("auto")``: it needs each save's measured cost, and
#: a resumed run must replay the interval decided after a save its checkpoint was taken
#: before (the own loop reads it back from events.jsonl).
AUTO_REFUSED: Final = {
    "Lightning": "the decision made after each save lands is in no Lightning checkpoint "
                 "and no log Lightning keeps, so a resumed fit would place its saves "
                 "elsewhere",
    "the HF Trainer": "the cost of HF's save is known at on_save, after the checkpoint's "
                      "trainer_state.json was written, so a resumed run would lack the "
                      "interval decided from it",
    "Ignite": "an Ignite Checkpoint it runs could be timed, but the interval decided from "
              "it comes after that Checkpoint is written, so a resume from it would save "
              "elsewhere",
}
_OWN_LOOP = "your loop saves its own way, which the driver cannot time"


def refuse_auto(table: TriggerTable, host: str) -> None:
    """Refuse ``every("auto")`` in ``host`` (its name), saying why there (one line)."""
    from schedtrain.errors import one_line
    from schedtrain.triggers.auto import auto_parts

    for name, trigger in zip(table.names, table.triggers, strict=True):
        if auto_parts(trigger):
            raise ValueError(one_line(  # a long name is shortened, not the line broken
                f"callback {name!r}: every('auto') paces saves by their measured cost, and "
                f"{AUTO_REFUSED.get(host, _OWN_LOOP)}: give the interval, such as "
                "every(500, 'steps')"))


class _Inbox(Protocol):
    limit: float

    def set_limit(self, limit: float) -> None: ...


class Control(Protocol):
    """What a driver asks of run control (``HostControl``; the own loop's owner has the
    same calls): bound once, opened around training, drained on the slow path."""

    @property
    def inbox(self) -> _Inbox: ...
    def bind(self, *, table: TriggerTable, clock: Any, callbacks: Mapping[str, Any],
             schedule: Schedule | None, metrics: frozenset[str] = ...) -> None: ...
    def open(self, *, fresh: bool, resumed: bool) -> contextlib.AbstractContextManager[None]: ...
    def collect(self) -> bool: ...
    def drain(self, step: int, due: bool) -> str | None: ...
    @property
    def next_step(self) -> float: ...
    @property
    def schedule_text(self) -> str | None: ...
    def replay(self, run: Mapping[str, Any]) -> None: ...


class ControlledSteps:
    """Run control's calls in a driver (mixed into ``ScheduleDriver``)."""

    table: TriggerTable
    clock: LoopClock
    _started: bool
    ranks: RankAgreement | None
    _held: list[str] | None  # the events a host holds (``ScheduleDriver.held``)

    def fire(self, event: str) -> tuple[str, ...]:
        raise NotImplementedError

    def bind_control(self, control: Control | None, schedule: Schedule | None,
                     metrics: frozenset[str]) -> None:
        """Keep ``control`` (``None``: none) and bind it to this driver's table, clock and
        ``schedule`` (``None``: none stored), whose triggers read ``metrics``."""
        #: run control (``None``: none)
        self.control = control
        self._inbox: _Inbox | None = None
        self._open: contextlib.ExitStack | None = None
        self._resumed = False
        self._drain_after: bool | None = None  # a held step end's drain: due or not
        #: the preemption a signal or notice asked for (``"SIGTERM"``...), for the host
        #: to save its own way and exit on; ``None``: none
        self.preempt_requested: str | None = None
        #: called after a retime changed the table (a host reads the metrics it names)
        self.on_retime: Callable[[], None] = lambda: None
        if control is not None:
            control.bind(table=self.table, clock=self.clock,
                         callbacks=getattr(self, "callbacks", {}), schedule=schedule,
                         metrics=metrics)
            self._inbox = control.inbox

    def replay_control(self, state: Mapping[str, Any]) -> None:
        """A loaded state (checked): the schedule it was saved with, and the retimes after
        its step (before the triggers' states are loaded: they are that schedule's)."""
        assert self.control is not None
        triggers = self.table.triggers
        self.control.replay(state)
        if self.table.triggers is not triggers:  # the checkpoint's schedule, adopted
            self.on_retime()

    def open_control(self) -> None:
        """Open run control for training (at ``train_start``, once the ranks are known)."""
        control = self.control
        if control is None or self._open is not None:
            return
        if self.ranks is not None:
            raise ValueError("control=HostControl(...) runs on one process: under "
                             "torch.distributed its signals and retimes would reach the "
                             "ranks at different steps; leave it out of multi-process runs")
        self.preempt_requested = None
        stack = contextlib.ExitStack()
        # A driver that started before goes on (Ignite runs a terminated engine on): its
        # retimes are this run's, not an earlier run's to forget.
        fresh = not (self._resumed or self._started)
        stack.enter_context(control.open(fresh=fresh, resumed=self._resumed))
        self._open = stack
        if self._resumed:  # a retime applied at the checkpoint's step, after it was taken
            self._drain(False)

    def close_control(self, exc: BaseException | None = None) -> None:
        """End run control (``train_end``, or the run failed or was preempted with
        ``exc``): handlers restored, the poller stopped, the way it ended recorded."""
        stack, self._open = self._open, None
        if stack is None:
            return
        if exc is None:
            stack.close()
        else:
            stack.__exit__(type(exc), exc, exc.__traceback__)

    @property
    def due_step(self) -> float:
        """The first step whose end is not quiet: the table's next due step, or the
        control's, which a signal or a notice lowers to 0 at any time (a host that skips
        quiet steps, as Ignite's filter does, reads it at each step)."""
        inbox = self._inbox
        due = self.table.step_due
        return due if inbox is None else min(due, inbox.limit)

    def slow_step_end(self) -> tuple[str, ...]:
        """A step end past the quiet comparison: its firings where a trigger is due; with
        run control, what this step end's triggers must see first (``collect``: a notice's
        deadline), ``drain`` after."""
        control, clock = self.control, self.clock
        if control is None:
            return self.fire("step_end")
        control.collect()  # a deadline lowers step_due: its triggers are looked at now
        due = clock.step >= self.table.step_due
        fired = self.fire("step_end") if due else ()
        if self._held is not None:  # its firings decided later: drained after them
            self._drain_after = due
            return fired
        self._drain(due)
        return fired

    def drain_held(self) -> None:
        """The events a host held (``held``: the HF Trainer decides a step end after its
        evaluation) are decided: drain what their step end left, after its firings, as
        an unheld one is (a retime applies from the next step on)."""
        due, self._drain_after = self._drain_after, None
        if due is not None:
            self._drain(due)

    def _drain(self, due: bool) -> None:
        control, inbox = self.control, self._inbox
        assert control is not None and inbox is not None
        triggers = self.table.triggers
        found = control.drain(self.clock.step, due)
        if found is not None and self.preempt_requested is None:
            self.preempt_requested = found
        if self.table.triggers is not triggers:  # retimed: adopted in place
            self.on_retime()
        inbox.set_limit(control.next_step)
