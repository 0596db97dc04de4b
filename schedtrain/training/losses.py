"""``LossKeeper``: the steps' losses on the device, published as the mean ``train/loss``.

The loop appends each step's loss to ``losses``: a detached tensor (no host-device
sync), or, for the plain step on the CPU whose loss is a float32 scalar, the number
itself (reading a CPU tensor waits for nothing, and a Python float held for a few steps
costs the allocator less than a tensor: docs/performance.md). Every ``FOLD`` steps they
are summed into one tensor, so the list stays short; numbers and tensors of the same
values stack to the same tensor, so the sums do not depend on which was kept. When
something that fires needs them, the mean since the last publication is put as
``train/loss`` (still lazy; reading it syncs).

When something watches for a non-finite loss (``TerminateOnNaN``: ``watch``), the
first step whose loss was NaN or infinite is found on the device: each fold keeps its
stacked losses (already made for the sum), and they are looked at together, in a few
small kernels, when the watcher reads (one sync, at its firings) or every
``CHECK_FOLDS`` folds, so memory stays bounded. Nothing is added per step.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Callable, Sequence
from typing import Any, Final

import torch

from schedtrain.monitors.store import MetricStore

__all__ = ["FOLD", "NO_STEP", "LossKeeper", "stacked"]

#: Sum the kept step losses into one tensor every this many steps: holding fewer small
#: tensors keeps the allocator's work per step down (measured in benchmarks/bench_loop.py).
FOLD: Final = 64

#: The first bad step kept on the device when every loss so far was finite.
NO_STEP: Final = 2**62

#: While watched, folds keep their stacked losses, looked at together (six small
#: kernels) only when the watcher reads or after this many folds.
CHECK_FOLDS: Final = 16


def stacked(losses: Sequence[torch.Tensor | float]) -> torch.Tensor:
    """The kept losses (at least one) as one tensor: numbers (float32 losses kept on
    the CPU) are copied in one go, tensors stacked; the same values give the same tensor
    either way."""
    # map() checks each item in C: a generator's Python step per loss cost half the fold
    if all(map(_is_number, losses)):
        return torch.frombuffer(array("f", losses), dtype=torch.float32)
    return torch.stack([x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.float32)
                        for x in losses])


#: ``isinstance(x, float)``: a number the loop kept (``Tensor`` is no ``float``)
_is_number: Final = float.__instancecheck__


def _tensor(loss: torch.Tensor | float) -> torch.Tensor:
    return loss if isinstance(loss, torch.Tensor) else torch.tensor(loss, dtype=torch.float32)


class LossKeeper:
    """Step losses since ``train/loss`` was last published (at step ``since``)."""

    def __init__(self) -> None:
        #: the latest steps' losses, appended by the loop (in place: the loop holds it)
        self.losses: list[torch.Tensor | float] = []
        self._sum: torch.Tensor | None = None
        #: the last folded step's loss as kept (made a tensor only when read)
        self._last: torch.Tensor | float | None = None
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
        self._index: dict[torch.device, torch.Tensor] = {}
        #: folds whose losses are not yet looked at: (their losses stacked, their last step)
        self._unchecked: list[tuple[torch.Tensor, int]] = []

    @property
    def last(self) -> torch.Tensor | None:
        """The last step's loss (``None`` before the first step)."""
        last = self.losses[-1] if self.losses else self._last
        return None if last is None else _tensor(last)

    def fold(self, step: int | None = None) -> None:
        """Add the kept losses (those of the steps up to ``step``) into the running sum
        (on the device; no sync); while ``watch``, keep them stacked for the check."""
        losses = self.losses
        if not losses:
            return
        together = stacked(losses)
        if self.watch and step is not None:
            self._unchecked.append((together, step))
            if len(self._unchecked) >= CHECK_FOLDS:
                self._first_bad = self._checked()
        self._last = losses[-1]
        self._sum = self._folded(together)
        losses.clear()

    def _checked(self) -> torch.Tensor | None:
        """The first bad step, the folds not yet checked counted in (then forgotten): in
        one go where they are consecutive steps (each step keeps one loss, each fold
        takes them all), else fold by fold."""
        first, folds = self._first_bad, self._unchecked
        if not folds:
            return first
        if all(b[1] - b[0].shape[0] == a[1] for a, b in itertools.pairwise(folds)):
            first = self._bad_with(first, torch.cat([f for f, _ in folds]), folds[-1][1])
        else:
            for stacked, step in folds:
                first = self._bad_with(first, stacked, step)
        folds.clear()
        return first

    def _bad_with(self, first: torch.Tensor | None, stacked: torch.Tensor,
                  step: int) -> torch.Tensor:
        """``first`` with the ``stacked`` losses of the steps up to ``step`` counted in:
        five small kernels (an index kept per device saves making one each time)."""
        n = stacked.shape[0]
        finite = torch.isfinite(stacked)
        if finite.dim() > 1:  # a step function's loss of several values
            finite = finite.flatten(1).all(dim=1)
        index = self._index.get(stacked.device)
        if index is None or index.shape[0] < n:
            index = self._index[stacked.device] = torch.arange(max(n, FOLD),
                                                               device=stacked.device)
        # NO_STEP plus an offset stays >= NO_STEP: "none" survives the shift.
        bad = torch.where(finite, NO_STEP, index[:n]).min() + (step - n + 1)
        return bad if first is None else torch.minimum(first, bad)

    def first_nonfinite(self, step: int) -> int | None:
        """The first step up to ``step`` whose loss was NaN or infinite, while ``watch``
        (``None``: none). Reading it synchronises with the device. The sums stay as they
        are: the losses not yet folded are looked at where they are."""
        self._first_bad = self._checked()
        bad = self._first_bad
        if self.losses:
            bad = self._bad_with(bad, stacked(self.losses), step)
        if bad is None:
            return None
        first = int(bad)
        return None if first >= NO_STEP else first

    def _folded(self, together: torch.Tensor | None = None) -> torch.Tensor | None:
        """The running sum with the kept losses (``together``, when already stacked)
        added (what ``fold`` keeps)."""
        losses = self.losses
        if not losses:
            return self._sum
        together = stacked(losses) if together is None else together
        dtype = torch.promote_types(together.dtype, torch.float32)  # no half-precision sums
        total = together.sum(dtype=dtype)
        return total if self._sum is None else self._sum + total

    def host_mean(self, step: int) -> float | None:
        """The mean loss over steps ``since + 1 .. step`` as a number, computed as
        ``publish`` would, when the losses are on the CPU (``None`` on a device, where
        reading it would synchronise, or with no step since the last publication).
        Nothing is folded: the sums' grouping stays that of a run that never asks."""
        n = step - self.since
        latest = self.losses[-1] if self.losses else self._sum
        if n <= 0 or latest is None or (isinstance(latest, torch.Tensor)
                                        and latest.device.type != "cpu"):
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
        kept = stacked(self.losses) if self.losses else None
        self._first_bad = self._checked()  # on the device: no sync, the sums untouched
        return {"sum": self._sum, "since": self.since, "last": self.last, "kept": kept,
                "first_bad": self._first_bad}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``."""
        self.losses.clear()
        kept = state.get("kept")
        if kept is not None:  # as the loop keeps them: numbers where it can
            numbers = kept.device.type == "cpu" and kept.dtype == torch.float32
            self.losses.extend(kept.tolist() if numbers and kept.dim() == 1 else kept.unbind())
        self._sum, self.since, self._last = state["sum"], int(state["since"]), state["last"]
        self._first_bad = state.get("first_bad")  # absent from checkpoints of 0.2
        self._unchecked.clear()
