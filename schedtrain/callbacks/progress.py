"""``ProgressBar``: a tqdm bar with the epoch, step and the latest scalars.

It never forces a device sync: it shows only values already brought to the
host (by a flush or a callback that read them), and redraws only when fired
(default: every 20 steps and at each epoch end).
"""

from __future__ import annotations

from typing import Any, ClassVar

from tqdm.auto import tqdm

from schedtrain.callbacks.base import Callback
from schedtrain.triggers import any_of, every
from schedtrain.triggers.base import Trigger

__all__ = ["ProgressBar"]


class ProgressBar(Callback):
    """Show training progress per epoch (only on the chief process).

    Args:
        names: the scalars to show (default: every scalar).
        leave: keep each epoch's finished bar on screen.
    """

    default_trigger: ClassVar[Trigger] = any_of(every("20 steps"), every("1 epoch"))

    def __init__(self, names: list[str] | None = None, leave: bool = True) -> None:
        self.names = names
        self.leave = leave
        self._bar: Any = None
        self._shown = 0

    def _before_epoch(self) -> None:
        if not self.is_chief:
            return
        self._close()
        self._bar = tqdm(total=self.trainer.steps_in_epoch, leave=self.leave,
                         desc=f"epoch {self.now.epoch + 1}", unit="step", dynamic_ncols=True)
        self._shown = self.now.step_in_epoch
        if self._shown:
            self._bar.update(self._shown)

    def _trigger(self) -> None:
        if self._bar is None:
            return
        now = self.now
        self._bar.update(now.step_in_epoch - self._shown)
        self._shown = now.step_in_epoch
        scalars = self.metrics.materialized()
        if self.names is not None:
            scalars = {n: v for n, v in scalars.items() if n in self.names}
        self._bar.set_postfix({"step": now.step, **{n: f"{v:.4g}" for n, v in scalars.items()}},
                              refresh=True)

    def _after_epoch(self) -> None:
        self._close()

    def _after_train(self) -> None:
        self._close()

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
