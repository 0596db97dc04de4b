"""The one training loop: epochs, and in each the optimizer steps of a step strategy.

What varies per step (plain, accumulation, AMP, a user's step function) is the step
strategy (``training.steps``); the loop is the same for all. On a step where nothing
can happen the loop does the step, keeps its loss on the device, counts it in local
variables and compares the step once with ``inbox.limit``: the next step at which a
trigger is due, the loss sum is folded, training ends or a signal asked to stop. Only
then is the clock caught up and the slow path taken. When something must see every
step (per-step or per-micro-batch hooks, ``batch_start``/``batch_end``, a user step
function that may read the clock), the limit is the next step, and the clock is exact
after each.

The loop is the one-process loop: where ranks of a run on several processes must agree
(counters, time and loss where a trigger may be due, a preemption) it asks its
``agreement`` (``distributed.agreement``), which on one process does nothing more.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from typing import Any, Final

import torch

from schedtrain.callbacks.base import BATCH_HOOKS
from schedtrain.callbacks.payloads import StepOutputs
from schedtrain.clock import LoopClock
from schedtrain.distributed.agreement import Alone
from schedtrain.schedule.table import TriggerTable
from schedtrain.spec.run import RunConfig
from schedtrain.training.batch_events import BatchEvents
from schedtrain.training.control import RunControl
from schedtrain.training.data_position import DataPosition, EpochFlag
from schedtrain.training.device import autocast
from schedtrain.training.dispatch import Dispatcher
from schedtrain.training.losses import FOLD, LossKeeper
from schedtrain.training.steps import PlainStep, Step, make_step

__all__ = ["Loop"]

_END: Final = object()
_PAIR: Final = (tuple, list)


class Loop:
    """Runs epochs of steps, firing events through the dispatcher.

    Args:
        clock, table, dispatch, losses, position: the run's parts.
        step: the step strategy.
        control: run control (``training.control``): its inbox holds the next due step,
            lowered to 0 by a signal, a notice or a background save that ended.
        max_epochs, max_steps: when training ends (``None``: no limit).
        steps_in_epoch: optimizer steps per epoch, when the data has a length.
        exact: the clock must be exact after every step (per-step hooks, ``batch_end``,
            a user step function).
        agreement: what the ranks settle together (``Alone`` on one process).
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
        control: RunControl,
        epoch: EpochFlag,
        max_epochs: int | None,
        max_steps: int | None,
        steps_in_epoch: int | None,
        exact: bool,
        publish_loss: Callable[[], None],
        agreement: Alone,
    ) -> None:
        self.clock, self.table, self.dispatch = clock, table, dispatch
        self.losses, self.position, self.step = losses, position, step
        #: run control; its inbox's ``limit`` is the quiet step's one comparison
        self.control, self.inbox = control, control.inbox
        self.max_epochs = max_epochs if max_epochs is not None else math.inf
        self.max_steps = max_steps if max_steps is not None else math.inf
        self.steps_in_epoch, self.exact = steps_in_epoch, exact
        self._publish_loss, self.agreement = publish_loss, agreement
        agreement.exact = exact
        #: whether an epoch is open (shared with the run's state, which checkpoints it)
        self.epoch = epoch
        #: optimizer steps in the epoch being run (a resumed, re-divided one: its own)
        self.epoch_steps = steps_in_epoch

    @classmethod
    def build(cls, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              loss_fn: Callable[[Any, Any], torch.Tensor] | None, step_fn: Any,
              config: RunConfig, device: torch.device, scaler: Any,
              variable_accum: bool = False, **parts: Any) -> Loop:
        """The loop for a run, with the step strategy its options and hooks need.

        ``config`` gives accumulation, clipping and precision; ``parts`` are the other
        arguments of ``Loop`` (the clock, the table, the dispatcher...). ``PlainStep``
        serves when nothing but the loss is computed on the CPU in fp32 and
        ``grad_accum`` stays 1 (``variable_accum``: a callback changes it between
        epochs); otherwise a ``Step`` gets the parts the run needs.
        """
        dispatch, clock, table = parts["dispatch"], parts["clock"], parts["table"]
        hooks = dispatch.hooks
        per_step = any(hooks[h] for h in ("_before_step", "_after_backward",
                                          "_before_optimizer_step", "_after_step",
                                          "_trigger_step"))
        # Per micro-batch: a hook overridden, or a trigger naming batch_start/batch_end.
        per_batch = (any(hooks[h] for h in BATCH_HOOKS) or table.needs_batch_start
                     or table.needs_batch_end)
        grad_accum, grad_clip, precision = config.grad_accum, config.grad_clip, config.precision
        in_autocast = (None if precision == "fp32"
                       else functools.partial(autocast, precision, device))
        plain = (grad_accum == 1 and scaler is None and in_autocast is None and grad_clip is None
                 and device.type == "cpu" and not per_step and not per_batch
                 and step_fn is None and not variable_accum)

        def gradient_hook(name: str) -> Callable[[], None] | None:
            if not hooks[name]:
                return None
            return lambda: dispatch.run_hooks(name, clock.now(), clock.step + 1)

        step = make_step(model, optimizer, loss_fn=loss_fn, step_fn=step_fn, plain=plain,
                         **({} if plain else {
                             "accum": grad_accum, "scaler": scaler, "clip": grad_clip,
                             "device": device if device.type != "cpu" else None,
                             "autocast": in_autocast,
                             "batch_events": (BatchEvents(
                                 clock, dispatch, fire_start=table.needs_batch_start,
                                 fire_end=table.needs_batch_end) if per_batch else None),
                             "after_backward": gradient_hook("_after_backward"),
                             "before_optimizer_step": gradient_hook("_before_optimizer_step"),
                         }))
        return cls(step=step, exact=not plain, **parts)

    # -- epochs --------------------------------------------------------------------------------
    def run(self) -> None:
        """Epochs until ``max_epochs``/``max_steps`` (exceptions end it early)."""
        clock, dispatch, flag = self.clock, self.dispatch, self.epoch
        # A run resumed inside an epoch finishes it, even at max_steps: the checkpoint
        # may be of the epoch's last step, taken before its epoch_end.
        while flag.resume_inside or (clock.epoch < self.max_epochs
                                     and clock.step < self.max_steps):
            inside, flag.resume_inside = flag.resume_inside, False
            if not inside:
                clock.start_epoch()  # before the hooks: they see step_in_epoch == 0
            dispatch.run_hooks("_before_epoch", clock.now())
            if inside:
                clock.in_epoch = True  # resumed inside it: no start_epoch, the epoch is open
                it = self.position.resume_epoch(clock.step_in_epoch * self._accum, clock.epoch)
                self._reshaped()
            else:
                flag.open = True
                self.epoch_steps = self.steps_in_epoch
                dispatch.fire("epoch_start")
                it = self.position.start_epoch(clock.epoch)
            # At max_steps already (resumed there): the epoch ends as the uninterrupted run
            # decided, by whether its data was used up.
            ends = self._exhausted(it) if clock.step >= self.max_steps else self._steps(it)
            if not ends:
                return  # max_steps reached mid-epoch: no epoch_end for a partial epoch
            clock.end_epoch()
            flag.open = False
            now = clock.now()
            self._publish_loss()  # the epoch's own train/loss, for its hooks and triggers
            dispatch.run_hooks("_after_epoch", now)
            dispatch.run_hooks("_trigger_epoch", now)
            dispatch.fire("epoch_end")
            dispatch.metrics.epoch_ended(now)  # flushes; a sink's epoch cadence ends
            self.agreement.after_epoch_end()

    def _reshaped(self) -> None:
        """The resumed epoch was re-divided among another number of ranks: its length
        and the run's last step (``final_step``) are those of the changed shape."""
        batches = self.position.epoch_batches
        if batches is None:
            return
        clock, per_epoch = self.clock, self.steps_in_epoch
        self.epoch_steps = -(-batches // self._accum)
        last = clock.step - clock.step_in_epoch + self.epoch_steps
        if per_epoch is None or math.isinf(self.max_epochs):
            self.table.final_step = None
            return
        last += (int(self.max_epochs) - clock.epoch - 1) * per_epoch
        self.table.final_step = last if last <= self.max_steps else None

    @property
    def _accum(self) -> int:
        step = self.step
        return step.accum if isinstance(step, Step) else 1

    def _exhausted(self, it: Iterator[Any]) -> bool:
        """At ``max_steps``: whether the epoch's data is used up (then it ends normally).

        For data of unknown length, look one batch ahead; training ends either way.
        """
        n = self.epoch_steps
        if n is not None:
            return self.clock.step_in_epoch >= n
        return next(it, _END) is _END

    # -- steps ---------------------------------------------------------------------------------
    def _steps(self, it: Iterator[Any]) -> bool:
        """The steps of one epoch; ``False`` when ``max_steps`` ended it early."""
        clock, inbox, step_obj, keeper = self.clock, self.inbox, self.step, self.losses
        # `run_step`: a bound method, looked up once
        run_step, max_steps, before = (step_obj.run, self.max_steps,
                                       self.dispatch.hooks["_before_step"])
        # A plain step's body runs inline for the common batch (a tuple or list whose
        # inputs are a tensor): one Python call a step costs about 2,400 instructions,
        # half a percent of a small model's step (docs/performance.md); any other batch
        # goes through `PlainStep.run`, the strategy's definition (kept equal to this copy:
        # tests/training/test_inline_step.py).
        plain = step_obj if type(step_obj) is PlainStep else None
        model, loss_fn, opt = ((plain.model, plain.loss_fn, plain.optimizer)
                               if plain is not None else (None, None, None))
        # The plain step's float32 scalar loss on the CPU is kept as a number (LossKeeper):
        # no tensor made or held a step, and item() waits for nothing there. Decided at the
        # first loss; a loss on a device stays a tensor (item() would sync every step).
        # `keep`, `keep_number`: the kept losses' appends (cleared at a fold, never
        # replaced); a tensor kept after numbers settles them first, so order is kept.
        # `item`: the unbound C method, no bound method made a step.
        pair, tensor, f32, item = _PAIR, torch.Tensor, torch.float32, torch.Tensor.item
        keep, numbers, keep_number = keeper.losses.append, keeper.numbers, keeper.numbers.append
        number: bool | None = None
        step, batches, sample, token, prev_sample, prev_token = (
            clock.step, clock.batch, clock.sample, clock.token, clock.sample, clock.token)
        time: int | None = None
        prev_time: int | None = None
        catch_up, now_ns = clock.catch_up, clock.time_source
        (agreement := self.agreement).begin_epoch(step)
        inbox.set_limit(self._limit(step, keeper.kept))
        try:
            for first in it:
                if before:
                    self._before_step(step + 1, first)
                if (plain is not None and type(first) in pair and len(first) == 2
                        and type(inputs := first[0]) is tensor and (shape := inputs.shape)):
                    loss = loss_fn(model(inputs), first[1])  # type: ignore[misc]
                    loss.backward()
                    opt.step()  # type: ignore[union-attr]
                    opt.zero_grad(set_to_none=True)  # type: ignore[union-attr]
                    if number is None:
                        number = (type(loss) is tensor and loss.dtype is f32
                                  and not loss.dim() and loss.device.type == "cpu")
                    if number:
                        keep_number(item(loss))
                    else:
                        if numbers:
                            keeper.settle()
                        keep(loss.data)
                    # One batch of shape[0] samples and no tokens, counted directly.
                    outputs, prev_sample, prev_token = None, sample, token
                    batches += 1
                    sample += shape[0]
                else:
                    loss, outputs, n, n_samples, n_tokens = run_step(first, it)
                    if numbers:
                        keeper.settle()
                    keep(loss)
                    prev_sample, prev_token, batches, sample, token = (
                        sample, token, batches + n, sample + n_samples, token + n_tokens)
                step += 1
                prev_time, time = time, now_ns()
                if step >= inbox.limit:
                    sample, token, prev_sample, prev_token, prev_time, time = \
                        agreement.catch_up(step, batches, (sample, token, prev_sample,
                                                           prev_token, prev_time, time))
                    self._step_end(step, loss, outputs, first)
                    if step >= max_steps:
                        return self._exhausted(it)
                    inbox.set_limit(self._limit(step, keeper.kept))
            sample, token, prev_sample, prev_token, prev_time, time = \
                agreement.end_epoch_steps(step, (sample, token, prev_sample, prev_token,
                                                 prev_time, time))
        finally:  # the clock holds every completed step, however the loop ends
            catch_up(step, batch=batches, sample=sample, token=token, prev_sample=prev_sample,
                     prev_token=prev_token, prev_time=prev_time, time=time)
        return True

    def _before_step(self, step: int, batch: Any) -> None:
        """``before_step`` hooks; what they fetch goes to a ``Step`` strategy."""
        fetches = self.dispatch.before_step(self.clock.now(), step, batch)
        if isinstance(self.step, Step):
            self.step.fetches = fetches

    def _step_end(self, step: int, loss: Any, outputs: Any, batch: Any) -> None:
        """The slow path once the clock has caught up: what run control collected for
        this step end's triggers (a notice's deadline, a landed save), fold the kept
        losses, per-step hooks, ``step_end`` where a trigger is due, run control's drain
        (retimes) and a requested preemption (where the ranks agree)."""
        dispatch, hooks, control = self.dispatch, self.dispatch.hooks, self.control
        control.collect()
        folded = self.losses.kept >= FOLD
        if folded:
            self.losses.fold(step)
        after, trig = hooks["_after_step"], hooks["_trigger_step"]
        if after or trig:
            now = self.clock.now()
            if after:
                step_obj = self.step
                fetched = step_obj.fetched if isinstance(step_obj, Step) else {}
                dispatch.after_step(now, step, StepOutputs(loss, outputs, batch, fetched))
            if trig:
                dispatch.run_hooks("_trigger_step", now)
        due = step >= self.table.step_due
        if due:
            dispatch.fire("step_end")
        elif dispatch.saves.pending:  # saves asked for by a hook
            dispatch.saves.flush("step_end")
        control.drain(step, due, look=folded)
        self.agreement.after_step_end(step)

    def _limit(self, step: int, kept: int) -> float:
        """The next step at which the slow path runs: a trigger is due, training ends or
        the kept losses are folded or run control needs it (``next_step``); on several
        processes also the next multiple of ``PREEMPT_CHECK``, where ranks look for an
        agreed preemption."""
        if self.exact:
            return 0
        return self.agreement.limit(min(self.table.step_due, self.max_steps,
                                        step + FOLD - kept, self.control.next_step), step)
