"""The rest of an epoch re-divided among another number of ranks.

A checkpoint taken inside an epoch records how the epoch was divided so far: its order
(the ``DistributedSampler``'s seed, or on one process the generators that shuffled it),
and for each stretch of it the number of ranks and the batches each took. From that any
number of ranks computes the samples no rank has taken yet, in the epoch's order, and
deals them out again (``deal``): every rank gets the same number of batches, and no
sample is repeated or skipped. Only where the rest cannot be dealt so (fewer samples
than ranks, or one-sample batches dealt unevenly) are a few repeated, as
``DistributedSampler`` pads an epoch.
"""

from __future__ import annotations

from typing import Any, Final

import attrs
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
)

from schedtrain.checkpoints.rng import rng_state, set_rng_state
from schedtrain.distributed.wrap import LOADER_ARGS
from schedtrain.errors import describe
from schedtrain.readback import MAX_LIST, at_most, between, invalid

__all__ = ["MAX_RANKS", "MAX_STRETCHES", "Batches", "Split", "deal", "divisible",
           "first_stretch", "order_of", "planned_loader", "rest_of"]

#: The most processes a run's state may record (a checkpoint read back is refused past it).
MAX_RANKS: Final = MAX_LIST
#: The most stretches an epoch's division may record (one per process-count change
#: inside one epoch): each costs a pass over the epoch's samples when resumed.
MAX_STRETCHES: Final = 100

#: each rank's batches of sample indices, in order
Batches = list[list[list[int]]]


def _order(order: dict[str, Any]) -> str | None:
    """What is wrong with an epoch's ``order`` (``order_of``'s shape), or ``None``."""
    flags = ("shuffle", "drop_last") if "seed" in order else ("shuffle",)
    if "seed" in order:
        seed = order["seed"]
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            return f"expected a seed from 0 to 2**63 - 1, found {describe(seed)}"
    elif not isinstance(order.get("rng"), dict):
        return "expected a sampler's seed or the generators that shuffled the epoch"
    for flag in flags:
        if not isinstance(order.get(flag), bool):
            return f"expected {flag} = true or false, found {describe(order.get(flag))}"
    return None


@attrs.frozen
class Split:
    """An epoch's division read back (``DataPosition``'s ``split``): its ``order``,
    each earlier stretch's ``[ranks, batches each]`` (``done``), the ranks of this one
    and the batch it began at (``start``: the batches of the stretches before it)."""

    order: dict[str, Any]
    done: tuple[tuple[int, int], ...] = attrs.field(validator=at_most(MAX_STRETCHES))
    ranks: int = attrs.field(validator=between(1, MAX_RANKS))
    start: int = attrs.field(validator=between(0, 2**62))

    def __attrs_post_init__(self) -> None:
        if (why := _order(self.order)) is not None:
            raise invalid("order", why)
        for i, (ranks, count) in enumerate(self.done):
            if not 1 <= ranks <= MAX_RANKS:
                raise invalid(f"done[{i}][0]", f"expected a number of ranks from 1 to "
                              f"{MAX_RANKS:,}, found {ranks!r}")
            if count < 0:
                raise invalid(f"done[{i}][1]", f"expected a count of batches >= 0, "
                              f"found {count!r}")
        if self.start != sum(count for _, count in self.done):
            raise invalid("start", "expected the batches of the stretches before "
                          f"({sum(c for _, c in self.done):,}), found {self.start!r}")


def divisible(data: Any, ranks: int) -> bool:
    """Whether the rest of an epoch of ``data`` can be re-divided: a ``DataLoader`` over a
    sized dataset with its default batching, sharded by a ``DistributedSampler`` over
    ``ranks``, or on one process sampled by a ``RandomSampler`` (without its own
    generator) or ``SequentialSampler``."""
    if not isinstance(data, DataLoader) or data.batch_size is None \
            or type(data.batch_sampler) is not BatchSampler:
        return False
    sampler = data.sampler  # torch's own classes only: a subclass may order otherwise
    if type(sampler) is DistributedSampler:
        return sampler.num_replicas == ranks
    if ranks != 1:
        return False
    if type(sampler) is RandomSampler:
        return (sampler.generator is None and not sampler.replacement
                and sampler.num_samples == len(sampler.data_source))
    return type(sampler) is SequentialSampler


def order_of(data: DataLoader[Any], epoch_rng: Any) -> dict[str, Any]:
    """What decides the order of ``data``'s epoch (``divisible`` data): the sampler's seed,
    or the generators at the epoch's start (``epoch_rng``) that shuffle it on one process."""
    sampler = data.sampler
    if isinstance(sampler, DistributedSampler):
        return {"seed": sampler.seed, "shuffle": sampler.shuffle,
                "drop_last": sampler.drop_last}
    return {"rng": epoch_rng, "shuffle": isinstance(sampler, RandomSampler)}


def first_stretch(order: dict[str, Any], ranks: int, *, size: int, epoch: int,
                  batch_size: int, drop_last: bool) -> tuple[list[int], Batches]:
    """The epoch's order of ``size`` samples, and each of ``ranks`` ranks' batches as the
    loader made them when the epoch started (``order`` from ``order_of``)."""
    if "seed" in order:  # DistributedSampler.__iter__, then each rank's DataLoader
        if order["shuffle"]:
            g = torch.Generator()
            g.manual_seed(order["seed"] + epoch)
            indices: list[int] = torch.randperm(size, generator=g).tolist()
        else:
            indices = list(range(size))
        part = (size // ranks if order["drop_last"] else -(-size // ranks))
        padded = (indices * -(-part * ranks // size))[:part * ranks]
        return indices, [_batches(padded[r::ranks], batch_size, drop_last)
                         for r in range(ranks)]
    # One process: replay the DataLoader's draws from the generators at the epoch's
    # start (its iterator draws a worker seed before the sampler draws its own).
    now = rng_state()
    set_rng_state(order["rng"])
    try:
        sampler = (RandomSampler(range(size)) if order["shuffle"]
                   else SequentialSampler(range(size)))
        it = iter(BatchSampler(sampler, batch_size, drop_last))
        torch.empty((), dtype=torch.int64).random_()
        batches = [list(b) for b in it]
    finally:
        set_rng_state(now)
    flat = [i for b in batches for i in b]
    taken = set(flat)
    return flat + [i for i in range(size) if i not in taken], [batches]


def rest_of(order: list[int], stretches: list[tuple[Batches, int]]) -> list[int]:
    """The samples of ``order`` no rank has taken: ``stretches`` are each stretch's
    batches per rank and how many of them every rank took."""
    taken: set[int] = set()
    for per_rank, count in stretches:
        for batches in per_rank:
            for batch in batches[:count]:
                taken.update(batch)
    return [i for i in order if i not in taken]


def deal(rest: list[int], ranks: int, batch_size: int, drop_last: bool) -> Batches:
    """``rest`` dealt to ``ranks`` ranks, each the same number of batches of at most
    ``batch_size``: rank ``r`` takes every ``ranks``-th sample from the ``r``-th on. None
    is repeated or skipped, except: ``drop_last`` drops what does not fill a batch on
    every rank; fewer samples than ranks, or one-sample batches dealt unevenly, repeat
    the first few (as ``DistributedSampler`` pads)."""
    if not rest:
        return [[] for _ in range(ranks)]
    if drop_last:
        part = len(rest) // ranks
        return [_batches(rest[r::ranks][:part], batch_size, True) for r in range(ranks)]
    if len(rest) < ranks or (batch_size == 1 and len(rest) % ranks):
        target = -(-len(rest) // ranks) * ranks
        rest = (rest * -(-target // len(rest)))[:target]
    per_rank = [_batches(rest[r::ranks], batch_size, False) for r in range(ranks)]
    steps = max(len(b) for b in per_rank)
    for batches in per_rank:
        if len(batches) < steps:  # one sample fewer than the longest, at a batch's edge:
            batches.append([batches[-1].pop()])  # its last batch lends its last sample
    return per_rank


def _batches(indices: list[int], batch_size: int, drop_last: bool) -> list[list[int]]:
    out = [indices[i:i + batch_size] for i in range(0, len(indices), batch_size)]
    if drop_last and out and len(out[-1]) < batch_size:
        out.pop()
    return out


def planned_loader(data: DataLoader[Any], batches: list[list[int]]) -> DataLoader[Any]:
    """A loader like ``data`` (dataset, collation, workers) over exactly ``batches``."""
    kwargs = {k: getattr(data, k) for k in LOADER_ARGS
              if hasattr(data, k) and k not in ("batch_size", "drop_last")}
    if kwargs.get("num_workers", 0) == 0:
        for k in ("prefetch_factor", "persistent_workers", "multiprocessing_context"):
            kwargs.pop(k, None)
    return DataLoader(data.dataset, batch_sampler=batches, **kwargs)
