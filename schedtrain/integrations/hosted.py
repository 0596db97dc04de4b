"""``CallbackDriver``: a ``ScheduleDriver`` that also runs schedtrain ``Callback`` objects.

A callback written for schedtrain's own loop runs unchanged inside a host: at each firing
its ``_trigger`` (or, for a tensorpack-style class, ``_trigger_epoch``), and around the
events the hooks a host can call, in schedtrain's order::

    setup(context); [load its saved state]; before_train()      at train_start
    before_epoch(); [epoch_start]
    (each step) trigger_step(); [step_end]
    after_epoch(); trigger_epoch(); [epoch_end]
    [train_end]; after_train()          (on_exception(exc), after_train() when it failed)

Gates (``EnableCallbackIf``, ``PeriodicCallback``) hold the hooks as in schedtrain's loop.
A callback's stop (``request_stop``, ``StopTraining``) is kept in ``stop_reason`` for the
host to act on once the event is over; the callbacks' state rides in ``state_dict``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

from schedtrain.callbacks.base import Callback, overrides
from schedtrain.errors import StopTraining, locate_failure
from schedtrain.integrations.context import HOST_HOOKS, HostContext, check_callback
from schedtrain.integrations.driver import Action, Control, ScheduleDriver
from schedtrain.integrations.driver_state import DriverStateError
from schedtrain.integrations.host_control import HostPreempted
from schedtrain.monitors.store import MetricStore
from schedtrain.readback import DamagedFile
from schedtrain.schedule.schedule import HookGate, Schedule, Scheduled
from schedtrain.time import Time
from schedtrain.training.trial import try_states
from schedtrain.triggers.protocol import Predicate

if TYPE_CHECKING:
    from schedtrain.spec import Spec

__all__ = ["CallbackDriver", "check_bound", "counters_read", "driver_for", "refuse_uncounted",
           "spec_bindings", "split_actions"]


def split_actions(actions: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Callback]]:
    """``actions`` parted into the host's own (functions, verbs) and schedtrain callbacks."""
    own: dict[str, Any] = {}
    callbacks: dict[str, Callback] = {}
    for name, value in (actions or {}).items():
        (callbacks if isinstance(value, Callback) else own)[name] = value
    return own, callbacks


def spec_bindings(spec: Spec | str | Path, actions: Mapping[str, Any] | None
                  ) -> tuple[Schedule, dict[str, Any]]:
    """A spec's schedule and what runs at each firing: its typed callbacks built as
    ``schedtrain train`` builds them (``build_callbacks``), ``actions`` for the others.

    Raises:
        SpecError: the spec does not load, or a typed callback cannot be built.
        ValueError: ``actions`` binds a callback the spec builds from its ``type``.
    """
    from schedtrain.spec import Spec, load_spec
    from schedtrain.training.from_spec import build_callbacks

    loaded = spec if isinstance(spec, Spec) else load_spec(spec)
    built = build_callbacks(loaded, untyped_ok=True)
    given = dict(actions or {})
    twice = sorted(set(built) & set(given))
    if twice:
        raise ValueError(f"actions bind {twice}, which the spec builds from their `type`: "
                         "drop them from actions, or the `type` from the spec")
    return loaded.schedule(), {**built, **given}


def check_bound(schedule: Schedule, bound: Iterable[str], *, record: bool) -> None:
    """Refuse callbacks of ``schedule`` that nothing runs (no object, no action): they
    would fire and do nothing (a spec's typed callback passed through ``schedule()``).
    With ``record`` their firings are what the caller reads: kept."""
    if record:
        return
    names = set(bound)
    loose = [e.default_name() for e in schedule.entries
             if e.callback is None and e.default_name() not in names]
    if loose:
        raise ValueError(
            f"schedule callbacks {loose} have neither a type nor an action, so they would "
            "fire and do nothing: bind each in actions (a spec's typed callbacks are built "
            "by from_spec(spec, actions))")


def counters_read(schedule: Schedule) -> dict[str, str]:
    """Counter ("sample", "token", ...) -> the first callback whose trigger reads it (a
    period, points or a window in that unit; a user's trigger class is not seen into)."""
    found: dict[str, str] = {}
    for e in schedule.entries:
        todo = [e.trigger]
        while todo:
            t = todo.pop()
            todo.extend(t.children())
            for f in getattr(type(t), "__attrs_attrs__", ()):
                value = getattr(t, f.name, None)
                for v in value if isinstance(value, tuple) else (value,):
                    if isinstance(v, Time):
                        found.setdefault(v.counter, e.default_name())
    return found


def refuse_uncounted(schedule: Schedule, counter: str, why: str) -> None:
    """Refuse a schedule whose trigger reads ``counter`` the host does not count, saying
    ``why`` (what to pass, or why the host cannot count it)."""
    name = counters_read(schedule).get(counter)
    if name is not None:
        raise ValueError(f"callback {name!r}: its trigger {schedule[name]!r} counts "
                         f"{counter}s, which {why}")


def _entries(schedule: Schedule, callbacks: Mapping[str, Callback]) -> list[Scheduled]:
    unknown = sorted(set(callbacks) - set(schedule.names))
    if unknown:
        raise ValueError(f"callbacks name callbacks that are not in the schedule: {unknown} "
                         f"(the schedule has {list(schedule.names)})")
    out = []
    for e in schedule.entries:
        name = e.default_name()
        cb = callbacks.get(name, e.callback)
        if isinstance(cb, Callback):
            out.append(Scheduled(e.trigger, cb, name, e.gate, trigger_epoch=e.trigger_epoch))
    return out


def driver_for(schedule: Schedule, actions: Mapping[str, Action], callbacks: Mapping[str, Callback],
               *, host: str, gives: Iterable[str] = (), predicates: Mapping[str, Predicate]
               | None = None, time_source: Callable[[], int] = perf_counter_ns,
               record: bool = False, reduce: Mapping[str, str] | str | None = None,
               global_counts: bool = False, control: Control | None = None) -> ScheduleDriver:
    """A ``CallbackDriver`` when the schedule has schedtrain callbacks (given here, or as
    its entries' objects), else a plain ``ScheduleDriver``."""
    if callbacks or _entries(schedule, {}):
        return CallbackDriver(schedule, callbacks, actions=actions, host=host, gives=gives,
                              predicates=predicates, time_source=time_source, record=record,
                              reduce=reduce, global_counts=global_counts, control=control)
    return ScheduleDriver(schedule, actions=actions, predicates=predicates,
                          time_source=time_source, record=record, reduce=reduce,
                          global_counts=global_counts, control=control, host=host)


class CallbackDriver(ScheduleDriver):
    """Evaluate a schedule at a host's events and run its schedtrain callbacks.

    Args:
        schedule: the schedule; entries whose object is a ``Callback`` run it (a
            ``Scheduled`` from ``PeriodicTrigger``, ``EnableCallbackIf``... keeps its gate).
        callbacks: name -> ``Callback`` for entries bound by name.
        actions: name -> a function of no arguments, for the other entries.
        model, optimizer: what the callbacks see as ``self.model``, ``self.optimizer`` (a
            host module fills them from the host; your own loop passes them).
        steps_in_epoch: optimizer steps per epoch, when known (progress bars read it).
        host: the host's name, for messages.
        gives: what the host reports: ``"loss"`` (``report_loss`` each step) and
            ``"exception"`` (``exception(exc)``); a callback needing more is refused.
        history_limit: values of each metric the store keeps (they ride in checkpoints).
        predicates, time_source, record, reduce, global_counts, control: as
            ``ScheduleDriver``.

    Raises:
        HostError: a callback needs what the host cannot give (one line naming it).
    """

    def __init__(self, schedule: Schedule, callbacks: Mapping[str, Callback] | None = None, *,
                 actions: Mapping[str, Action] | None = None, model: Any = None,
                 optimizer: Any = None, steps_in_epoch: int | None = None,
                 host: str = "your loop", gives: Iterable[str] = ("loss", "exception"),
                 history_limit: int = 1000, predicates: Mapping[str, Predicate] | None = None,
                 time_source: Callable[[], int] = perf_counter_ns, record: bool = False,
                 reduce: Mapping[str, str] | str | None = None,
                 global_counts: bool = False, control: Control | None = None) -> None:
        if not isinstance(schedule, Schedule):
            raise TypeError(f"expected a schedtrain Schedule, got {schedule!r}")
        entries = _entries(schedule, dict(callbacks or {}))
        # Decided, not left open as for planning: a gate's predicate (EnableCallbackIf) is a
        # condition on the callback that only a running loop can answer.
        predicates = {} if predicates is None else predicates
        gives = tuple(gives)
        for e in entries:
            check_callback(e.default_name(), e.callback, host, gives)
        self.callbacks: dict[str, Callback] = {e.default_name(): e.callback for e in entries}
        for name, cb in self.callbacks.items():
            cb.name = name
        self._fresh = False  # an outermost event has started and nothing fired at it yet
        self._depth = 0  # events fired from inside a firing (a callback's fire("eval_end"))
        self._event = ""  # read by an action that takes ``event`` (set again by super)
        runs: dict[str, Action] = {n: self._first(self.telling_event(a))
                                   for n, a in (actions or {}).items()}
        runs.update({n: self._firing(e.trigger_epoch == "fires", e.callback)
                     for n, e in zip(self.callbacks, entries, strict=True)})
        super().__init__(schedule, actions=runs, predicates=predicates,
                         time_source=time_source, record=record, reduce=reduce,
                         global_counts=global_counts, control=control, host=host)
        store = MetricStore(self.clock.now, history_limit=history_limit)
        self.metrics = store  # type: ignore[assignment]  # a MetricsView with put, as LatestValues
        self.table.attach(self.clock, store,
                          predicates if predicates is not None else self.table.predicates)
        self.context = HostContext(host, self.clock, store, self.fire)
        self.context.bind(model=model, optimizer=optimizer, steps_in_epoch=steps_in_epoch)
        self.context.schedule = schedule
        self.wants_loss = any(getattr(cb, "watches_loss", False) for cb in self.callbacks.values())
        gates: dict[str, HookGate | None] = {e.default_name(): e.gate for e in entries}
        modes = {e.default_name(): e.trigger_epoch for e in entries}
        self._hooks: dict[str, list[tuple[Callback, HookGate | None]]] = {
            h: [(cb, gates[n]) for n, cb in self.callbacks.items() if overrides(cb, h)
                and (h != "_trigger_epoch" or modes[n] == "hook")] for h in HOST_HOOKS}
        self._step_hooks = bool(self._hooks["_trigger_step"])
        self._set_up = False
        self._resumed_in_epoch = False
        self._saved: dict[str, Any] | None = None

    @classmethod
    def from_spec(cls, spec: Spec | str | Path, actions: Mapping[str, Any] | None = None,
                  **kwargs: Any) -> CallbackDriver:
        """A driver for a spec (or its path): its typed callbacks built as ``schedtrain
        train`` builds them, ``actions`` (functions or ``Callback`` objects) for the
        others; an untyped callback left unbound is only reported by the event calls.
        ``kwargs``: as the constructor."""
        schedule, bound = spec_bindings(spec, actions)
        callbacks = {n: a for n, a in bound.items() if isinstance(a, Callback)}
        own = {n: a for n, a in bound.items() if n not in callbacks}
        return cls(schedule, callbacks, actions=own, **kwargs)

    @property
    def stop_reason(self) -> str | None:
        """Why a callback asked to stop (``None``: none did)."""
        return self.context.stop_reason

    @property
    def metric_names(self) -> frozenset[str]:
        """Metrics the triggers read and the callbacks need (``needs``): the host reads them."""
        needs = {m for cb in self.callbacks.values() for m in cb.needs}
        return super().metric_names | needs

    # -- running callbacks --------------------------------------------------------------------
    def _firing(self, epoch_call: bool, cb: Callback) -> Action:
        return self._first(lambda: self._guarded(
            cb.trigger_epoch if epoch_call else cb.trigger, cb, f"at {self._event}"))

    def _first(self, action: Action) -> Action:
        """``action``, after ``before_firings`` when it is the event's first firing."""
        def fired() -> None:
            if self._fresh:
                self._fresh = False
                self._run_hooks("_before_firings")
            self._depth += 1
            try:
                action()
            finally:
                self._depth -= 1
        return fired

    def _guarded(self, call: Callable[[], None], cb: Callback, where: str) -> None:
        try:
            call()
        except StopTraining as stop:  # tensorpack's way to stop: ends training, as it does
            self.context.request_stop(str(stop) or "StopTraining")
        except Exception as exc:  # the host's traceback then says which callback, where
            now = self.clock.now()
            locate_failure(exc, f"callback {cb.name!r} {where} (step {now.step}, epoch "
                                f"{now.epoch}) inside {self.context.host}")
            raise

    def _run_hooks(self, hook: str) -> None:
        now = self.clock.now()
        for cb, gate in self._hooks[hook]:
            if gate is None or gate(now):
                self._guarded(getattr(cb, hook.lstrip("_")), cb,
                              f"in its {hook.lstrip('_')} hook")

    def fire(self, event: str) -> tuple[str, ...]:
        if self._depth == 0:
            self._fresh = True
        return super().fire(event)

    # -- the loop's events -----------------------------------------------------------------
    def train_start(self) -> tuple[str, ...]:
        """Set the callbacks up (and restore their saved state), ``before_train``, then
        train_start."""
        if not self._set_up:
            self._set_up = True
            for cb in self.callbacks.values():
                cb.setup(self.context)
            self._restore()
        self.context.outcome = None
        self._run_hooks("_before_train")
        return super().train_start()

    def epoch_start(self) -> tuple[str, ...]:
        """``before_epoch`` (also for the epoch a resumed run continues), then epoch_start."""
        if self._in_epoch:  # resumed inside an epoch: its hooks run once, when it goes on
            if self._resumed_in_epoch:
                self._resumed_in_epoch = False
                self._run_hooks("_before_epoch")
            return ()
        self._in_epoch = True
        self.clock.start_epoch()
        self._run_hooks("_before_epoch")
        return self.fire("epoch_start")

    def step_end(self) -> tuple[str, ...]:
        """``trigger_step``, then step_end."""
        clock = self.clock
        clock.end_step()
        self._at_step = (clock.batch, clock.sample, clock.token)
        if self._step_hooks:
            self._run_hooks("_trigger_step")
        if clock.step < self.table.step_due and (self._inbox is None
                                                 or clock.step < self._inbox.limit):
            return ()
        return self.slow_step_end()

    def step(self, samples: int = 0, tokens: int = 0) -> tuple[str, ...]:
        """``batch_end`` then ``step_end``."""
        return self.batch_end(samples, tokens) + self.step_end()

    def epoch_end(self) -> tuple[str, ...]:
        """``after_epoch``, ``trigger_epoch``, then epoch_end."""
        self._in_epoch = False
        self.clock.end_epoch()
        self._run_hooks("_after_epoch")
        self._run_hooks("_trigger_epoch")
        return self.fire("epoch_end")

    def train_end(self) -> tuple[str, ...]:
        """train_end, then ``after_train`` (outcome "stopped" or "finished")."""
        fired = super().train_end()
        self.context.outcome = "stopped" if self.context.stop_reason else "finished"
        self._run_hooks("_after_train")
        return fired

    def exception(self, exc: BaseException) -> None:
        """Training failed: ``on_exception`` then ``after_train`` (outcome "failed"); run
        control, if any, is closed."""
        self.close_control(exc)
        if isinstance(exc, HostPreempted):  # as the own loop's: no on_exception
            self.context.outcome = "preempted"
            self._run_hooks("_after_train")
            return
        self.context.outcome = "failed"
        for cb in self.callbacks.values():
            if overrides(cb, "_on_exception"):
                cb.on_exception(exc)
        self._run_hooks("_after_train")

    def report_loss(self, loss: Any) -> None:
        """The loss of the optimizer step about to end: call it before ``step_end`` (or
        ``step``), when ``wants_loss`` (a callback reads each step's loss)."""
        self.context.report_loss(self.clock.step + 1, loss)

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The driver's state and each callback's (``Callback.state_dict``)."""
        return {**super().state_dict(),
                "callbacks": {n: cb.state_dict() for n, cb in self.callbacks.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict``; the callbacks' states are loaded once they are set up."""
        saved = state.get("callbacks") if isinstance(state, Mapping) else None
        if not isinstance(saved, Mapping):
            raise DriverStateError("callbacks", "a table of the callbacks' states", saved)
        super().load_state_dict(state)
        self._saved = dict(saved)
        self._resumed_in_epoch = self._in_epoch
        if self._set_up:
            self._restore()

    def _restore(self) -> None:
        """Each callback's saved state, once it is set up: all tried on their callbacks
        first (``try_states``: a state its callback cannot take refused by key path, the
        callback's own put back), then loaded."""
        saved, self._saved = self._saved, None
        if saved is None:
            return
        mine = [(name, cb) for name, cb in self.callbacks.items() if name in saved]
        try:
            try_states(((f"callbacks.{name}", cb, saved[name]) for name, cb in mine),
                       "driver state")
        except DamagedFile as exc:
            raise DriverStateError(exc.key, "", exc.reason) from None
        for name, cb in mine:
            cb.load_state_dict(saved[name])
