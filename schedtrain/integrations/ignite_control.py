"""Run control on an Ignite ``Engine``: a preemption saved by Ignite's ``Checkpoint``,
then exit 75, and the run control opened and closed with the engine's run.

``attach_schedule(..., control=HostControl(...))`` gives the schedule's driver its run
control (signals, cloud notices, ``before_deadline``'s deadline, live retime: see
``integrations.host_control``). The driver opens it when the engine starts and drains
it at the step ends it evaluates; what is Ignite's is here:

* A preemption (a signal, a notice) asked for at a step end: ``engine.terminate(
  skip_completed=True)``, so the iteration's other handlers still run and no
  ``COMPLETED`` handler does (the run is not complete: no final evaluation, no
  ``train_end``). Then, after the user's ``TERMINATE`` handlers, ``preempt`` fires and an
  Ignite ``Checkpoint`` of ``handle.to_save`` (``to_save`` and the schedule, under
  ``"schedule"``) is written by ``save_handler`` with the prefix ``preempted``, and
  ``HostPreempted`` (a ``SystemExit``: exit status 75, no traceback) ends the process
  with one line. ``Checkpoint.load_objects(handle.to_save, path)`` then ``engine.run``
  resumes it as the uninterrupted run goes on.
* The run control is closed when the run ends: ``COMPLETED`` (the driver's train_end),
  a ``terminate(skip_completed=True)`` of the user's, or an exception (an
  ``EXCEPTION_RAISED`` handler added last when the engine starts: it re-raises only where
  Ignite would have, that is when no other handler of that event is registered, and
  always a preemption's exit).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ignite.engine import Engine, Events
from ignite.handlers import Checkpoint, DiskSaver
from ignite.handlers.checkpoint import BaseSaveHandler

from schedtrain.checkpoints.files import remove
from schedtrain.integrations.host_control import HostPreempted, say_preempted
from schedtrain.integrations.hosted import CallbackDriver

if TYPE_CHECKING:
    from schedtrain.integrations.driver import ScheduleDriver

__all__ = ["PREEMPTED_PREFIX", "SCHEDULE_KEY", "IgniteControl", "SaveHandler", "check_to_save"]

#: The key of the schedule's state in ``handle.to_save`` (and so in the checkpoints).
SCHEDULE_KEY: Final = "schedule"
#: The file name prefix of a preemption's checkpoint (``preempted_checkpoint_120.pt``).
PREEMPTED_PREFIX: Final = "preempted"

SaveHandler = str | Path | BaseSaveHandler
"""Where a preemption's checkpoint goes: a folder, or an Ignite save handler."""


def check_to_save(to_save: object, save_handler: object, run_dir: Path | None) -> None:
    """Refuse a ``to_save`` or ``save_handler`` a preemption could not save with (one line
    naming the argument)."""
    if to_save is None:
        if save_handler is not None:
            raise ValueError("attach_schedule(save_handler=...) saves a preemption's "
                             "checkpoint of to_save: give to_save={'model': model, ...} too")
        return
    if not isinstance(to_save, Mapping) or not all(isinstance(k, str) for k in to_save):
        raise TypeError(f"attach_schedule(to_save=...) must be a dict of names to objects "
                        f"with state_dict (as Checkpoint's), got {to_save!r}"[:300])
    if SCHEDULE_KEY in to_save:
        raise ValueError(f"attach_schedule(to_save=...) has a key {SCHEDULE_KEY!r}: it is "
                         "the schedule's own (handle.to_save adds it); name yours otherwise")
    for name, obj in to_save.items():
        if not (callable(getattr(obj, "state_dict", None))
                and callable(getattr(obj, "load_state_dict", None))):
            raise TypeError(f"attach_schedule(to_save[{name!r}]) has no state_dict and "
                            f"load_state_dict: got {obj!r}"[:300])
    if save_handler is None and run_dir is None:
        raise ValueError("attach_schedule(to_save=...) needs where a preemption's checkpoint "
                         "goes: save_handler= (a folder or an Ignite save handler), or "
                         "control=HostControl(run_dir) (then RUN_DIR/checkpoints)")
    if save_handler is not None and not isinstance(save_handler, str | Path | BaseSaveHandler):
        raise TypeError(f"attach_schedule(save_handler=...) must be a folder or an Ignite "
                        f"BaseSaveHandler (DiskSaver...), got {save_handler!r}"[:300])


def _last(engine: Engine) -> bool:
    """Whether this is the run's last iteration: there a preemption lets the run complete
    (its end's handlers are all that is left), since Ignite runs an engine resumed at its
    last iteration again from the start."""
    st = engine.state
    total = st.max_iters
    if total is None and st.epoch_length is not None and st.max_epochs is not None:
        total = st.epoch_length * st.max_epochs
    return total is not None and st.iteration >= total


class _DropRepeat(logging.Filter):
    """Drops Ignite's own error line for the preemption's exit (its line was said once),
    then takes itself off the logger."""

    def __init__(self, logger: logging.Logger, line: str) -> None:
        super().__init__()
        self.logger, self.line = logger, line

    def filter(self, record: logging.LogRecord) -> bool:
        if self.line in record.getMessage():
            self.logger.removeFilter(self)
            return False
        return True


class IgniteControl:
    """The engine's side of a driver's run control (see the module docstring).

    Args:
        driver: the schedule's driver, built with ``control=``.
        to_save: what a preemption's checkpoint holds besides the schedule (``None``:
            none is written).
        save_handler: where it goes (``None``: ``RUN_DIR/checkpoints``).
        schedule: the object saved under ``"schedule"`` (the ``ScheduleHandle``).
        run_actions: runs the engine's actions of the callbacks that fired (``preempt``).
    """

    def __init__(self, driver: ScheduleDriver, to_save: Mapping[str, Any] | None,
                 save_handler: SaveHandler | None, schedule: Any,
                 run_actions: Callable[[Engine, tuple[str, ...]], None]) -> None:
        self.driver = driver
        self._run_actions = run_actions
        self._to_save = None if to_save is None else {**to_save, SCHEDULE_KEY: schedule}
        self._save_handler = save_handler
        #: the preemption being acted on (``"SIGTERM"``...; ``None``: none)
        self.preempted: str | None = None
        #: the preemption's checkpoint, once written
        self.checkpoint: str | Path | None = None

    @property
    def to_save(self) -> dict[str, Any]:
        """``to_save`` with the schedule under ``"schedule"``: for the user's own
        ``Checkpoint`` and for ``Checkpoint.load_objects`` on resume."""
        if self._to_save is None:
            raise ValueError("attach_schedule was given no to_save: pass to_save={'model': "
                             "model, 'optimizer': optimizer, 'trainer': engine}")
        return dict(self._to_save)

    def attach(self, engine: Engine) -> None:
        """Follow the ends of ``engine``'s runs (after the schedule's own handlers)."""
        engine.add_event_handler(Events.STARTED, self._started)
        engine.add_event_handler(Events.TERMINATE, self._terminated)
        engine.add_event_handler(Events.COMPLETED, self._completed)

    def _completed(self, _: Engine) -> None:
        """A completed run: the preemption checkpoints in its save folder are older than
        what it trained (another kind of save handler cannot be listed: they stay)."""
        if self._to_save is None:
            return
        given = self._save_handler
        if isinstance(given, DiskSaver):
            folder = given.dirname
        elif given is None or isinstance(given, str | Path):
            folder = self._folder()
        else:
            return
        if folder.is_dir():  # not made here for nothing
            for old in sorted(folder.glob(f"{PREEMPTED_PREFIX}_*")):
                remove(old)  # the checkpoint owner's delete

    # -- the engine's events ---------------------------------------------------------------
    def _started(self, engine: Engine) -> None:
        self.preempted = self.checkpoint = None
        if not engine.has_event_handler(self._raised, Events.EXCEPTION_RAISED):
            engine.add_event_handler(Events.EXCEPTION_RAISED, self._raised)

    def step_ended(self, engine: Engine, *, acted: bool) -> None:
        """After a step end's firings and actions (``acted``: an action ran): what those
        actions asked for is taken after this step, as the own loop does (a retime by
        ``handle.retimer.retime`` or the request file, a SIGTERM); then act on a
        preemption the driver was asked for."""
        driver = self.driver
        if acted:  # the driver drained before Ignite's actions ran: once more after them
            self._drain_after_actions(driver.clock.step)
        found = driver.preempt_requested
        if found is None or self.preempted is not None or _last(engine):
            return
        self.preempted = found
        # The iteration's other handlers run, then TERMINATE's: the save comes after them.
        engine.terminate(skip_completed=True)
        engine.add_event_handler(Events.TERMINATE, self._save_and_exit)

    def _drain_after_actions(self, step: int) -> None:
        """Drain run control after this step's actions. A signal that came meanwhile
        preempts here; a notice waits for the next step end, whose triggers see its
        deadline (``before_deadline`` fires where the run stops, as in the own loop)."""
        driver, control = self.driver, self.driver.control
        assert control is not None
        inbox, table = control.inbox, driver.table
        triggers = table.triggers
        found = control.drain(step, False)
        if table.triggers is not triggers:
            driver.on_retime()
        inbox.set_limit(control.next_step)
        if found is not None and driver.preempt_requested is None:
            driver.preempt_requested = found

    def _terminated(self, engine: Engine) -> None:
        """The user's ``terminate(skip_completed=True)``: no COMPLETED (no train_end)
        comes to close the run control; a preemption closes it after its save."""
        if self.preempted is None and engine.should_terminate == "skip_completed":
            self.driver.close_control()

    def _save_and_exit(self, engine: Engine) -> None:
        engine.remove_event_handler(self._save_and_exit, Events.TERMINATE)
        driver, step = self.driver, self.driver.clock.step
        self._run_actions(engine, driver.fire("preempt"))  # before the save, as the own loop
        self.checkpoint = self._save(engine)
        exc = HostPreempted(self.preempted or "?", step, self.checkpoint)
        if isinstance(driver, CallbackDriver):
            driver.exception(exc)  # after_train (outcome "preempted"); closes the control
        else:
            driver.close_control(exc)
        say_preempted(exc)
        engine.logger.addFilter(_DropRepeat(engine.logger, exc.line))
        raise exc

    def _folder(self) -> Path:
        """The folder given as ``save_handler`` (by default ``RUN_DIR/checkpoints``)."""
        given = self._save_handler
        if given is None:
            run_dir = getattr(self.driver.control, "run_dir", None)
            assert run_dir is not None  # checked by check_to_save
            return Path(run_dir) / "checkpoints"
        assert isinstance(given, str | Path)
        return Path(given)

    def _handler(self) -> BaseSaveHandler:
        given = self._save_handler
        if isinstance(given, BaseSaveHandler):
            return given
        return DiskSaver(self._folder(), require_empty=False)  # the user's may be there too

    def _save(self, engine: Engine) -> str | Path | None:
        if self._to_save is None:
            return None
        ckpt = Checkpoint(self._to_save, self._handler(), filename_prefix=PREEMPTED_PREFIX,
                          n_saved=None, global_step_transform=lambda e, _: e.state.iteration)
        ckpt(engine)
        return ckpt.last_checkpoint

    def _raised(self, engine: Engine, exc: BaseException) -> None:
        """The run failed (or a preemption exits): close the run control; raise again
        where Ignite would have (no other handler of this event), and a preemption's exit
        whatever the other handlers did with it."""
        if isinstance(exc, HostPreempted):
            raise exc
        self.driver.close_control(exc)
        # Ignite's own handlers read the table of handlers so (handlers.time_profilers)
        if all(h == self._raised for h, _, _ in engine._event_handlers[Events.EXCEPTION_RAISED]):
            raise exc
