"""The one training loop: epochs, and in each the optimizer steps of a step strategy.

What varies per step (plain, accumulation, AMP, a user's step function) is the step
strategy (``training.steps``); the loop is the same for all. On a step where nothing
can happen the loop does the step, keeps its loss on the device, counts it in local
variables and compares the step once with ``guard.limit``: the next step at which a
trigger is due, the loss sum is folded, training ends or a signal asked to stop. Only
then is the clock caught up and the slow path taken. When something must see every
step (per-step hooks, ``batch_end``, a user step function that may read the clock), the
limit is the next step, and the clock is exact after each.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, Final

import torch

from schedtrain.callbacks.base import StepOutputs
from schedtrain.clock import LoopClock
from schedtrain.distributed.comm import Comm, first_flagged, reduce_column
from schedtrain.schedule.table import TriggerTable
from schedtrain.training.data_position import DataPosition
from schedtrain.training.dispatch import Dispatcher
from schedtrain.training.losses import FOLD, LossKeeper
from schedtrain.training.preempt import PREEMPT_CHECK, Guard
from schedtrain.training.steps import PlainStep, Step, make_step

__all__ = ["Loop"]

_END: Final = object()
_PAIR: Final = (tuple, list)


class Loop:
    """Runs epochs of steps, firing events through the dispatcher.

    Args:
        clock, table, dispatch, losses, position: the run's parts.
        step: the step strategy.
        guard: the next due step, lowered to 0 by a signal.
        max_epochs, max_steps: when training ends (``None``: no limit).
        steps_in_epoch: optimizer steps per epoch, when the data has a length.
        exact: the clock must be exact after every step (per-step hooks, ``batch_end``,
            a user step function).
        on_preempt: called at the first step end after a signal; does not return.
        comm: agreement between ranks on several processes (``None``: one process).
    """

    def __init__(
        self,
        *,
        clock: LoopClock,
        table: TriggerTable,
        dispatch: Dispatcher,
        losses: LossKeeper,
        position: DataPosition,
        step: PlainStep | Step,
        guard: Guard,
        max_epochs: int | None,
        max_steps: int | None,
        steps_in_epoch: int | None,
        exact: bool,
        on_preempt: Callable[[str], None],
        publish_loss: Callable[[], None],
        comm: Comm | None = None,
    ) -> None:
        self.clock, self.table, self.dispatch = clock, table, dispatch
        self.losses, self.position, self.step, self.guard = losses, position, step, guard
        self.max_epochs = max_epochs if max_epochs is not None else math.inf
        self.max_steps = max_steps if max_steps is not None else math.inf
        self.steps_in_epoch, self.exact = steps_in_epoch, exact
        self._on_preempt, self._publish_loss = on_preempt, publish_loss
        self.comm = comm
        #: the agreed (step, signal) of a preemption on several processes
        self._preempt_at: tuple[int, str] | None = None
        self._synced_time: int | None = None  # the chief's time at the last agreement
        #: whether the last agreement found a rank with a pending signal
        self._signalled = False
        #: an epoch was started and has not ended (a checkpoint taken now resumes inside it)
        self.epoch_open = False
        self.resume_inside_epoch = False

    @classmethod
    def build(cls, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              loss_fn: Callable[[Any, Any], torch.Tensor] | None, step_fn: Any,
              grad_accum: int, grad_clip: float | None, device: torch.device, scaler: Any,
              autocast: Callable[[], Any] | None, variable_accum: bool = False,
              **parts: Any) -> Loop:
        """The loop for a run, with the step strategy its options and hooks need.

        ``parts`` are the other arguments of ``Loop`` (the clock, the table, the
        dispatcher...). ``PlainStep`` serves when nothing but the loss is computed on the
        CPU in fp32 and ``grad_accum`` stays 1 (``variable_accum``: a callback changes it
        between epochs); otherwise a ``Step`` gets the parts the run needs.
        """
        dispatch, clock, table = parts["dispatch"], parts["clock"], parts["table"]
        hooks = dispatch.hooks
        per_step = any(hooks[h] for h in ("_before_step", "_after_backward",
                                          "_before_optimizer_step", "_after_step",
                                          "_trigger_step"))
        plain = (grad_accum == 1 and scaler is None and autocast is None and grad_clip is None
                 and device.type == "cpu" and not per_step and not table.needs_batch_end
                 and step_fn is None and not variable_accum)

        def gradient_hook(name: str) -> Callable[[], None] | None:
            if not hooks[name]:
                return None
            return lambda: dispatch.run_hooks(name, clock.now(), clock.step + 1)

        loop: Loop
        step = make_step(model, optimizer, loss_fn=loss_fn, step_fn=step_fn, plain=plain,
                         **({} if plain else {
                             "accum": grad_accum, "scaler": scaler, "clip": grad_clip,
                             "device": device if device.type != "cpu" else None,
                             "autocast": autocast,
                             # `loop` is made below: look it up when a batch ends
                             "on_batch": ((lambda n, t: loop.batch_end(n, t))  # noqa: PLW0108
                                          if table.needs_batch_end else None),
                             "after_backward": gradient_hook("_after_backward"),
                             "before_optimizer_step": gradient_hook("_before_optimizer_step"),
                         }))
        loop = cls(step=step, exact=not plain, **parts)
        return loop

    # -- epochs --------------------------------------------------------------------------------
    def run(self) -> None:
        """Epochs until ``max_epochs``/``max_steps`` (exceptions end it early)."""
        clock, dispatch = self.clock, self.dispatch
        while clock.epoch < self.max_epochs and clock.step < self.max_steps:
            inside, self.resume_inside_epoch = self.resume_inside_epoch, False
            if not inside:
                clock.start_epoch()  # before the hooks: they see step_in_epoch == 0
            dispatch.run_hooks("_before_epoch", clock.now())
            if inside:
                it = self.position.resume_epoch(clock.step_in_epoch * self._accum, clock.epoch)
            else:
                self.epoch_open = True
                dispatch.fire("epoch_start")
                it = self.position.start_epoch(clock.epoch)
            if not self._steps(it):
                return  # max_steps reached mid-epoch: no epoch_end for a partial epoch
            clock.end_epoch()
            self.epoch_open = False
            now = clock.now()
            dispatch.run_hooks("_after_epoch", now)
            dispatch.run_hooks("_trigger_epoch", now)
            self._publish_loss()
            dispatch.fire("epoch_end")
            dispatch.metrics.flush()
            if self.comm is not None:
                # Epoch ends are common to every rank: the epoch's last agreement carried
                # whether a rank had a signal (a later one is seen at the next check).
                if self._signalled:
                    self._on_preempt(self._agreed_signal())
            elif self.guard.requested is not None:
                self._on_preempt(self.guard.requested)

    @property
    def _accum(self) -> int:
        step = self.step
        return step.accum if isinstance(step, Step) else 1

    def _exhausted(self, it: Iterator[Any]) -> bool:
        """At ``max_steps``: whether the epoch's data is used up (then it ends normally).

        For data of unknown length, look one batch ahead; training ends either way.
        """
        n = self.steps_in_epoch
        if n is not None:
            return self.clock.step_in_epoch >= n
        return next(it, _END) is _END

    # -- steps ---------------------------------------------------------------------------------
    def _steps(self, it: Iterator[Any]) -> bool:
        """The steps of one epoch; ``False`` when ``max_steps`` ended it early."""
        clock, guard, step_obj, losses = self.clock, self.guard, self.step, self.losses.losses
        run_step = step_obj.run  # a bound method, looked up once
        max_steps = self.max_steps
        before = self.dispatch.hooks["_before_step"]
        # A plain step's body runs inline for the common batch (a tuple or list whose
        # inputs are a tensor): one Python call a step costs about 2,400 instructions,
        # half a percent of a small model's step (docs/performance.md); any other batch
        # goes through `PlainStep.run`, the strategy's definition.
        plain = step_obj if type(step_obj) is PlainStep else None
        model, loss_fn, opt = ((plain.model, plain.loss_fn, plain.optimizer)
                               if plain is not None else (None, None, None))
        pair, tensor = _PAIR, torch.Tensor
        step, batches, sample, token = clock.step, clock.batch, clock.sample, clock.token
        prev_sample, prev_token = sample, token
        time: int | None = None
        prev_time: int | None = None
        catch_up, now_ns = clock.catch_up, clock.time_source
        comm = self.comm
        agreed = step  # the last step whose counters the ranks agreed on
        guard.set_limit(self._limit(step, len(losses)))
        try:
            for first in it:
                if before:
                    self._before_step(step + 1, first)
                if (plain is not None and type(first) in pair and len(first) == 2
                        and type(inputs := first[0]) is tensor and (shape := inputs.shape)):
                    graph = loss_fn(model(inputs), first[1])  # type: ignore[misc]
                    graph.backward()
                    opt.step()  # type: ignore[union-attr]
                    opt.zero_grad(set_to_none=True)  # type: ignore[union-attr]
                    loss, outputs, n, n_samples, n_tokens = graph.data, None, 1, shape[0], 0
                else:
                    loss, outputs, n, n_samples, n_tokens = run_step(first, it)
                losses.append(loss)
                prev_sample, prev_token = sample, token
                step += 1
                batches += n
                sample += n_samples
                token += n_tokens
                prev_time, time = time, now_ns()
                if step >= guard.limit:
                    if comm is None:
                        catch_up(step, batch=batches, sample=sample, token=token,
                                 prev_sample=prev_sample, prev_token=prev_token,
                                 prev_time=prev_time, time=time)
                    else:
                        (sample, token, prev_sample, prev_token, prev_time, time), agreed = \
                            self._catch_up_ranks(step, batches, (sample, token, prev_sample,
                                                                 prev_token, prev_time, time),
                                                 agreed)
                    self._step_end(step, loss, outputs, first)
                    if step >= max_steps:
                        return self._exhausted(it)
                    guard.set_limit(self._limit(step, len(losses)))
            if comm is not None and step > agreed:  # the epoch's last steps
                sample, token, prev_sample, prev_token, prev_time, time = \
                    self._agree_epoch_end(step, sample, token, prev_time, time)
        finally:  # the clock holds every completed step, however the loop ends
            catch_up(step, batch=batches, sample=sample, token=token, prev_sample=prev_sample,
                     prev_token=prev_token, prev_time=prev_time, time=time)
        return True

    def _before_step(self, step: int, batch: Any) -> None:
        """``before_step`` hooks; what they fetch goes to a ``Step`` strategy."""
        fetches = self.dispatch.before_step(self.clock.now(), step, batch)
        if isinstance(self.step, Step):
            self.step.fetches = fetches

    def _catch_up_ranks(self, step: int, batches: int,
                        counts: tuple[int, int, int, int, int | None, int | None],
                        agreed: int) -> tuple[tuple[int, int, int, int, int | None, int | None],
                                              int]:
        """The slow path's catch-up on several processes: where something may fire, the
        counters are agreed first (``agreed`` becomes ``step``); elsewhere the clock keeps
        the last agreed counters. Returns the loop's counters and ``agreed``."""
        clock = self.clock
        sample, token, _, _, prev_time, time = counts
        if self.exact or step >= self.table.step_due or step >= self.max_steps:
            counts = self._agree_counts(step, sample, token, prev_time, time)
            clock.catch_up(step, batch=batches, sample=counts[0], token=counts[1],
                           prev_sample=counts[2], prev_token=counts[3], prev_time=counts[4],
                           time=counts[5])
            return counts, step
        clock.catch_up(step, batch=batches, sample=clock.sample, token=clock.token,
                       prev_sample=clock.sample, prev_token=clock.token, prev_time=prev_time,
                       time=time)
        return counts, agreed

    def _agree_epoch_end(self, step: int, sample: int, token: int, prev_time: int | None,
                         time: int | None) -> tuple[int, int, int, int, int | None, int | None]:
        """Agree on the counters of an epoch's last steps (not agreed at their step ends);
        a step the clock already holds, with the last agreed counters, is corrected."""
        counts = self._agree_counts(step, sample, token, prev_time, time,
                                    posted=self.comm is not None
                                    and self.comm.preempt_target() is not None)
        if self.clock.step == step and counts[5] is not None:
            self.clock.amend(sample=counts[0], token=counts[1], time=counts[5])
        return counts

    def _step_end(self, step: int, loss: Any, outputs: Any, batch: Any) -> None:
        """The slow path once the clock has caught up: fold the kept losses, per-step
        hooks, ``step_end`` where a trigger is due, and a requested preemption."""
        dispatch, hooks = self.dispatch, self.dispatch.hooks
        if len(self.losses.losses) >= FOLD:
            self.losses.fold()
        after, trig = hooks["_after_step"], hooks["_trigger_step"]
        if after or trig:
            now = self.clock.now()
            if after:
                step_obj = self.step
                fetched = step_obj.fetched if isinstance(step_obj, Step) else {}
                dispatch.after_step(now, step, StepOutputs(loss, outputs, batch, fetched))
            if trig:
                dispatch.run_hooks("_trigger_step", now)
        if step >= self.table.step_due:
            dispatch.fire("step_end")
        elif dispatch.saves.pending:  # saves asked for by a hook
            dispatch.saves.flush("step_end")
        if self.comm is not None:
            self._agree_preempt(step)
        elif self.guard.requested is not None:
            self._on_preempt(self.guard.requested)

    def _agree_counts(self, step: int, sample: int, token: int, prev_time: int | None,
                      time: int | None, *, posted: bool = False
                      ) -> tuple[int, int, int, int, int | None, int | None]:
        """On several processes, where something may fire, one collective: samples and
        tokens since the last agreement summed over ranks, time made the chief's, (losses
        on the CPU) the ranks' mean loss for ``train/loss``, and whether a rank has a
        signal pending (or saw one ``posted``). Returns the counters and the time readings
        of this and the previous agreement, for the clock."""
        comm, clock, losses = self.comm, self.clock, self.losses
        assert comm is not None and time is not None
        prev_sample, prev_token = clock.sample, clock.token
        elapsed = clock.elapsed(time) if comm.is_chief else 0
        loss = losses.host_mean(step)
        rows = comm.agree((sample - prev_sample, token - prev_token,
                           elapsed >> 32, elapsed & 0xFFFFFFFF,  # each exact in a float64
                           0.0 if loss is None else loss, float(loss is not None),
                           float(posted or self.guard.requested is not None)))
        self._signalled = first_flagged(rows, 6) is not None
        ds = sum(int(r[0]) for r in rows)
        dt = sum(int(r[1]) for r in rows)
        mean = reduce_column(rows, 4, 5, "mean")
        losses.agreed = None if mean is None else (step, mean)
        if not comm.is_chief:
            chief = (int(rows[0][2]) << 32) | int(rows[0][3])
            prev_time, time = self._synced_time, clock.reading(chief)
            self._synced_time = time
        return prev_sample + ds, prev_token + dt, prev_sample, prev_token, prev_time, time

    def _limit(self, step: int, kept: int) -> float:
        """The next step at which the slow path runs: a trigger is due, training ends or
        the kept losses are folded; on several processes also the next multiple of
        ``PREEMPT_CHECK``, where ranks look for an agreed preemption."""
        if self.exact:
            return 0
        limit = min(self.table.step_due, self.max_steps, step + FOLD - kept)
        if self.comm is not None:
            limit = min(limit, (step // PREEMPT_CHECK + 1) * PREEMPT_CHECK)
        return limit

    def _agree_preempt(self, step: int) -> None:
        """On several processes: preempt every rank at one step.

        A rank that got a signal proposes, at a check step ``s`` (a multiple of
        ``PREEMPT_CHECK``, a slow-path step on every rank), to stop at ``s + 2``; no rank
        can be past ``s + 1`` then (gradients synchronise every step), and every rank
        reads the store at each later check step, so all stop at the first check step
        at or after the agreed one. The store is read, no collective runs.
        """
        if step % PREEMPT_CHECK:
            return
        comm = self.comm
        assert comm is not None
        if self._preempt_at is None:
            if self.guard.requested is not None:
                self._preempt_at = comm.post_preempt(step + 2, self.guard.requested)
            else:
                self._preempt_at = comm.preempt_target()
        if self._preempt_at is not None and step >= self._preempt_at[0]:
            self._on_preempt(self._preempt_at[1])

    def _agreed_signal(self) -> str:
        comm = self.comm
        assert comm is not None
        posted = comm.preempt_target()
        if posted is not None:
            return posted[1]
        return comm.post_preempt(self.clock.step, self.guard.requested or "SIGTERM")[1]

    def batch_end(self, samples: int, tokens: int) -> None:
        """A micro-batch ended: count it and fire ``batch_end`` (the step calls this)."""
        self.clock.end_batch(samples, tokens)
        self.dispatch.fire("batch_end")
