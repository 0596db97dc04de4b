"""``LossKeeper``: the steps' losses on the device, published as the mean ``train/loss``.

The loop keeps each step's loss: a detached tensor (no host-device sync) appended to
``losses``, or, for the plain step on the CPU whose loss is a float32 scalar, the number
itself appended to ``numbers`` (reading a CPU tensor waits for nothing, and a Python
float held for a few steps costs the allocator less than a tensor: docs/performance.md).
``numbers`` holds only numbers, so a fold packs them without looking at each, and always
the newest losses: before a tensor is kept after numbers, ``settle`` moves them to
``losses``, so the order is the steps'. Every ``FOLD`` steps they
are summed into one tensor, so memory stays bounded; numbers and tensors of the same
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
import struct
from collections.abc import Callable, Sequence
from typing import Any, Final

import torch

from schedtrain.monitors.store import MetricStore

__all__ = ["FOLD", "NO_STEP", "LossKeeper", "stacked"]

#: Sum the kept step losses into one tensor every this many steps: memory stays bounded,
#: and a fold's fixed cost (a visit of the loop's slow path, a few tensor calls) is shared
#: by many steps (measured in benchmarks/bench_loop.py).
FOLD: Final = 256

#: The first bad step kept on the device when every loss so far was finite.
NO_STEP: Final = 2**62

#: While watched, folds keep their stacked losses, looked at together (six small
#: kernels) only when the watcher reads or after this many folds.
CHECK_FOLDS: Final = 16


def stacked(losses: Sequence[torch.Tensor | float],
            numbers: Sequence[float] = ()) -> torch.Tensor:
    """The kept losses (at least one), ``losses`` then ``numbers`` (numbers only), as one
    tensor: numbers (float32 losses kept on the CPU) are packed in one go, tensors
    stacked; the same values give the same tensor either way."""
    if numbers:
        if not losses:
            return _packed(numbers)
        losses = [*losses, *numbers]
    # map() checks each item in C: a generator's Python step per loss cost half the fold
    if all(map(_is_number, losses)):
        return _packed(losses)  # type: ignore[arg-type]
    return torch.stack([x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.float32)
                        for x in losses])


#: ``isinstance(x, float)``: a number the loop kept (``Tensor`` is no ``float``)
_is_number: Final = float.__instancecheck__


def _packed(numbers: Sequence[float]) -> torch.Tensor:
    """Numbers (float32 values) as a float32 tensor: ``struct`` packs them in C, about
    half what an ``array("f", ...)`` of them costs."""
    return torch.frombuffer(bytearray(struct.pack(f"{len(numbers)}f", *numbers)),
                            dtype=torch.float32)


def _tensor(loss: torch.Tensor | float) -> torch.Tensor:
    return loss if isinstance(loss, torch.Tensor) else torch.tensor(loss, dtype=torch.float32)


class LossKeeper:
    """Step losses since ``train/loss`` was last published (at step ``since``)."""

    def __init__(self) -> None:
        #: the latest steps' losses, appended by the loop (in place: the loop holds it)
        self.losses: list[torch.Tensor | float] = []
        #: newer still: float32 losses kept as numbers by the loop (in place, as ``losses``)
        self.numbers: list[float] = []
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
    def kept(self) -> int:
        """How many losses are kept, not yet folded."""
        return len(self.losses) + len(self.numbers)

    @property
    def last(self) -> torch.Tensor | None:
        """The last step's loss (``None`` before the first step)."""
        last = self._newest()
        return None if last is None else _tensor(last)

    def _newest(self) -> torch.Tensor | float | None:
        """The newest kept loss, as kept (``None`` before the first step)."""
        if self.numbers:
            return self.numbers[-1]
        return self.losses[-1] if self.losses else self._last

    def settle(self) -> None:
        """Move the losses kept as numbers to ``losses`` (in order): the loop calls it
        before it keeps a tensor after numbers."""
        self.losses.extend(self.numbers)
        self.numbers.clear()

    def fold(self, step: int | None = None) -> None:
        """Add the kept losses (those of the steps up to ``step``) into the running sum
        (on the device; no sync); while ``watch``, keep them stacked for the check."""
        if not (self.losses or self.numbers):
            return
        together = stacked(self.losses, self.numbers)
        if self.watch and step is not None:
            self._unchecked.append((together, step))
            if len(self._unchecked) >= CHECK_FOLDS:
                self._first_bad = self._checked()
        self._last = self._newest()
        self._sum = self._folded(together)
        self.losses.clear()
        self.numbers.clear()

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
        if self.losses or self.numbers:
            bad = self._bad_with(bad, stacked(self.losses, self.numbers), step)
        if bad is None:
            return None
        first = int(bad)
        return None if first >= NO_STEP else first

    def _folded(self, together: torch.Tensor | None = None) -> torch.Tensor | None:
        """The running sum with the kept losses (``together``, when already stacked)
        added (what ``fold`` keeps)."""
        if together is None:
            if not (self.losses or self.numbers):
                return self._sum
            together = stacked(self.losses, self.numbers)
        dtype = torch.promote_types(together.dtype, torch.float32)  # no half-precision sums
        total = together.sum(dtype=dtype)
        return total if self._sum is None else self._sum + total

    def host_mean(self, step: int) -> float | None:
        """The mean loss over steps ``since + 1 .. step`` as a number, computed as
        ``publish`` would, when the losses are on the CPU (``None`` on a device, where
        reading it would synchronise, or with no step since the last publication).
        Nothing is folded: the sums' grouping stays that of a run that never asks."""
        n = step - self.since
        latest = self._newest() if self.losses or self.numbers else self._sum
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
        kept = stacked(self.losses, self.numbers) if self.losses or self.numbers else None
        self._first_bad = self._checked()  # on the device: no sync, the sums untouched
        return {"sum": self._sum, "since": self.since, "last": self.last, "kept": kept,
                "first_bad": self._first_bad}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``."""
        self.losses.clear()
        self.numbers.clear()
        kept = state.get("kept")
        if kept is not None:  # as the loop keeps them: numbers where it can
            if kept.device.type == "cpu" and kept.dtype == torch.float32 and kept.dim() == 1:
                self.numbers.extend(kept.tolist())
            else:
                self.losses.extend(kept.unbind())
        self._sum, self.since, self._last = state["sum"], int(state["since"]), state["last"]
        self._first_bad = state.get("first_bad")  # absent from checkpoints of 0.2
        self._unchecked.clear()
