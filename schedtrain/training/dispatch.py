"""``Dispatcher``: the one way events are fired and hooks are called.

``fire(event)`` asks the trigger table which callbacks fire, runs each one's
``_trigger`` as soon as its trigger is found true (so a metric it puts is visible to
later callbacks' triggers at the same event), records the firing, and once the
outermost event is over has the checkpoint owner write the saves callbacks asked for.
Per-event hooks (``before_epoch``, ``after_step``...) run only on callbacks that override them, and
only while the callback's gate (``EnableCallbackIf``) is open; a step's
``after_step`` runs exactly for the callbacks whose ``before_step`` ran.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from typing import Any, Final

import structlog

from schedtrain.callbacks.base import (
    PER_EVENT_HOOKS,
    STOP_PLACES_BEYOND_TRIGGER,
    Callback,
    overrides,
    stops_alone,
)
from schedtrain.checkpoints.manager import Checkpoints
from schedtrain.distributed.comm import Comm
from schedtrain.errors import StopTraining, locate_failure
from schedtrain.monitors.store import MetricStore
from schedtrain.schedule.firings import Firing
from schedtrain.schedule.schedule import HookGate
from schedtrain.schedule.table import TriggerTable
from schedtrain.time import Timestamp

__all__ = ["DEFAULT_KEEP_FIRINGS", "Dispatcher"]

_log = structlog.get_logger("schedtrain.training")

#: How many recent firings a trainer keeps in memory; the full log is events.jsonl.
DEFAULT_KEEP_FIRINGS: Final = 100_000


class Dispatcher:
    """Fires events on a compiled table and runs the callbacks' hooks.

    Args:
        table: the compiled schedule.
        callbacks: name -> callback, in declared order.
        gates: name -> the callback's hook gate (or ``None``).
        metrics: the metric store (firings go to its sinks).
        before_firing: called before the first callback fires at an event (the trainer
            publishes ``train/loss`` there, so firing callbacks see it).
        saves: the checkpoint owner, whose queued saves are written after each event.
        keep_firings: how many recent firings ``firings`` keeps (``None``: all).
    """

    def __init__(
        self,
        table: TriggerTable,
        *,
        callbacks: Mapping[str, Callback],
        gates: Mapping[str, HookGate | None],
        metrics: MetricStore,
        before_firing: Callable[[], None],
        saves: Checkpoints,
        keep_firings: int | None = DEFAULT_KEEP_FIRINGS,
    ) -> None:
        self.table = table
        self.callbacks = dict(callbacks)
        self.metrics = metrics
        self.firings: collections.deque[Firing] = collections.deque(maxlen=keep_firings)
        self.hooks: dict[str, list[tuple[Callback, HookGate | None]]] = {
            h: [(cb, gates.get(n)) for n, cb in callbacks.items() if overrides(cb, h)]
            for h in PER_EVENT_HOOKS}
        self.log_firings = False
        self.payload: dict[str, Any] = {}
        self._before_firing = before_firing
        self.saves = saves
        self._runners: dict[str, Callable[[str, Timestamp], None]] = {}
        self._depth = 0
        self._stepped: list[Callback] = []
        #: why a callback asked training to stop (``request_stop``), until it stops
        self.stop_reason: str | None = None
        #: agreement between ranks on several processes (set by the trainer)
        self.comm: Comm | None = None
        #: metric name -> "mean", "sum", "max" or "min" across ranks (default "mean")
        self.reduce_ops: dict[str, str] = {}
        # On several processes a stop flag is agreed after an event only where a callback
        # that may stop alone ran (or could have asked outside its trigger), and the last
        # reduction did not carry it. Decided from the classes: the same on every rank.
        self._alone = {n: stops_alone(cb) for n, cb in callbacks.items()}
        self._hooks_alone = any(
            self._alone[n] and any(overrides(cb, h) for h in STOP_PLACES_BEYOND_TRIGGER)
            for n, cb in callbacks.items())
        self._alone_ran = self._flags_fresh = False
        self._flagged: int | None = None

    # -- events ------------------------------------------------------------------------------
    def fire(self, event: str, payload: Mapping[str, Any] | None = None) -> tuple[str, ...]:
        """Evaluate ``event`` now and run the callbacks that fire; their names, in order."""
        outer = self.payload
        self.payload = dict(payload or {})
        if self._depth == 0:
            self._alone_ran = self._flags_fresh = False
        try:
            names = self.table.fire(event, self._runner(event))
        finally:
            self.payload = outer
        if self._depth == 0:
            stop = self.stop_reason
            if self.comm is not None:
                # Decided together where callbacks ran (the same events on every rank).
                stop = self.agreed_stop() if names else None
            if self.saves.pending:
                self.saves.flush(event)
            if stop is not None:
                raise StopTraining(stop)
        return names

    def agreed_stop(self) -> str | None:
        """On several processes: a stop requested on any rank, with its reason, on all.

        No collective when every callback that ran stops only from what all ranks share
        (``may_stop_alone`` false: they asked alike), or when the last metric reduction,
        after the last callback ran, carried the ranks' stop flags."""
        comm = self.comm
        assert comm is not None
        if self._flags_fresh:
            rank = self._flagged
        elif self._alone_ran or self._hooks_alone:
            rank = comm.first_flagged(self.stop_reason is not None)
        else:
            return self.stop_reason
        if rank is None:
            return None
        reason = comm.broadcast(self.stop_reason, src=rank)
        self.stop_reason = reason if rank == comm.rank else f"{reason} (on rank {rank})"
        return self.stop_reason

    def request_stop(self, reason: str) -> None:
        """Stop training once the current event is over (every firing has run)."""
        if self.stop_reason is None:
            self.stop_reason = reason

    def _runner(self, event: str) -> Callable[[str, Timestamp], None]:
        run = self._runners.get(event)
        if run is None:
            def run(name: str, now: Timestamp) -> None:
                self._run(name, event, now)
            self._runners[event] = run
        return run

    def _run(self, name: str, event: str, ts: Timestamp) -> None:
        self._before_firing()
        self.firings.append(Firing(name, event, ts))
        if self.metrics.sinks:
            self.metrics.firing(name, event, ts)
        if self.log_firings:
            _log.debug("firing", callback=name, trigger_event=event, step=ts.step,
                       epoch=ts.epoch)
        self._depth += 1
        cb = self.callbacks[name]
        if self._alone[name]:
            self._alone_ran = True
        try:
            if self.comm is None:
                cb.trigger()
            else:
                self._trigger_reduced(name, cb)
        except Exception as exc:  # StopTraining too: the stop line says who stopped
            locate_failure(exc, f"callback {name!r} at {event} (step {ts.step}, "
                                f"epoch {ts.epoch})")
            raise
        finally:
            self._depth -= 1

    def _trigger_reduced(self, name: str, cb: Callback) -> None:
        """Run a callback on several processes: the metrics it puts (its ``produces``) are
        reduced across ranks before anything else reads them."""
        comm, metrics = self.comm, self.metrics
        assert comm is not None
        outer, metrics.recorder = metrics.recorder, []
        try:
            cb.trigger()
        except StopTraining as exc:  # one rank's: the ranks agree on it after the event
            self.request_stop(str(exc) or f"{name} raised StopTraining")
        finally:
            put, metrics.recorder = metrics.recorder, outer
        self._flags_fresh = False  # it may have asked to stop after the last reduction
        if outer is not None:
            outer.extend(put)
        produces = tuple(cb.produces)
        stray = sorted({r.name for r in put} - set(produces))
        if stray:
            raise ValueError(
                f"callback {name!r} put metric(s) {stray} that it does not declare in "
                f"`produces` {list(produces)}: on several processes a callback's metrics "
                "are reduced across ranks before triggers see them, which needs them "
                "declared (set `produces` on the callback)")
        if not produces:
            return
        last = {r.name: r for r in put}
        values = [None if (r := last.get(n)) is None else float(r.value) for n in produces]
        ops = [self.reduce_ops.get(n, "mean") for n in produces]
        reduced, self._flagged = comm.reduce_floats(values, ops, self.stop_reason is not None)
        self._flags_fresh = True
        for n, value in zip(produces, reduced, strict=True):
            if value is None:
                continue
            if n in last:
                for r in put:
                    if r.name == n:
                        r.value = value
            else:  # put on other ranks only: every rank must see the same metrics
                metrics.put(n, value)

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
        if not isinstance(exc, StopTraining) or self.comm is None:
            return False
        self.request_stop(str(exc) or f"{cb.name or type(cb).__name__} raised StopTraining")
        return True

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


def _place_hook(exc: Exception, cb: Callback, hook: str, now: Timestamp) -> None:
    if not isinstance(exc, StopTraining):
        locate_failure(exc, f"callback {cb.name or type(cb).__name__!r} in its "
                            f"{hook.lstrip('_')} hook (step {now.step}, epoch {now.epoch})")
