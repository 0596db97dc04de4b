"""Step strategies: what one optimizer step does, as an object the one loop calls.

A step takes the step's first micro-batch and the data iterator (to draw the rest of
an accumulation), and returns ``(loss, outputs, micro-batches, samples, tokens)``:
the step's mean loss detached on the device, the step function's outputs, and what
the micro-batches add to the clock. ``make_step`` picks the strategy:

* ``PlainStep``: one ``(inputs, targets)`` micro-batch through ``loss_fn`` in fp32 with
  nothing else to do, the common case, with no branch it does not need;
* ``Step``: everything else, assembled from parts: a user ``step_fn``, gradient
  accumulation, autocast and a ``GradScaler``, clipping, moving batches to the device,
  gradient hooks, fetches asked by ``before_step`` hooks, and what runs around each
  micro-batch (``training.batch_events``: per-micro-batch hooks, ``batch_start`` and
  ``batch_end``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

import torch

from schedtrain.callbacks.payloads import BatchInfo
from schedtrain.training.batch_events import BatchEvents
from schedtrain.training.batches import count_batch, to_device

__all__ = ["PlainStep", "Step", "StepFn", "StepResult", "make_step"]

#: ``step_fn(model, batch)``: the loss, or a mapping with a ``"loss"`` entry.
StepFn = Callable[[torch.nn.Module, Any], "torch.Tensor | Mapping[str, Any]"]

StepResult = tuple[torch.Tensor, Any, int, int, int]
_PLAIN_SEQ: Final = (tuple, list)
_END: Final = object()


class PlainStep:
    """One ``(inputs, targets)`` micro-batch: ``loss_fn(model(inputs), targets)``, backward,
    optimizer step. Samples are the first dimension of ``inputs``."""

    __slots__ = ("_graph", "loss_fn", "model", "optimizer")

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 loss_fn: Callable[[Any, Any], torch.Tensor]) -> None:
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self._graph: Any = None

    def run(self, batch: Any, it: Iterator[Any]) -> StepResult:
        # Inlined: `Loop._steps` (training/loop.py) runs this body itself for a plain
        # `(tensor, target)` tuple or list, and calls this method for any other batch. A
        # change here is made there too; tests/training/test_inline_step.py compares the two.
        # A tuple subclass (a NamedTuple) is a pair too, and may report `num_tokens`.
        bare = type(batch) in _PLAIN_SEQ
        if not (bare or isinstance(batch, tuple)) or len(batch) != 2:
            raise TypeError("with `loss_fn`, batches must be (inputs, targets) pairs; give "
                            "`step_fn` for other batch shapes")
        inputs = batch[0]
        loss: Any = self.loss_fn(self.model(inputs), batch[1])
        loss.backward()
        # Holding the last loss keeps its (freed) graph's nodes until the next step's
        # replaces it: autograd then reuses the parameters' gradient accumulators instead
        # of building them again each step (measured: thousands of instructions a step).
        self._graph = loss
        opt = self.optimizer
        opt.step()
        opt.zero_grad(set_to_none=True)
        # `.data`: the value without autograd, as detach() gives it but cheaper
        if bare and type(inputs) is torch.Tensor and (shape := inputs.shape):
            return loss.data, None, 1, shape[0], 0
        samples, tokens = count_batch(batch)
        return loss.data, None, 1, samples, tokens


class Step:
    """The general step, its parts switched on by what the run needs.

    Args:
        model, optimizer: what is trained.
        forward: ``forward(batch) -> loss or {"loss": ..., other outputs}``.
        accum: micro-batches per optimizer step; a short accumulation at an epoch's end
            still steps, its gradients rescaled to the mean over the micro-batches it had.
        device: batches are moved here (``None``: not moved).
        autocast: the context each forward runs in (``None``: none).
        scaler: a ``torch.amp.GradScaler`` for fp16 (``None``: none).
        clip: clip the gradient norm to this value (``None``: no clipping).
        batch_events: the per-micro-batch hooks and events (``None``: nothing runs per
            micro-batch).
        after_backward, before_optimizer_step: gradient hooks, called with nothing.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        forward: Callable[[Any], Any],
        *,
        accum: int = 1,
        device: torch.device | None = None,
        autocast: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
        scaler: Any = None,
        clip: float | None = None,
        batch_events: BatchEvents | None = None,
        after_backward: Callable[[], None] | None = None,
        before_optimizer_step: Callable[[], None] | None = None,
    ) -> None:
        self.model, self.optimizer, self.forward = model, optimizer, forward
        self.accum, self.device, self.autocast, self.scaler = accum, device, autocast, scaler
        self.clip, self.batch_events = clip, batch_events
        self.after_backward, self.before_optimizer_step = after_backward, before_optimizer_step
        #: functions asked for by ``before_step`` hooks, evaluated after the backward
        self.fetches: Mapping[str, Callable[[], Any]] = {}
        self.fetched: dict[str, Any] = {}
        self._graph: Any = None  # the last loss: see PlainStep.run

    def _micro(self, batch: Any, info: BatchInfo | None) -> tuple[torch.Tensor, Any,
                                                                  BatchInfo | None]:
        if self.device is not None:
            batch = to_device(batch, self.device)
        if self.autocast is not None:
            with self.autocast():
                out = self.forward(batch)
        else:
            out = self.forward(batch)
        loss = out if isinstance(out, torch.Tensor) else out["loss"]
        detached = loss.detach()
        if info is not None:
            assert self.batch_events is not None
            info = self.batch_events.forwarded(info, detached)
        back = loss / self.accum if self.accum > 1 else loss
        if self.scaler is not None:
            self.scaler.scale(back).backward()
        else:
            back.backward()
        self._graph = back
        return detached, out, info

    def run(self, batch: Any, it: Iterator[Any]) -> StepResult:
        accum, events = self.accum, self.batch_events
        k = samples = tokens = 0
        loss_sum: torch.Tensor | None = None
        out: Any = None
        info: BatchInfo | None = None
        while True:
            if events is not None:
                info = events.start(batch, k, accum)
            loss, out, info = self._micro(batch, info)
            loss_sum = loss if loss_sum is None else loss_sum + loss
            n, t = count_batch(batch)
            k, samples, tokens = k + 1, samples + n, tokens + t
            if info is not None:
                assert events is not None
                events.end(info, n, t)
            if k == accum:
                break
            batch = next(it, _END)
            if batch is _END:
                break
        if k < accum:  # a short accumulation at the epoch's end still steps
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(accum / k)
        self._update()
        assert loss_sum is not None
        outputs = ({name: v.detach() if isinstance(v, torch.Tensor) else v
                    for name, v in out.items()} if isinstance(out, Mapping) else {})
        return (loss_sum / k if k > 1 else loss_sum), outputs, k, samples, tokens

    def _update(self) -> None:
        opt, scaler = self.optimizer, self.scaler
        if self.after_backward is not None:
            self.after_backward()
        self.fetched = {name: fn() for name, fn in self.fetches.items()}
        if scaler is not None and (self.clip is not None
                                   or self.before_optimizer_step is not None):
            scaler.unscale_(opt)
        if self.before_optimizer_step is not None:
            self.before_optimizer_step()
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)


def make_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None,
    step_fn: Callable[[torch.nn.Module, Any], Any] | None,
    plain: bool,
    **parts: Any,
) -> PlainStep | Step:
    """The strategy for a run: ``PlainStep`` when ``plain`` (nothing but the loss to
    compute), else a ``Step`` with ``parts`` (see ``Step``)."""
    if plain and loss_fn is not None:
        return PlainStep(model, optimizer, loss_fn)
    if step_fn is not None:
        user_fn = step_fn

        def forward(batch: Any) -> Any:
            return user_fn(model, batch)
    else:
        assert loss_fn is not None

        def forward(batch: Any) -> Any:
            try:
                inputs, targets = batch
            except (TypeError, ValueError):
                raise TypeError("with `loss_fn`, batches must be (inputs, targets) pairs; "
                                "give `step_fn` for other batch shapes") from None
            out = model(inputs)
            return {"loss": loss_fn(out, targets), "outputs": out}
    return Step(model, optimizer, forward, **parts)
