"""``PrintProgress`` and ``PrintMetrics``: plain console lines, for logs that are not a terminal.

pytorch-accelerated's ``PrintProgressCallback`` and ``PrintMetricsCallback``: one line
per event, no redraws, so a log file or CI output reads top to bottom. Only the chief
process prints.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import ClassVar, TextIO

from schedtrain.callbacks.base import Callback
from schedtrain.triggers import Trigger, every

__all__ = ["PrintMetrics", "PrintProgress"]


class _Printer(Callback):
    may_stop_alone: ClassVar[bool] = False

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream

    def _print(self, line: str) -> None:
        if self.is_chief:
            print(line, file=self.stream or sys.stdout, flush=True)


class PrintProgress(_Printer):
    """Print where training is: its start and end, each epoch's start and end.

    Lines::

        training: starting (step 0, epoch 0)
        epoch 1: starting
        epoch 1: step 100/250
        epoch 1: finished at step 250
        training: finished at step 750, epoch 3

    The ``step 100/250`` line is printed when its trigger fires (default: every 100
    steps); the others come from the lifecycle hooks, whatever the trigger.

    Args:
        stream: where to print (default: standard output).
    """

    may_stop_alone: ClassVar[bool] = False

    default_trigger: ClassVar[Trigger] = every("100 steps")

    def _before_train(self) -> None:
        now = self.now
        self._print(f"training: starting (step {now.step}, epoch {now.epoch})")

    def _before_epoch(self) -> None:
        now = self.now
        resumed = f" (resumed at step {now.step_in_epoch})" if now.step_in_epoch else ""
        self._print(f"epoch {now.epoch + 1}: starting{resumed}")

    def _trigger(self) -> None:
        now = self.now
        total = self.trainer.steps_in_epoch
        self._print(f"epoch {now.epoch + 1}: step {now.step_in_epoch}"
                    + (f"/{total}" if total else ""))

    def _after_epoch(self) -> None:
        now = self.now
        self._print(f"epoch {now.epoch}: finished at step {now.step}")

    def _after_train(self) -> None:
        now = self.now
        self._print(f"training: finished at step {now.step}, epoch {now.epoch}")


class PrintMetrics(_Printer):
    """Print the metrics that got a new value since it last printed (default: every epoch).

    One line: ``epoch 2 step 120  train/loss=0.3102  val/loss=0.2877``. Reading the values
    brings them to the host (one sync when fired). Declare it after the callbacks whose
    metrics it prints, so it sees what they put at the same event.

    Args:
        names: the metrics to print (default: all).
        stream: where to print (default: standard output).
    """

    may_stop_alone: ClassVar[bool] = False

    default_trigger: ClassVar[Trigger] = every("1 epoch")

    def __init__(self, names: Sequence[str] | None = None,
                 stream: TextIO | None = None) -> None:
        super().__init__(stream)
        self.names = list(names) if names is not None else None
        self._seen: dict[str, int] = {}

    def _trigger(self) -> None:
        store = self.metrics
        parts = []
        for name in self.names if self.names is not None else store.names():
            got = store.latest(name)
            if got is None or got.count == self._seen.get(name):
                continue
            self._seen[name] = got.count
            parts.append(f"{name}={got.value:.4g}")
        if parts:
            now = self.now
            self._print(f"epoch {now.epoch} step {now.step}  " + "  ".join(parts))
