"""``ScheduleHandle``: a schedule following an Ignite ``Engine``'s events, its state for
Ignite's ``Checkpoint`` and its run control (``ignite_control``). Made by
``integrations.ignite.attach_schedule``, whose docstring maps Ignite's counters and
events to the clock."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ignite.engine import Engine, Events

from schedtrain.integrations.driver import ScheduleDriver
from schedtrain.integrations.hosted import CallbackDriver
from schedtrain.integrations.ignite_control import IgniteControl, SaveHandler
from schedtrain.integrations.ranks import reads_time

if TYPE_CHECKING:
    from schedtrain.training.control.retime import Retimer

__all__ = ["EVENTS", "Counter", "MetricSource", "ScheduleHandle"]

Counter = Callable[[Any], int]
"""Reads a count (samples, tokens) from one iteration's ``engine.state.batch``."""
MetricSource = Callable[[Engine], Mapping[str, Any]]
"""Reads metric values from the engine at each optimizer step's end."""

EVENTS = (Events.STARTED, Events.EPOCH_STARTED, Events.ITERATION_COMPLETED,
           Events.EPOCH_COMPLETED, Events.COMPLETED)


def _whole(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a whole number >= 1, got {value!r}")
    return value


class ScheduleHandle:
    """A schedule following an ``Engine``'s events; keep it to save and load its state
    (``Checkpoint(to_save={"schedule": handle, ...})``) and to ``put`` metrics.

    Args:
        driver: the schedule's driver (its clock, table and latest metrics).
        batches_per_step: iterations per optimizer step.
        samples, tokens: read each iteration's counts from ``engine.state.batch``.
        metrics: read metric values from the engine at each step's end.
        actions: name -> ``handler(engine)``, run when that callback fires.
        loss: reads the step's loss from the engine (for a callback that watches it).
        to_save, save_handler: what a preemption's checkpoint holds besides the schedule,
            and where it goes (with the driver's run control; ``ignite_control``).
    """

    def __init__(self, driver: ScheduleDriver, *, batches_per_step: int = 1,
                 samples: Counter | None = None, tokens: Counter | None = None,
                 metrics: MetricSource | None = None,
                 actions: Mapping[str, Callable[[Engine], Any]] | None = None,
                 loss: Callable[[Engine], Any] | None = None,
                 to_save: Mapping[str, Any] | None = None,
                 save_handler: SaveHandler | None = None) -> None:
        self.driver = driver
        self._control = IgniteControl(driver, to_save, save_handler, self, self._run)
        self._hosted = driver if isinstance(driver, CallbackDriver) else None
        self._loss = loss if self._hosted is not None and self._hosted.wants_loss else None
        self.batches_per_step = _whole("batches_per_step", batches_per_step)
        self._samples, self._tokens, self._metrics = samples, tokens, metrics
        self._actions = dict(actions or {})
        self._last: tuple[str, int, int] | None = None
        self._iteration = -1  # the ITERATION_COMPLETED answered last (-1: another event)
        self._fired: tuple[str, ...] = ()
        # trigger_event's quiet path: iterations below `quiet_until` are not counted as they
        # end but caught up later (exact only for plain steps of a time-free schedule).
        self._may_lag = (batches_per_step == 1 and samples is None and tokens is None
                         and self._hosted is None and driver.control is None
                         and not driver.table.needs_batch_end
                         and not reads_time(driver.table))
        self._lags = False
        self._engine: Engine | None = None
        #: Iterations below it end quietly when a filter skips them (0: none may).
        self.quiet_until: float = 0

    # -- following the engine ----------------------------------------------------------------
    def on(self, event: str, engine: Engine) -> tuple[str, ...]:
        """The callbacks that fire at Ignite's ``event`` (a name of ``Events``) now.

        Called again at the same point (two handlers on one filtered event), it returns
        the first answer without moving the clock twice.
        """
        if event == "ITERATION_COMPLETED":
            return self.iteration_completed(engine)
        st = engine.state
        key = (event, st.iteration, st.epoch)
        if key == self._last:
            return self._fired
        self._last, self._iteration = key, -1
        if self._lags:
            self.catch_up(st.iteration)
        self._engine = engine
        self._fired = fired = self._advance(event, engine)
        if event == "STARTED":
            self._lags = self._may_lag and self.driver.ranks is None
        self.quiet_until = self.driver.table.step_due if self._lags else 0
        self._after(event, engine, fired)
        return fired

    def catch_up(self, iteration: int) -> None:
        """Count the quiet iterations up to ``iteration`` that the filter skipped (no
        further than the last one below ``quiet_until``: nothing from there can fire)."""
        quiet = self.quiet_until
        self.driver.skip_to(iteration if iteration < quiet else int(quiet) - 1)

    def iteration_completed(self, engine: Engine) -> tuple[str, ...]:
        """``on("ITERATION_COMPLETED", engine)``: the per-iteration path, kept short (an
        iteration is answered once, whatever the number of handlers that ask)."""
        st = engine.state
        iteration = st.iteration
        if iteration == self._iteration:
            return self._fired
        self._last, self._iteration = None, iteration
        d = self.driver
        if iteration != d.clock.batch + 1:
            self._fired = ()
            raise RuntimeError(
                f"the engine is at iteration {iteration} but the schedule counted "
                f"{d.clock.batch}: attach the schedule before the engine runs, before any "
                "Checkpoint handler (handlers run in the order attached), and load its "
                "state from the same checkpoint as the engine's")
        samples, tokens = self._samples, self._tokens
        fired = d.batch_end(samples(st.batch) if samples is not None else 0,
                            tokens(st.batch) if tokens is not None else 0)
        step_end = not iteration % self.batches_per_step  # it ends an optimizer step
        if step_end:
            if self._metrics is not None:
                for name, value in self._metrics(engine).items():
                    d.put(name, value)
            if self._loss is not None:
                self._hosted.report_loss(self._loss(engine))  # type: ignore[union-attr]
            fired += d.step_end()
        self._fired = fired
        if fired or self._hosted is not None:
            self._after("ITERATION_COMPLETED", engine, fired)
        if step_end and d.control is not None:
            self._control.step_ended(engine, acted=any(n in self._actions for n in fired))
        return fired

    def _after(self, event: str, engine: Engine, fired: tuple[str, ...]) -> None:
        """Stop the engine when a schedtrain callback asked, then run what fired."""
        hosted = self._hosted
        if hosted is not None and hosted.stop_reason is not None and event != "COMPLETED":
            engine.terminate()
        self._run(engine, fired)

    def _run(self, engine: Engine, fired: tuple[str, ...]) -> None:
        """The actions of what fired, in order."""
        for name in fired:
            action = self._actions.get(name)
            if action is not None:
                action(engine)

    def _advance(self, event: str, engine: Engine) -> tuple[str, ...]:
        d, st = self.driver, engine.state
        if event == "STARTED":
            if st.iteration < d.clock.batch:
                raise RuntimeError(
                    f"the engine starts at iteration {st.iteration} but the schedule is at "
                    f"batch {d.clock.batch}: a new run needs a new schedule (or load the "
                    "schedule's state with the engine's)")
            if self._hosted is not None and st.epoch_length:
                self._hosted.context.bind(steps_in_epoch=st.epoch_length // self.batches_per_step)
            return d.train_start()
        if event == "EPOCH_STARTED":
            # Resumed from a checkpoint taken after an epoch's last iteration but before its
            # EPOCH_COMPLETED: Ignite starts the next epoch; end the saved one first.
            late = d.epoch_end() if d.in_epoch and st.epoch - 1 > d.clock.epoch else ()
            return late + d.epoch_start()
        if event == "EPOCH_COMPLETED":
            return d.epoch_end()
        return d.train_end()

    # -- metrics and state ---------------------------------------------------------------------
    def put(self, name: str, value: Any) -> None:
        """Record a metric value (an evaluator's result, say) for conditions and metric
        triggers."""
        self.driver.put(name, value)

    def state_dict(self) -> dict[str, Any]:
        """The schedule's state (clock, triggers, latest metrics) for Ignite's ``Checkpoint``."""
        if self._lags and self._engine is not None:  # the quiet iterations count too
            self.catch_up(self._engine.state.iteration)
        return self.driver.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict`` (``Checkpoint.load_objects``)."""
        self.driver.load_state_dict(state)
        self._last, self._iteration = None, -1
        self._lags, self.quiet_until = False, 0  # until the resumed engine starts

    # -- run control -----------------------------------------------------------------------
    @property
    def to_save(self) -> dict[str, Any]:
        """``attach_schedule``'s ``to_save`` with this handle under ``"schedule"``: what
        a preemption's checkpoint holds; give it to your own ``Checkpoint`` too, and to
        ``Checkpoint.load_objects`` on resume."""
        return self._control.to_save

    @property
    def retimer(self) -> Retimer:
        """Live retime's Python API (``control=`` given): ``handle.retimer.retime(new)``
        hands the running engine a schedule, applied after the step it is asked at."""
        control = self.driver.control
        if control is None:
            raise ValueError("this schedule has no run control: attach it with "
                             "control=HostControl(...) to retime it")
        return control.retimer  # type: ignore[attr-defined,no-any-return]

    @property
    def preempted(self) -> str | None:
        """The preemption the run was stopped for (``"SIGTERM"``...; ``None``: none)."""
        return self._control.preempted

    @property
    def preempt_checkpoint(self) -> str | Path | None:
        """The checkpoint a preemption wrote (``None``: none)."""
        return self._control.checkpoint
