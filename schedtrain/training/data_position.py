"""Where the loop is in the training data, saved and restored with the run.

Everything here is plain data and tensors (it goes into checkpoints that load with
``weights_only=True``). A resumed run must see exactly the batches the uninterrupted run
would have: the data position is either the loader's own state (torchdata's
``StatefulDataLoader``, or anything with ``state_dict``/``load_state_dict``) or the
generators' state when the epoch started, replayed to draw the same order and skip the
batches already seen (workers included: they are seeded from that state).

A plain ``DataLoader`` (sharded by a ``DistributedSampler``, or on one process) also
records how its epoch is divided among the ranks, so that a checkpoint taken inside it
resumes on another number of processes: the samples no rank has taken are re-divided
(``training.redivide``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs

from schedtrain.checkpoints.rng import rng_state, seed_everything, set_rng_state
from schedtrain.readback import DamagedFile
from schedtrain.training import redivide
from schedtrain.training.redivide import Batches

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
        ranks: the number of processes the run trains on.
    """

    def __init__(self, data: Iterable[Any], ranks: int = 1) -> None:
        self.data = data
        self.stateful = _stateful(data)
        self._epoch_rng: dict[str, Any] | None = None
        self._loader: dict[str, Any] | None = None
        self.ranks = ranks
        #: the epoch's division among ranks (``None``: data that cannot be re-divided):
        #: ``order`` (``redivide.order_of``), ``done`` (earlier stretches' ``[ranks,
        #: batches each]``), ``ranks`` and ``start`` (the batch it began at) of this one
        self._split: dict[str, Any] | None = None
        self._divisible = not self.stateful and redivide.divisible(data, ranks)
        #: batches per rank in the epoch being resumed, when it was re-divided
        self.epoch_batches: int | None = None
        #: the checkpoint the division was read from (named where it proves damaged)
        self._source: Path | str = "checkpoint"

    def start_epoch(self, epoch: int = 0) -> Iterator[Any]:
        """A fresh pass over the data for epoch ``epoch`` (0-based): a distributed
        sampler is told the epoch first, so each epoch is shuffled anew."""
        self.set_epoch(epoch)
        self._epoch_rng = None if self.stateful else rng_state()
        self.epoch_batches = None
        self._split = None if not self._divisible else {
            "order": redivide.order_of(self.data, self._epoch_rng),  # type: ignore[arg-type]
            "done": [], "ranks": self.ranks, "start": 0}
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
        split = self._split
        data: Iterable[Any] = self.data
        if split is not None and (split["done"] or split["ranks"] != self.ranks):
            data, consumed = self._redivided(split, consumed, epoch)
        now = rng_state()
        set_rng_state(self._epoch_rng)  # the same shuffle and worker seeds as then
        it = iter(data)
        if consumed:
            next(itertools.islice(it, consumed - 1, consumed), None)
        set_rng_state(now)
        return it

    def _redivided(self, split: dict[str, Any], consumed: int,
                   epoch: int) -> tuple[Iterable[Any], int]:
        """This rank's loader over its part of the epoch's rest, and how many of its
        batches were taken already: the epoch was divided among another number of
        ranks (now or before), ``consumed`` batches a rank into it."""
        if split["ranks"] != self.ranks:  # the checkpoint's stretch ends here
            if consumed < split["start"]:
                raise DamagedFile(self._source, "split.start", "expected at most the batches "
                                  f"taken in the epoch ({consumed:,}), found {split['start']:,}")
            split["done"] = [*split["done"], [split["ranks"], consumed - split["start"]]]
            split["ranks"], split["start"] = self.ranks, consumed
        loader: Any = self.data
        order, stretches = self._stretches(split["order"], split["done"], epoch,
                                           self._source, "split")
        rest = redivide.rest_of(order, stretches)
        rank = getattr(loader.sampler, "rank", 0)
        mine = redivide.deal(rest, self.ranks, loader.batch_size, loader.drop_last)[rank]
        self.epoch_batches = split["start"] + len(mine)
        return redivide.planned_loader(loader, mine), consumed - split["start"]

    def _stretches(self, order_of: dict[str, Any], done: list[list[int]], epoch: int,
                   shown: Path | str, key: str) -> tuple[list[int], list[tuple[Batches, int]]]:
        """The epoch's order and each stretch's batches per rank with the count each rank
        took, refusing (``DamagedFile`` at ``key``) a count past its stretch's batches or
        an order that cannot be replayed."""
        loader: Any = self.data
        size, batch, drop = len(loader.dataset), loader.batch_size, loader.drop_last
        try:
            order, first = redivide.first_stretch(order_of, done[0][0], size=size,
                                                  epoch=epoch, batch_size=batch,
                                                  drop_last=drop)
        except Exception as exc:  # crafted generators torch cannot set
            raise DamagedFile(shown, f"{key}.order", "cannot replay the epoch's order "
                              f"({type(exc).__name__})") from None
        stretches: list[tuple[Batches, int]] = []
        for i, (ranks, count) in enumerate(done):
            per_rank = first if i == 0 else redivide.deal(
                redivide.rest_of(order, stretches), ranks, batch, drop)
            room = min(len(b) for b in per_rank)
            if not 0 <= count <= room:
                raise DamagedFile(shown, f"{key}.done[{i}][1]", "expected the batches each "
                                  f"rank took of that stretch, 0 to {room:,}, found {count!r}")
            stretches.append((per_rank, count))
        return order, stretches

    def check_split(self, split: redivide.Split, epoch: int, shown: Path | str,
                    key: str) -> None:
        """Refuse (``DamagedFile`` at ``key``) an epoch division read back whose counts
        fall outside its stretches' batches or whose order cannot be replayed;
        a division this data does not use (not re-dividable) is not read."""
        self._source = shown
        if not self._divisible:
            return
        done = [list(d) for d in split.done]
        self._stretches(split.order, [*done, [split.ranks, 0]], epoch, shown, key)

    def state_dict(self) -> dict[str, Any]:
        """The position: the loader's own state, or the generators at the epoch's start
        (and, for a loader that can be re-divided, the epoch's division)."""
        if self.stateful:
            return {"loader": self.data.state_dict()}  # type: ignore[attr-defined]
        if self._split is None:
            return {"epoch_rng": self._epoch_rng}
        return {"epoch_rng": self._epoch_rng, "split": self._split}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict`` (before ``resume_epoch``)."""
        self._loader = state.get("loader")
        self._epoch_rng = state.get("epoch_rng")
        split = state.get("split")
        self._split = dict(split) if split is not None and self._divisible else None
