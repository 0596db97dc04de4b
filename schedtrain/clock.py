"""The ``Clock`` interface and ``LoopClock``, the clock a training loop drives.

The clock is the only thing that advances time. Its counters are plain
attributes so the trigger table can compare them on the hot path without
building a ``Timestamp``; snapshots are made only when something may fire.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

import attrs

from schedtrain.time import Timestamp

__all__ = ["Clock", "LoopClock"]


class Clock(abc.ABC):
    """Counters of completed training time, read by the trigger table.

    Implementations keep the counters as plain attributes (read on every
    step) and return ``Timestamp`` snapshots on demand.
    """

    __slots__ = ()

    step: int
    batch: int
    epoch: int
    step_in_epoch: int
    sample: int
    token: int
    time_ns: int
    #: Whether an epoch has started and not ended (tensorpack's ``epoch_num`` counts it).
    in_epoch: bool

    @abc.abstractmethod
    def now(self) -> Timestamp:
        """A snapshot of the counters at this moment."""

    @abc.abstractmethod
    def previous(self, event: str) -> Timestamp:
        """The counters at the previous evaluation point of ``event``.

        Periodic triggers fire when a counter crosses a grid point between
        ``previous(event)`` and ``now()``. Only ``step_end`` needs a real
        snapshot (samples, tokens and seconds jump by arbitrary amounts per
        step); at other events a trigger's own counter moves by exactly one.
        """

    def state_dict(self) -> dict[str, Any]:
        """The counters (and the previous step-end snapshot) as plain data."""
        prev = self.previous("step_end")
        return {
            "now": attrs.asdict(self.now()),
            "previous_step_end": attrs.asdict(prev),
        }

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore counters saved by ``state_dict``."""


def step_back(now: Timestamp, event: str) -> Timestamp:
    """The previous point of ``event`` for events whose own counter moves by one."""
    if event == "epoch_end":
        return Timestamp.make(now.step, now.batch, max(now.epoch - 1, 0), now.step_in_epoch,
                              now.sample, now.token, now.time_ns)
    if event == "batch_end":
        return Timestamp.make(now.step, max(now.batch - 1, 0), now.epoch, now.step_in_epoch,
                              now.sample, now.token, now.time_ns)
    return now


class LoopClock(Clock):
    """The clock of a real training loop.

    The loop calls ``start_train``, ``start_epoch``, ``end_batch`` (with the
    samples and tokens the batch reports), ``end_step`` and ``end_epoch``.
    ``time_ns`` is training wall time in nanoseconds, carried across resume; time
    between ``stop_train`` and the next ``start_train`` (downtime) is excluded.

    Args:
        time_source: returns a monotonic time in nanoseconds (default
            ``time.perf_counter_ns``); tests pass a fake one to make wall time exact.
    """

    # Slots: the loop updates these on every step, and slot access is the cheapest.
    __slots__ = ("_base_ns", "_last", "_now_ns", "_prev", "_t0", "batch", "epoch", "in_epoch",
                 "sample", "step", "step_in_epoch", "time_ns", "token")

    def __init__(self, time_source: Callable[[], int] = perf_counter_ns) -> None:
        self.step = 0
        self.batch = 0
        self.epoch = 0
        self.step_in_epoch = 0
        self.in_epoch = False
        self.sample = 0
        self.token = 0
        self.time_ns = 0
        self._now_ns = time_source
        self._t0 = time_source()
        self._base_ns = 0
        # (sample, token, time_ns) at the last and the previous step end; kept apart from
        # the live counters because batches of the next step advance them before its end.
        self._last: tuple[int, int, int] = (0, 0, 0)
        self._prev: tuple[int, int, int] = (0, 0, 0)

    @property
    def time_source(self) -> Callable[[], int]:
        """The monotonic nanosecond source wall time is read from."""
        return self._now_ns

    def elapsed(self, reading: int) -> int:
        """Training time (ns) at the ``time_source`` reading ``reading``."""
        return self._base_ns + (reading - self._t0)

    def reading(self, elapsed_ns: int) -> int:
        """The ``time_source`` reading at which training time is ``elapsed_ns``."""
        return elapsed_ns - self._base_ns + self._t0

    def start_train(self) -> None:
        """Start (or resume) the wall-time count."""
        self._base_ns = self.time_ns
        self._t0 = self._now_ns()

    def stop_train(self) -> None:
        """Freeze the wall-time count (called at train end)."""
        self.time_ns = self._base_ns + (self._now_ns() - self._t0)

    def start_epoch(self) -> None:
        """A new epoch begins: ``step_in_epoch`` restarts at 0."""
        self.step_in_epoch = 0
        self.in_epoch = True

    def end_batch(self, samples: int = 0, tokens: int = 0) -> None:
        """A micro-batch completed, having seen ``samples`` samples and ``tokens`` tokens."""
        self.batch += 1
        self.sample += samples
        self.token += tokens

    def end_step(self) -> None:
        """An optimizer step completed."""
        # Called on every step: two tuple stores instead of six attribute stores.
        self._prev = self._last
        self.step += 1
        self.step_in_epoch += 1
        self.time_ns = t = self._base_ns + (self._now_ns() - self._t0)
        self._last = (self.sample, self.token, t)

    def catch_up(self, step: int, *, batch: int, sample: int, token: int, prev_sample: int,
                 prev_token: int, prev_time: int | None, time: int | None) -> None:
        """Record steps that a loop counted in its own variables.

        The loop ran up to step ``step`` and the counters ``batch``, ``sample`` and
        ``token``; ``prev_sample``, ``prev_token`` are theirs at the previous step's end,
        and ``prev_time``, ``time`` the ``time_source()`` readings at both step ends
        (``None`` for the step the clock already holds). Equal to the ``end_batch`` and
        ``end_step`` calls of those steps, taken at once; with no new step it does nothing.
        """
        k = step - self.step
        if k <= 0 or time is None:
            return
        base, t0 = self._base_ns, self._t0
        self._prev = (self._last if prev_time is None
                      else (prev_sample, prev_token, base + (prev_time - t0)))
        self.time_ns = t = base + (time - t0)
        self._last = (sample, token, t)
        self.step_in_epoch += k
        self.step, self.batch, self.sample, self.token = step, batch, sample, token

    def amend(self, *, sample: int, token: int, time: int) -> None:
        """Correct the counters and time of the step the clock holds (on several processes,
        a step recorded with the last agreed counters, agreed on later), as read by
        ``time_source()``."""
        self.sample, self.token = sample, token
        self.time_ns = t = self._base_ns + (time - self._t0)
        self._last = (sample, token, t)

    def end_epoch(self) -> None:
        """An epoch completed."""
        self.epoch += 1
        self.in_epoch = False

    def now(self) -> Timestamp:
        return Timestamp.make(self.step, self.batch, self.epoch, self.step_in_epoch,
                              self.sample, self.token, self.time_ns)

    def previous(self, event: str) -> Timestamp:
        if event != "step_end":
            return step_back(self.now(), event)
        sample, token, time_ns = self._prev
        return Timestamp.make(max(self.step - 1, 0), self.batch, self.epoch,
                              self.step_in_epoch, sample, token, time_ns)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        now = Timestamp.make(**state["now"])
        prev = Timestamp.make(**state["previous_step_end"])
        self.step, self.batch, self.epoch = now.step, now.batch, now.epoch
        self.step_in_epoch, self.sample, self.token = now.step_in_epoch, now.sample, now.token
        self.time_ns = now.time_ns
        self._last = (now.sample, now.token, now.time_ns)
        self._prev = (prev.sample, prev.token, prev.time_ns)
        self._base_ns = self.time_ns
