"""``LossKeeper``: the steps' losses on the device, published as the mean ``train/loss``.

The loop appends each step's loss (a detached tensor: no host-device sync) to
``losses``; every ``FOLD`` steps they are summed into one tensor, so the list stays
short. When something that fires needs them, the mean since the last publication is
put as ``train/loss`` (still lazy; reading it syncs).

When something watches for a non-finite loss (``TerminateOnNaN``: ``watch``), each
fold also keeps, on the device, the first step whose loss was NaN or infinite: a few
small kernels every ``FOLD`` steps, nothing per step, and read (one sync) only when
asked, at the watcher's firings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import torch

from schedtrain.monitors.store import MetricStore

__all__ = ["FOLD", "NO_STEP", "LossKeeper"]

#: Sum the kept step losses into one tensor every this many steps: holding fewer small
#: tensors keeps the allocator's work per step down (measured in benchmarks/bench_loop.py).
FOLD: Final = 64

#: The first bad step kept on the device when every loss so far was finite.
NO_STEP: Final = 2**62


class LossKeeper:
    """Step losses since ``train/loss`` was last published (at step ``since``)."""

    def __init__(self) -> None:
        #: the latest steps' losses, appended by the loop (in place: the loop holds it)
        self.losses: list[torch.Tensor] = []
        self._sum: torch.Tensor | None = None
        self._last: torch.Tensor | None = None
        self.since = 0
        #: on several processes, the mean over ranks (applied to ``train/loss``)
        self.reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
        #: on several processes, (step, the ranks' mean loss) agreed at that step
        self.agreed: tuple[int, float] | None = None
        #: on several processes, the mean over ranks of a loss on the CPU, by the same
        #: arithmetic as ``agreed`` (a resumed run publishes what the first one did)
        self.reduce_number: Callable[[float], float] | None = None
        #: keep the first step whose loss was not finite (a callback watches for it)
        self.watch = False
        #: that step on the device (``NO_STEP``: none yet); only while ``watch``
        self._first_bad: torch.Tensor | None = None

    @property
    def last(self) -> torch.Tensor | None:
        """The last step's loss (``None`` before the first step)."""
        return self.losses[-1] if self.losses else self._last

    def fold(self, step: int | None = None) -> None:
        """Add the kept losses (those of the steps up to ``step``) into the running sum
        (on the device; no sync); while ``watch``, note the first non-finite one."""
        losses = self.losses
        if not losses:
            return
        if self.watch and step is not None:
            self._first_bad = self._bad_with_kept(step)
        self._last = losses[-1]
        self._sum = self._folded()
        losses.clear()

    def _bad_with_kept(self, step: int) -> torch.Tensor | None:
        """The first bad step, the kept losses (of steps up to ``step``) included."""
        losses, first = self.losses, self._first_bad
        if not losses:
            return first
        n = len(losses)
        kept = torch.stack(losses).reshape(n, -1)
        steps = torch.arange(step - n + 1, step + 1, device=kept.device)
        bad = torch.where(torch.isfinite(kept).all(dim=1), NO_STEP, steps).min()
        return bad if first is None else torch.minimum(first, bad)

    def first_nonfinite(self, step: int) -> int | None:
        """The first step up to ``step`` whose loss was NaN or infinite, while ``watch``
        (``None``: none). Reading it synchronises with the device; nothing is folded."""
        bad = self._bad_with_kept(step)
        if bad is None:
            return None
        first = int(bad)
        return None if first >= NO_STEP else first

    def _folded(self) -> torch.Tensor | None:
        """The running sum with the kept losses added (what ``fold`` keeps)."""
        losses = self.losses
        if not losses:
            return self._sum
        dtype = torch.promote_types(losses[-1].dtype, torch.float32)  # no half-precision sums
        total = torch.stack(losses).sum(dtype=dtype)
        return total if self._sum is None else self._sum + total

    def host_mean(self, step: int) -> float | None:
        """The mean loss over steps ``since + 1 .. step`` as a number, computed as
        ``publish`` would, when the losses are on the CPU (``None`` on a device, where
        reading it would synchronise, or with no step since the last publication).
        Nothing is folded: the sums' grouping stays that of a run that never asks."""
        n = step - self.since
        latest = self.losses[-1] if self.losses else self._sum
        if n <= 0 or latest is None or latest.device.type != "cpu":
            return None
        total = self._folded()
        assert total is not None
        return float(total / n)

    def publish(self, metrics: MetricStore, step: int) -> None:
        """Put the mean loss over steps ``since + 1 .. step`` as ``train/loss`` (on
        several processes, the ranks' mean: ``agreed`` when the step's agreement carried
        it, else reduced on its own, on the host for a loss on the CPU)."""
        agreed = self.agreed if self.agreed is not None and self.agreed[0] == step else None
        host = (self.host_mean(step) if self.reduce_number is not None and agreed is None
                else None)
        self.fold(step)
        n = step - self.since
        if n > 0 and self._sum is not None:
            if agreed is not None:
                metrics.put("train/loss", agreed[1])
            elif host is not None and self.reduce_number is not None:
                metrics.put("train/loss", self.reduce_number(host))
            else:
                mean = self._sum / n
                metrics.put("train/loss", mean if self.reduce is None else self.reduce(mean))
        self._sum = None
        self.since = step

    def state_dict(self) -> dict[str, Any]:
        """The unpublished sum, the losses not yet folded into it, where it started and the
        last loss. Nothing is folded: a checkpoint taken anywhere leaves the sums' grouping,
        and so their rounding, as in the uninterrupted run."""
        kept = torch.stack(self.losses) if self.losses else None
        return {"sum": self._sum, "since": self.since, "last": self.last, "kept": kept,
                "first_bad": self._first_bad}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``."""
        self.losses.clear()
        kept = state.get("kept")
        if kept is not None:
            self.losses.extend(kept.unbind())
        self._sum, self.since, self._last = state["sum"], int(state["since"]), state["last"]
        self._first_bad = state.get("first_bad")  # absent from checkpoints of 0.2
