"""``BatchEvents``: what happens around each micro-batch, when anything asked for it.

The general step (``training.steps.Step``) calls ``start`` before a micro-batch's
forward, ``forwarded`` between its forward and backward and ``end`` after its backward.
They run the per-micro-batch hooks (``_before_batch``, ``_before_backward``,
``_after_batch``) on the callbacks that override them, fire ``batch_start`` and
``batch_end`` where a trigger names them (their payload: ``batch``, ``index``, ``loss``),
and count the micro-batch on the clock, so a hook reading ``now`` sees it exact. A run
where nothing asked has no ``BatchEvents`` at all: its steps do none of this.
"""

from __future__ import annotations

from typing import Any

import torch

from schedtrain.callbacks.payloads import BatchInfo
from schedtrain.clock import LoopClock
from schedtrain.training.dispatch import Dispatcher

__all__ = ["BatchEvents"]


class BatchEvents:
    """The per-micro-batch hooks and events of a run.

    Args:
        clock: the loop's clock (exact at each step's start: the loop is exact when
            anything runs per micro-batch).
        dispatch: fires the events and runs the hooks.
        fire_start, fire_end: whether a trigger names ``batch_start`` / ``batch_end``.
    """

    __slots__ = ("_after", "_before", "_before_backward", "clock", "dispatch", "fire_end",
                 "fire_start")

    def __init__(self, clock: LoopClock, dispatch: Dispatcher, *, fire_start: bool,
                 fire_end: bool) -> None:
        self.clock, self.dispatch = clock, dispatch
        self.fire_start, self.fire_end = fire_start, fire_end
        hooks = dispatch.hooks
        self._before = bool(hooks["_before_batch"])
        self._before_backward = bool(hooks["_before_backward"])
        self._after = bool(hooks["_after_batch"])

    def start(self, batch: Any, accum_index: int, accum: int) -> BatchInfo:
        """Before micro-batch ``accum_index`` of the step about to run: its hooks and
        ``batch_start``."""
        clock = self.clock
        info = BatchInfo(batch, clock.step_in_epoch * accum + accum_index, clock.step + 1,
                         accum_index)
        if self._before:
            self.dispatch.run_hooks("_before_batch", clock.now(), info)
        if self.fire_start:
            self.dispatch.fire("batch_start", {"batch": batch, "index": info.index,
                                               "loss": None})
        return info

    def forwarded(self, info: BatchInfo, loss: torch.Tensor) -> BatchInfo:
        """After the forward: ``info`` with its loss, and the ``before_backward`` hooks."""
        info = BatchInfo(info.batch, info.index, info.step, info.accum_index, loss)
        if self._before_backward:
            self.dispatch.run_hooks("_before_backward", self.clock.now(), info)
        return info

    def end(self, info: BatchInfo, samples: int, tokens: int) -> None:
        """After the backward: count the micro-batch, its hooks and ``batch_end``."""
        self.clock.end_batch(samples, tokens)
        if self._after:
            self.dispatch.run_hooks("_after_batch", self.clock.now(), info)
        if self.fire_end:
            self.dispatch.fire("batch_end", {"batch": info.batch, "index": info.index,
                                             "loss": info.loss})
