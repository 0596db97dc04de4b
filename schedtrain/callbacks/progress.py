"""``ProgressBar``: a tqdm bar with the epoch, step and the latest scalars.

It never forces a device sync: it shows only values already brought to the
host (by a flush or a callback that read them), and redraws only when fired
(default: every 20 steps and at each epoch end) and when it closes an epoch's
bar, after the epoch-end flush, so the epoch's validation metrics are shown.
"""

from __future__ import annotations

from typing import Any, ClassVar

from tqdm.auto import tqdm

from schedtrain.callbacks.base import Callback
from schedtrain.triggers import Trigger, any_of, every

__all__ = ["ProgressBar"]


class ProgressBar(Callback):
    """Show training progress per epoch (only on the chief process).

    Args:
        names: the scalars to show (default: every scalar).
        leave: keep each epoch's finished bar on screen.
        tty_only: draw only when stderr is a terminal, so logs and CI output stay free
            of bar redraws (``False``: draw anyway).
    """

    default_trigger: ClassVar[Trigger] = any_of(every("20 steps"), every("1 epoch"))

    def __init__(self, names: list[str] | None = None, leave: bool = True,
                 tty_only: bool = True) -> None:
        self.names = names
        self.leave = leave
        self.tty_only = tty_only
        self._bar: Any = None
        self._shown = 0

    def _before_epoch(self) -> None:
        if not self.is_chief:
            return
        self._close()
        self._bar = tqdm(total=self.trainer.steps_in_epoch, leave=self.leave,
                         desc=f"epoch {self.now.epoch + 1}", unit="step", dynamic_ncols=True,
                         disable=None if self.tty_only else False)  # None: off unless a TTY
        self._shown = self.now.step_in_epoch
        if self._shown:
            self._bar.update(self._shown)

    def _trigger(self) -> None:
        self._advance()
        self._show_scalars()

    def _after_epoch(self) -> None:
        self._advance()  # the epoch's last steps, whatever the trigger

    def _after_train(self) -> None:
        self._close()

    def _advance(self) -> None:
        if self._bar is None:
            return
        done = self.now.step_in_epoch
        self._bar.update(done - self._shown)
        self._shown = done

    def _show_scalars(self) -> None:
        if self._bar is None:
            return
        scalars = self.metrics.materialized()
        if self.names is not None:
            scalars = {n: v for n, v in scalars.items() if n in self.names}
        self._bar.set_postfix(
            {"step": self.now.step, **{n: f"{v:.4g}" for n, v in scalars.items()}},
            refresh=True)

    def _close(self) -> None:
        # An epoch's bar stays open past its epoch_end: the metrics computed there reach
        # the host with the epoch-end flush, and are shown here before the bar closes.
        if self._bar is not None:
            self._show_scalars()
            self._bar.close()
            self._bar = None
