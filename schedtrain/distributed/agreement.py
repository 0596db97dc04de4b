"""Agreement between processes: what the loop and the dispatcher settle with the other ranks.

The loop and the dispatcher are written for one process. At the few points where ranks
can differ they ask an agreement object: ``Alone`` (one process) does what one process
does and nothing more; ``Agreement`` (several, over a ``Comm``) settles the counters,
the time and the loss where a trigger may be due, reduces the metrics a firing callback
puts, agrees on a stop after an event and preempts every rank at one step. Which points
these are, and why nothing runs on quiet steps, is in docs/distributed.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

from schedtrain.distributed.comm import Comm, first_flagged, reduce_column
from schedtrain.errors import Error, StopTraining

__all__ = ["MAX_BITS", "PREEMPT_CHECK", "Agreement", "Alone", "Counts", "PreemptRequested"]

#: On several processes, ranks look for an agreed preemption every this many steps (a
#: read of the process group's store, no collective): a signal stops every rank within
#: about twice this many steps.
PREEMPT_CHECK: Final = 16

#: The bits the chief carries in an agreement (``Agreement(bits=...)``), above its low
#: time word: 32 + 20 bits stay exact in a float64's 53.
MAX_BITS: Final = 20

#: The loop's counters at a step end: samples, tokens, the samples and tokens before the
#: step, and the time readings of the previous and this step.
Counts = tuple[int, int, int, int, int | None, int | None]


class _Clock(Protocol):
    step: int
    sample: int
    token: int

    def catch_up(self, step: int, *, batch: int, sample: int, token: int, prev_sample: int,
                 prev_token: int, prev_time: int | None, time: int | None) -> None: ...

    def amend(self, *, sample: int, token: int, time: int) -> None: ...

    def elapsed(self, time: int) -> int: ...

    def reading(self, elapsed: int) -> int: ...


class _Inbox(Protocol):
    requested: str | None
    deadline: float | None


class _Losses(Protocol):
    agreed: tuple[int, float] | None

    def host_mean(self, step: int) -> float | None: ...


class _Table(Protocol):
    @property
    def step_due(self) -> float: ...


class _Callback(Protocol):
    produces: Any

    def trigger(self) -> None: ...


class _Dispatch(Protocol):
    """What the agreement reads and sets on the dispatcher."""

    metrics: Any
    stop_reason: str | None

    def request_stop(self, reason: str) -> None: ...


def _no_bits() -> int:
    return 0


def _ignore(bits: int) -> None:
    """Nobody reads the agreed bits."""


class PreemptRequested(Error):
    """The loop's point to preempt has come (every rank at the same one): the run's
    lifecycle fires ``preempt``, checkpoints and ends the run as ``Preempted``.

    Attributes:
        signal: the signal's name that asked (``"SIGTERM"``).
    """

    def __init__(self, signal: str) -> None:
        super().__init__(f"preemption asked by {signal}")
        self.signal = signal


class Alone:
    """One process: nothing to agree; a signal preempts at the next step end.

    Args:
        clock, inbox: the loop's clock and its inbox (a signal's or notice's request).
    """

    def __init__(self, *, clock: _Clock, inbox: _Inbox) -> None:
        self.clock, self.inbox = clock, inbox
        #: the loop's clock must be exact after every step (the loop sets it)
        self.exact = False

    # -- the loop --------------------------------------------------------------------------
    def begin_epoch(self, step: int) -> None:
        """The loop's steps of an epoch start after ``step``."""

    def limit(self, limit: float, step: int) -> float:
        """The loop's next slow-path step, lowered where ranks must look for a signal."""
        return limit

    def catch_up(self, step: int, batches: int, counts: Counts) -> Counts:
        """The clock caught up at a slow-path step; the loop's counters from now on."""
        self.clock.catch_up(step, batch=batches, sample=counts[0], token=counts[1],
                            prev_sample=counts[2], prev_token=counts[3],
                            prev_time=counts[4], time=counts[5])
        return counts

    def end_epoch_steps(self, step: int, counts: Counts) -> Counts:
        """The epoch's steps are over; the loop's counters for its final catch-up."""
        return counts

    def after_step_end(self, step: int) -> None:
        """A slow-path step end is over: preempt here if a signal asked."""
        if (requested := self._requested()) is not None:
            raise PreemptRequested(requested)

    def after_epoch_end(self) -> None:
        """An epoch end is over: preempt here if a signal asked."""
        if (requested := self._requested()) is not None:
            raise PreemptRequested(requested)

    def _requested(self) -> str | None:
        """The stop asked for, once this step end's triggers saw what it carries: a
        notice that came while they were being decided waits for the next step end, so
        ``before_deadline`` fires at the step the run stops at (after the last step end
        none follows: the run finishes)."""
        # `requested` first: a notice sets its deadline before it, so a stop seen here
        # has its deadline seen below.
        requested = self.inbox.requested
        return requested if self.inbox.deadline is None else None

    # -- the dispatcher ------------------------------------------------------------------------
    def begin_event(self) -> None:
        """An outermost event starts."""

    def run_callback(self, dispatch: _Dispatch, name: str, cb: _Callback) -> None:
        """Run a firing callback."""
        cb.trigger()

    def stop_after_event(self, dispatch: _Dispatch, ran: tuple[str, ...]) -> str | None:
        """After an outermost event: why training stops now (``None``: it goes on)."""
        return dispatch.stop_reason

    def hook_stopped(self, dispatch: _Dispatch, exc: Exception, who: str) -> bool:
        """Whether ``StopTraining`` raised in a hook became a stop request (several
        processes); one process lets it end the run at once."""
        return False


class Agreement(Alone):
    """Several processes agreeing through ``comm``.

    Args:
        clock, inbox: as for ``Alone``; where the loop's clock is exact after
            every step (``exact``), every step agrees.
        comm: the ranks' communicator.
        table: the compiled schedule (where a trigger may be due).
        losses: the loss keeper (each rank's mean loss goes into the agreement).
        max_steps: where training ends (agreed there too).
        alone: callback name -> whether it may ask to stop from what only its rank saw.
        hooks_alone: such a callback may ask outside its trigger (in a hook).
        reduce_ops: metric name -> "mean", "sum", "max" or "min" (default "mean").
        bits: what the chief carries to every rank in each agreement (at most
            ``MAX_BITS`` bits; run control's ``waiting_bits``: the agreement does not
            know what they mean).
        on_agreed: given the chief's bits after each agreement, on every rank (run
            control's ``take``).
    """

    def __init__(self, *, clock: _Clock, inbox: _Inbox, comm: Comm, table: _Table,
                 losses: _Losses, max_steps: int | None, alone: Mapping[str, bool],
                 hooks_alone: bool, reduce_ops: Mapping[str, str],
                 bits: Callable[[], int] = _no_bits,
                 on_agreed: Callable[[int], None] = _ignore) -> None:
        super().__init__(clock=clock, inbox=inbox)
        self.comm, self.table, self.losses = comm, table, losses
        self.bits, self.on_agreed = bits, on_agreed
        self.max_steps = max_steps if max_steps is not None else math.inf
        self.alone, self.hooks_alone = dict(alone), hooks_alone
        self.reduce_ops = dict(reduce_ops)
        self.agreed = 0  # the last step whose counters the ranks agreed on
        #: the agreed (step, signal) of a preemption
        self._preempt_at: tuple[int, str] | None = None
        self._synced_time: int | None = None  # the chief's time at the last agreement
        self._signalled = False  # the last agreement found a rank with a pending signal
        self._alone_ran = self._flags_fresh = False
        self._flagged: int | None = None

    # -- the loop --------------------------------------------------------------------------
    def begin_epoch(self, step: int) -> None:
        self.agreed = step

    def limit(self, limit: float, step: int) -> float:
        return min(limit, (step // PREEMPT_CHECK + 1) * PREEMPT_CHECK)

    def catch_up(self, step: int, batches: int, counts: Counts) -> Counts:
        """Where something may fire, the counters are agreed first; elsewhere the clock
        keeps the last agreed counters."""
        clock = self.clock
        sample, token, _, _, prev_time, time = counts
        if self.exact or step >= self.table.step_due or step >= self.max_steps:
            counts = self._agree_counts(step, sample, token, prev_time, time)
            self.agreed = step
            return super().catch_up(step, batches, counts)
        clock.catch_up(step, batch=batches, sample=clock.sample, token=clock.token,
                       prev_sample=clock.sample, prev_token=clock.token, prev_time=prev_time,
                       time=time)
        return counts

    def end_epoch_steps(self, step: int, counts: Counts) -> Counts:
        """Agree on the counters of an epoch's last steps (not agreed at their step ends);
        a step the clock already holds, with the last agreed counters, is corrected."""
        if step <= self.agreed:
            return counts
        agreed = self._agree_counts(step, counts[0], counts[1], counts[4], counts[5],
                                    posted=self.comm.preempt_target() is not None)
        if self.clock.step == step and agreed[5] is not None:
            self.clock.amend(sample=agreed[0], token=agreed[1], time=agreed[5])
        return agreed

    def _agree_counts(self, step: int, sample: int, token: int, prev_time: int | None,
                      time: int | None, *, posted: bool = False) -> Counts:
        """One collective: samples and tokens since the last agreement summed over ranks,
        time made the chief's, (losses on the CPU) the ranks' mean loss for
        ``train/loss``, and whether a rank has a signal pending (or saw one ``posted``).
        Returns the counters and the time readings of this and the previous agreement."""
        comm, clock, losses = self.comm, self.clock, self.losses
        assert time is not None
        prev_sample, prev_token = clock.sample, clock.token
        elapsed = clock.elapsed(time) if comm.is_chief else 0
        loss = losses.host_mean(step)
        # The chief's bits ride above its low time word, from bit 32 (no float of their
        # own: an agreement stays 7 floats a rank, each exact in a float64).
        bits = self.bits() if comm.is_chief else 0
        if not 0 <= bits < 1 << MAX_BITS:
            raise ValueError(f"an agreement carries {MAX_BITS} bits, got {bits!r}")
        rows = comm.agree((sample - prev_sample, token - prev_token,
                           elapsed >> 32, (elapsed & 0xFFFFFFFF) | bits << 32,
                           0.0 if loss is None else loss, float(loss is not None),
                           float(posted or self.inbox.requested is not None)))
        self._signalled = first_flagged(rows, 6) is not None
        self.on_agreed(int(rows[0][3]) >> 32)
        ds = sum(int(r[0]) for r in rows)
        dt = sum(int(r[1]) for r in rows)
        mean = reduce_column(rows, 4, 5, "mean")
        losses.agreed = None if mean is None else (step, mean)
        if not comm.is_chief:
            chief = (int(rows[0][2]) << 32) | (int(rows[0][3]) & 0xFFFFFFFF)
            prev_time, time = self._synced_time, clock.reading(chief)
            self._synced_time = time
        return prev_sample + ds, prev_token + dt, prev_sample, prev_token, prev_time, time

    def after_step_end(self, step: int) -> None:
        """Preempt every rank at one step.

        A rank that got a signal proposes, at a check step ``s`` (a multiple of
        ``PREEMPT_CHECK``, a slow-path step on every rank), to stop at ``s + 2``; no rank
        can be past ``s + 1`` then (gradients synchronise every step), and every rank
        reads the store at each later check step, so all stop at the first check step
        at or after the agreed one. The store is read, no collective runs.
        """
        if step % PREEMPT_CHECK:
            return
        comm = self.comm
        if self._preempt_at is None:
            if self.inbox.requested is not None:
                self._preempt_at = comm.post_preempt(step + 2, self.inbox.requested)
            else:
                self._preempt_at = comm.preempt_target()
        if self._preempt_at is not None and step >= self._preempt_at[0]:
            raise PreemptRequested(self._preempt_at[1])

    def after_epoch_end(self) -> None:
        """Epoch ends are common to every rank: the epoch's last agreement carried whether
        a rank had a signal (a later one is seen at the next check)."""
        if not self._signalled:
            return
        posted = self.comm.preempt_target()
        if posted is None:
            # A rank that had no signal waits for the one that had: it posts at this epoch
            # end too, under its signal's own name (a notice's source, SIGINT...).
            requested = self.inbox.requested
            posted = (self.comm.post_preempt(self.clock.step, requested)
                      if requested is not None else self.comm.await_preempt())
        raise PreemptRequested(posted[1])

    # -- the dispatcher ------------------------------------------------------------------------
    def begin_event(self) -> None:
        self._alone_ran = self._flags_fresh = False

    def run_callback(self, dispatch: _Dispatch, name: str, cb: _Callback) -> None:
        """Run a callback: the metrics it puts (its ``produces``) are reduced across ranks
        before anything else reads them."""
        if self.alone[name]:
            self._alone_ran = True
        metrics = dispatch.metrics
        outer, metrics.recorder = metrics.recorder, []
        try:
            cb.trigger()
        except StopTraining as exc:  # one rank's: the ranks agree on it after the event
            dispatch.request_stop(str(exc) or f"{name} raised StopTraining")
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
        reduced, self._flagged = self.comm.reduce_floats(values, ops,
                                                         dispatch.stop_reason is not None)
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

    def stop_after_event(self, dispatch: _Dispatch, ran: tuple[str, ...]) -> str | None:
        """A stop requested on any rank, with its reason, on all; decided together where
        callbacks ran (the same events on every rank).

        No collective when every callback that ran stops only from what all ranks share
        (``may_stop_alone`` false: they asked alike), or when the last metric reduction,
        after the last callback ran, carried the ranks' stop flags."""
        if not ran:
            return None
        comm = self.comm
        if self._flags_fresh:
            rank = self._flagged
        elif self._alone_ran or self.hooks_alone:
            rank = comm.first_flagged(dispatch.stop_reason is not None)
        else:
            return dispatch.stop_reason
        if rank is None:
            return None
        reason = comm.broadcast(dispatch.stop_reason, src=rank)
        dispatch.stop_reason = reason if rank == comm.rank else f"{reason} (on rank {rank})"
        return dispatch.stop_reason

    def hook_stopped(self, dispatch: _Dispatch, exc: Exception, who: str) -> bool:
        """``StopTraining`` raised by a hook on one rank becomes that rank's stop request,
        agreed at the next event where a callback runs."""
        if not isinstance(exc, StopTraining):
            return False
        dispatch.request_stop(str(exc) or f"{who} raised StopTraining")
        return True
