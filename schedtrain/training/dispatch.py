"""``Dispatcher``: the one way events are fired and hooks are called.

``fire(event)`` asks the trigger table which callbacks fire, runs each one's
``_trigger`` as soon as its trigger is found true (so a metric it puts is visible to
later callbacks' triggers at the same event), records the firing (to the sinks once the
callback has returned, with the seconds it ran), and once the
outermost event is over has the checkpoint owner write the saves callbacks asked for.
Per-event hooks (``before_epoch``, ``after_step``...) run only on callbacks that override them, and
only while the callback's gate (``EnableCallbackIf``) is open; a step's
``after_step`` runs exactly for the callbacks whose ``before_step`` ran.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping
from typing import Any

from schedtrain.callbacks.base import PER_EVENT_HOOKS, Callback, overrides
from schedtrain.checkpoints.manager import Checkpoints
from schedtrain.distributed.agreement import Alone
from schedtrain.errors import StopTraining, locate_failure
from schedtrain.logs import get_logger
from schedtrain.monitors.store import MetricStore
from schedtrain.schedule.firings import Firing
from schedtrain.schedule.schedule import HookGate
from schedtrain.schedule.table import TriggerTable
from schedtrain.schedule.tensorpack import gate_at
from schedtrain.spec.run import DEFAULT_KEEP_FIRINGS
from schedtrain.time import Timestamp

__all__ = ["DEFAULT_KEEP_FIRINGS", "Dispatcher"]

_log = get_logger("schedtrain.training")



class Dispatcher:
    """Fires events on a compiled table and runs the callbacks' hooks.

    Args:
        table: the compiled schedule.
        callbacks: name -> callback, in declared order.
        gates: name -> the callback's hook gate (or ``None``).
        trigger_epoch: name -> how its ``_trigger_epoch`` runs (``Scheduled.trigger_epoch``;
            ``"hook"`` when not given).
        metrics: the metric store (firings go to its sinks).
        before_firing: called before the first callback fires at an event (the trainer
            publishes ``train/loss`` there, so firing callbacks see it).
        saves: the checkpoint owner, whose queued saves are written after each event.
        agreement: what ranks settle after events (``Alone`` on one process).
        keep_firings: how many recent firings ``firings`` keeps (``None``: all).
    """

    def __init__(
        self,
        table: TriggerTable,
        *,
        callbacks: Mapping[str, Callback],
        gates: Mapping[str, HookGate | None],
        trigger_epoch: Mapping[str, str] | None = None,
        metrics: MetricStore,
        before_firing: Callable[[], None],
        saves: Checkpoints,
        agreement: Alone,
        keep_firings: int | None = DEFAULT_KEEP_FIRINGS,
    ) -> None:
        self.table = table
        self.callbacks = dict(callbacks)
        self.metrics = metrics
        # (callback, event, timestamp): a tuple per firing costs less than a ``Firing``
        self._firings: collections.deque[tuple[str, str, Timestamp]] = collections.deque(
            maxlen=keep_firings)
        modes = trigger_epoch or {}
        self.hooks: dict[str, list[tuple[Callback, HookGate | None]]] = {
            h: [(cb, _gate(gates.get(n), h, table)) for n, cb in callbacks.items()
                if overrides(cb, h) and (h != "_trigger_epoch" or modes.get(n, "hook") == "hook")]
            for h in PER_EVENT_HOOKS}
        #: what a firing runs: the callback (its ``trigger()``), or its ``trigger_epoch()``
        self._fired: dict[str, Callback | _EpochCall] = {
            n: _EpochCall(cb) if modes.get(n) == "fires" else cb for n, cb in callbacks.items()}
        # Not a per-step hook, nor gated: it sees the state before an event's firings.
        self.hooks["_before_firings"] = [(cb, None) for cb in callbacks.values()
                                         if overrides(cb, "_before_firings")]
        self._fresh = False  # an outermost event has started and nothing fired yet
        self._firing_log: Any = None
        self.payload: dict[str, Any] = {}
        self._before_firing = before_firing
        self.saves, self.agreement = saves, agreement
        self._runners: dict[str, Callable[[str, Timestamp], None]] = {}
        self._depth = 0
        self._stepped: list[Callback] = []
        #: why a callback asked training to stop (``request_stop``), until it stops
        self.stop_reason: str | None = None

    @property
    def firings(self) -> list[Firing]:
        """The recent firings (at most ``keep_firings``), oldest first."""
        return [Firing(*f) for f in self._firings]

    @property
    def log_firings(self) -> bool:
        """Log each firing (at debug level; an application configured structlog)."""
        return self._firing_log is not None

    @log_firings.setter
    def log_firings(self, on: bool) -> None:
        # Bound once per run: structlog's lazy proxy builds a logger at every call, which
        # cost more than the firing itself in benchmarks/bench_loop.py.
        self._firing_log = _log.bind() if on else None

    # -- events ------------------------------------------------------------------------------
    def fire(self, event: str, payload: Mapping[str, Any] | None = None) -> tuple[str, ...]:
        """Evaluate ``event`` now and run the callbacks that fire; their names, in order."""
        outer = self.payload
        self.payload = dict(payload or {})
        if self._depth == 0:
            self.agreement.begin_event()
            self._fresh = True
        try:
            names = self.table.decide(event, self._runner(event))
        finally:
            self.payload = outer
        if self._depth == 0:
            stop = self.agreement.stop_after_event(self, names)
            if self.saves.pending:
                self.saves.flush(event)
            if stop is not None:
                raise StopTraining(stop)
        return names

    def request_stop(self, reason: str) -> None:
        """Stop training once the current event is over (every firing has run)."""
        if self.stop_reason is None:
            self.stop_reason = reason

    def _runner(self, event: str) -> Callable[[str, Timestamp], None]:
        run = self._runners.get(event)
        if run is None:
            run = self._runners[event] = self._make_runner(event)
        return run

    def _make_runner(self, event: str) -> Callable[[str, Timestamp], None]:
        """What runs one firing at ``event``: one closure, no further Python call of the
        dispatcher's own per firing (a call costs about 2,400 instructions, a tenth of a
        no-op firing; benchmarks/bench_loop.py)."""
        fired, firings, metrics = self._fired, self._firings, self.metrics
        agreement = self.agreement
        # One process: ``Alone.run_callback`` is the callback's trigger(), called here, and
        # where a class keeps ``Callback.trigger`` its ``_trigger`` is called straight away
        # (one Python call a firing fewer: 13.5k -> 12.6k instructions a no-op firing).
        direct = type(agreement) is Alone
        calls = {n: _direct_call(f) for n, f in fired.items()} if direct else {}

        def run(name: str, ts: Timestamp) -> None:
            if self._fresh:
                # The first firing of an outermost event: the clock does not move within
                # an event, so train/loss is published once, before the first callback.
                self._fresh = False
                if self.hooks["_before_firings"]:
                    self.run_hooks("_before_firings", ts)
                self._before_firing()
            firings.append((name, event, ts))
            if self._firing_log is not None:
                self._firing_log.debug("firing", callback=name, trigger_event=event,
                                       step=ts.step, epoch=ts.epoch)
            sinks = bool(metrics.sinks)
            if sinks:
                wall, start = time.time(), time.monotonic()
            self._depth += 1
            try:
                if direct:
                    calls[name]()
                else:
                    agreement.run_callback(self, name, fired[name])
            except Exception as exc:  # StopTraining too: the stop line says who stopped
                locate_failure(exc, f"callback {name!r} at {event} (step {ts.step}, "
                                    f"epoch {ts.epoch})")
                raise
            finally:
                self._depth -= 1
                if sinks:
                    # The line is written once the callback returned (or raised), with the
                    # host's wall time it took: no device sync, so on CUDA work the
                    # callback queued and did not wait for is not counted.
                    metrics.firing(name, event, ts, wall, time.monotonic() - start)
        return run

    # -- hooks ---------------------------------------------------------------------------------
    def run_hooks(self, hook: str, now: Timestamp, *args: Any) -> None:
        """Call ``hook`` on every callback that overrides it and whose gate is open."""
        for cb, gate in self.hooks[hook]:
            if gate is None or gate(now):
                try:
                    getattr(cb, hook.lstrip("_"))(*args)
                except Exception as exc:
                    if not self._stop_asked(exc, cb):
                        _place_hook(exc, cb, hook, now)
                        raise

    def _stop_asked(self, exc: Exception, cb: Callback) -> bool:
        """On several processes, ``StopTraining`` raised by a hook on one rank becomes
        that rank's stop request, agreed at the next event where a callback runs."""
        return self.agreement.hook_stopped(self, exc, cb.name or type(cb).__name__)

    def before_step(self, now: Timestamp, step: int, batch: Any) -> dict[str, Any]:
        """``before_step`` hooks; remembers who ran, and collects the fetches they ask for."""
        self._stepped = []
        fetches: dict[str, Any] = {}
        for cb, gate in self.hooks["_before_step"]:
            if gate is None or gate(now):
                self._stepped.append(cb)
                try:
                    asked = cb.before_step(step, batch)
                except Exception as exc:
                    if not self._stop_asked(exc, cb):
                        _place_hook(exc, cb, "_before_step", now)
                        raise
                if asked:
                    fetches.update(asked)
        return fetches

    def after_step(self, now: Timestamp, step: int, outputs: Any) -> None:
        """``after_step`` hooks: a callback whose ``before_step`` ran this step runs now,
        whatever its gate says meanwhile; one without ``before_step`` goes by its gate."""
        stepped = self._stepped
        for cb, gate in self.hooks["_after_step"]:
            paired = overrides(cb, "_before_step")
            if (cb in stepped) if paired else (gate is None or gate(now)):
                try:
                    cb.after_step(step, outputs)
                except Exception as exc:
                    if not self._stop_asked(exc, cb):
                        _place_hook(exc, cb, "_after_step", now)
                        raise


class _EpochCall:
    """A callback whose firing is its ``trigger_epoch()`` (``Scheduled.trigger_epoch``
    ``"fires"``): tensorpack's per-epoch call, which the class overrides, in place of
    ``trigger()``; ``_trigger`` then runs only when that code calls ``self.trigger()``."""

    __slots__ = ("callback", "produces")

    def __init__(self, callback: Callback) -> None:
        self.callback = callback
        self.produces = callback.produces

    def trigger(self) -> None:
        self.callback.trigger_epoch()


def _direct_call(fired: Callback | _EpochCall) -> Callable[[], None]:
    """What a firing of ``fired`` calls: its ``_trigger`` where its class keeps
    ``Callback.trigger`` (which only calls it), else its ``trigger``."""
    if isinstance(fired, Callback) and type(fired).trigger is Callback.trigger:
        return fired._trigger
    return fired.trigger


def _gate(gate: HookGate | None, hook: str, table: TriggerTable) -> HookGate | None:
    """The gate as it gates ``hook``: told once, here, which hook (``PeriodicCallback``'s
    last-step clause depends on it), so a call costs what it did."""
    return None if gate is None else gate_at(gate, hook, table)


def _place_hook(exc: Exception, cb: Callback, hook: str, now: Timestamp) -> None:
    if not isinstance(exc, StopTraining):
        locate_failure(exc, f"callback {cb.name or type(cb).__name__!r} in its "
                            f"{hook.lstrip('_')} hook (step {now.step}, epoch {now.epoch})")
