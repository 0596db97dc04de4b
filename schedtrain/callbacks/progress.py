"""``ProgressBar``: a tqdm bar with the epoch, step and the latest scalars.

It redraws only when fired (default: every 20 steps and at each epoch end) and when it
closes an epoch's bar, after the epoch-end flush, so the epoch's validation metrics are
shown. At each firing it brings the values put so far to the host (the store's flush:
one transfer, a device sync), so what it shows is as of its step, ``train/loss``
included. Where a bar cannot be drawn (the stream is not a terminal: a pipe, a log
file, CI; or ``TERM=dumb``) it prints exactly one plain line per firing instead.
"""

from __future__ import annotations

import os
import sys
from typing import Any, ClassVar, TextIO

from tqdm.auto import tqdm

from schedtrain.callbacks.base import Callback
from schedtrain.callbacks.eta import RunEta
from schedtrain.planning.costs import hms
from schedtrain.triggers import Trigger, any_of, every

__all__ = ["ProgressBar"]


class ProgressBar(Callback):
    """Show training progress per epoch (only on the chief process).

    On a terminal a tqdm bar per epoch; elsewhere (a pipe or log file, ``TERM=dumb``)
    one plain line each time it fires, and at no other time, such as
    ``epoch 2 step 30/45 (67%)  [step 75]  eta 0:03:10  train/loss=0.312``. The ETA (the
    bar's ``eta``) is the whole run's: the steps left at the measured seconds per quiet
    step, plus the planned firings still to come at each callback's measured seconds per
    firing (docs/training.md, "The ETA"); it is computed only when the bar fires. A firing at
    an epoch's last step prints its line once the epoch has ended, with the values its
    end computed (validation); firings at that step's ``step_end`` and the ``epoch_end``
    right after it are one moment and print one line.

    Args:
        names: the scalars to show (default: every scalar).
        leave: keep each epoch's finished bar on screen.
        tty_only: draw the bar only on a terminal, plain lines elsewhere (``False``:
            always the bar).
        stream: where to write (default: ``sys.stderr`` when the run starts).
        eta: show the run's ETA.
    """

    may_stop_alone: ClassVar[bool] = False

    default_trigger: ClassVar[Trigger] = any_of(every("20 steps"), every("1 epoch"))

    def __init__(self, names: list[str] | None = None, leave: bool = True,
                 tty_only: bool = True, stream: TextIO | None = None,
                 eta: bool = True) -> None:
        self.names = names
        self.eta = eta
        self._eta: RunEta | None = None
        self._left: float | None = None  # the ETA at the last firing
        self.leave = leave
        self.tty_only = tty_only
        self.stream = stream
        self._bar: Any = None
        self._shown = 0
        self._lines: bool | None = None  # plain lines instead of a bar; decided at start
        self._epoch = 0
        # (done, step, ETA) of a deferred line
        self._pending: tuple[int, int, float | None] | None = None
        self._epoch_over = False  # the epoch has ended (its epoch_end firings come)

    def _before_train(self) -> None:
        out = self.stream or sys.stderr
        self._lines = self.tty_only and not can_draw(out)
        if self.eta and self.is_chief:
            self._eta = RunEta()
            self._eta.start(self)

    def _before_epoch(self) -> None:
        if not self.is_chief:
            return
        self._close()
        self._epoch_over = False
        self._epoch = self.now.epoch + 1  # 1-based, as the bar's title says it
        if self._lines:
            return
        self._bar = tqdm(total=self.trainer.steps_in_epoch, leave=self.leave,
                         desc=f"epoch {self.now.epoch + 1}", unit="step", dynamic_ncols=True,
                         file=self.stream or sys.stderr, disable=False)
        self._shown = self.now.step_in_epoch
        if self._shown:
            self._bar.update(self._shown)

    def _trigger(self) -> None:
        if self._eta is not None:
            self._left = self._eta.seconds_left(self)
        if self._lines:
            if not self.is_chief:
                return
            now = self.now
            if self._epoch_over or now.step_in_epoch == self.trainer.steps_in_epoch:
                # The epoch's last step: printed once the epoch has ended, with what its
                # end computes (one line for its step_end and epoch_end firings).
                self._pending = (now.step_in_epoch, now.step, self._left)
            else:
                self._print_line(now.step_in_epoch, now.step, self._left)
            return
        self._advance()
        self._show_scalars()

    def _scalars(self) -> dict[str, float]:
        self.metrics.flush()  # the values put so far, on the host: as of this step
        scalars = self.metrics.materialized()
        if self.names is not None:
            scalars = {n: v for n, v in scalars.items() if n in self.names}
        return scalars

    def _print_line(self, done: int, step: int, left: float | None) -> None:
        total = self.trainer.steps_in_epoch
        where = f"epoch {self._epoch} step {done}"
        if total:
            where += f"/{total} ({100 * done // total}%)"
        values = "  ".join(f"{n}={v:.4g}" for n, v in self._scalars().items())
        line = f"{where}  [step {step}]" + (f"  eta {hms(left)}" if left is not None else "") \
            + (f"  {values}" if values else "")
        print(line, file=self.stream or sys.stderr, flush=True)

    def _after_epoch(self) -> None:
        self._epoch_over = True
        self._advance()  # the bar: the epoch's last steps, whatever the trigger

    def _after_train(self) -> None:
        self._close()
        if self._eta is not None:
            self._eta.stop(self)
            self._eta = None

    def _advance(self) -> None:
        if self._bar is None:
            return
        done = self.now.step_in_epoch
        self._bar.update(done - self._shown)
        self._shown = done

    def _show_scalars(self) -> None:
        if self._bar is None:
            return
        eta = {"eta": hms(self._left)} if self._left is not None else {}
        self._bar.set_postfix(
            {"step": self.now.step, **eta,
             **{n: f"{v:.4g}" for n, v in self._scalars().items()}}, refresh=True)

    def _close(self) -> None:
        # An epoch's bar stays open past its epoch_end: the metrics computed there reach
        # the host with the epoch-end flush, and are shown here before the bar closes.
        if self._bar is not None:
            self._show_scalars()
            self._bar.close()
            self._bar = None
        elif self._pending is not None:
            # A firing at the epoch's last step, with what its end computed; the clock
            # may already be in the next epoch.
            self._print_line(*self._pending)
        self._pending = None


def can_draw(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal that redraws a bar: a TTY and ``TERM`` not ``dumb``."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # closed or file-like without isatty
        return False
    return tty and os.environ.get("TERM", "") != "dumb"
