"""Where the loop is in the training data, saved and restored with the run.

Everything here is plain data and tensors (it goes into checkpoints that load with
``weights_only=True``). A resumed run must see exactly the batches the uninterrupted run
would have: the data position is either the loader's own state (torchdata's
``StatefulDataLoader``, or anything with ``state_dict``/``load_state_dict``) or the
generators' state when the epoch started, replayed to draw the same order and skip the
batches already seen (workers included: they are seeded from that state).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import attrs

from schedtrain.checkpoints.rng import rng_state, seed_everything, set_rng_state

__all__ = ["DataPosition", "EpochFlag", "rng_state", "seed_everything", "set_rng_state"]


@attrs.define
class EpochFlag:
    """Whether the loop is inside an epoch: made before the loop and the run's state,
    which share it (the loop sets it; a checkpoint records it; a resume sets it back)."""

    #: an epoch was started and has not ended (a checkpoint taken now resumes inside it)
    open: bool = False
    #: the next epoch the loop runs is the open one a checkpoint was taken in
    resume_inside: bool = False


def _stateful(data: Any) -> bool:
    return callable(getattr(data, "state_dict", None)) and callable(
        getattr(data, "load_state_dict", None))


class DataPosition:
    """Where the loop is in the training data, saved and restored with the run.

    Args:
        data: the training batches (a ``DataLoader``, a ``StatefulDataLoader``, any
            iterable: an epoch is one pass over it).
    """

    def __init__(self, data: Iterable[Any]) -> None:
        self.data = data
        self.stateful = _stateful(data)
        self._epoch_rng: dict[str, Any] | None = None
        self._loader: dict[str, Any] | None = None

    def start_epoch(self, epoch: int = 0) -> Iterator[Any]:
        """A fresh pass over the data for epoch ``epoch`` (0-based): a distributed
        sampler is told the epoch first, so each epoch is shuffled anew."""
        self.set_epoch(epoch)
        self._epoch_rng = None if self.stateful else rng_state()
        return iter(self.data)

    def set_epoch(self, epoch: int) -> None:
        """``sampler.set_epoch(epoch)`` where the data's sampler has it."""
        set_epoch = getattr(getattr(self.data, "sampler", None), "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def resume_epoch(self, consumed: int, epoch: int = 0) -> Iterator[Any]:
        """The rest of the epoch a checkpoint was taken in, ``consumed`` batches in."""
        self.set_epoch(epoch)
        if self.stateful:
            if self._loader is not None:
                self.data.load_state_dict(self._loader)  # type: ignore[attr-defined]
            # Making an iterator draws a seed from torch's generator; the run being resumed
            # drew it when the epoch started, which the saved generators already include.
            now = rng_state()
            it = iter(self.data)
            set_rng_state(now)
            return it
        if self._epoch_rng is None:
            raise RuntimeError("no saved data position to resume the epoch from")
        now = rng_state()
        set_rng_state(self._epoch_rng)  # the same shuffle and worker seeds as then
        it = iter(self.data)
        if consumed:
            next(itertools.islice(it, consumed - 1, consumed), None)
        set_rng_state(now)
        return it

    def state_dict(self) -> dict[str, Any]:
        """The position: the loader's own state, or the generators at the epoch's start."""
        if self.stateful:
            return {"loader": self.data.state_dict()}  # type: ignore[attr-defined]
        return {"epoch_rng": self._epoch_rng}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict`` (before ``resume_epoch``)."""
        self._loader = state.get("loader")
        self._epoch_rng = state.get("epoch_rng")
