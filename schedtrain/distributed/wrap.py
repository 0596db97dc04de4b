"""Wrapping a model for several processes (DDP or FSDP2) and sharding its data.

The task builds its model, optimizer and data as for one process; the trainer then
wraps the model (``DistributedDataParallel``, or FSDP2's ``fully_shard``, after which
the optimizer is rebuilt over the sharded parameters) and gives a plain ``DataLoader``
a ``DistributedSampler``, so each rank sees its own part of every epoch.
"""

from __future__ import annotations

from typing import Any, Final

import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

from schedtrain.distributed.comm import Comm
from schedtrain.distributed.vocabulary import STRATEGIES

__all__ = ["LOADER_ARGS", "STRATEGIES", "rank_loader", "shard_loader", "wrap_model"]

# DataLoader arguments carried over when it is rebuilt with a distributed sampler.
LOADER_ARGS: Final = ("batch_size", "num_workers", "collate_fn", "pin_memory", "drop_last",
                       "timeout", "worker_init_fn", "multiprocessing_context", "generator",
                       "prefetch_factor", "persistent_workers", "pin_memory_device",
                       "in_order", "snapshot_every_n_steps")


def wrap_model(model: torch.nn.Module, optimizer: torch.optim.Optimizer, strategy: str,
               device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model (and optimizer) for ``strategy``: ``"ddp"`` or ``"fsdp"``.

    FSDP2 replaces the parameters: the optimizer is rebuilt with the same class, groups
    and settings over the sharded ones (it must not have stepped yet).
    """
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids), optimizer
    if strategy != "fsdp":
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    from torch.distributed.fsdp import fully_shard

    if optimizer.state:
        raise ValueError("with strategy 'fsdp' the optimizer is rebuilt over the sharded "
                         "parameters: give one that has not stepped")
    names = {id(p): n for n, p in model.named_parameters()}
    groups = [[names[id(p)] for p in g["params"]] for g in optimizer.param_groups]
    # Shard each child that holds parameters, then the root (FSDP2's usual layout).
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child)
    fully_shard(model)
    params = dict(model.named_parameters())
    rebuilt = [{**{k: v for k, v in g.items() if k != "params"},
                "params": [params[n] for n in names_]}
               for g, names_ in zip(optimizer.param_groups, groups, strict=True)]
    return model, type(optimizer)(rebuilt, **optimizer.defaults)


def shard_loader(data: Any, comm: Comm, seed: int) -> Any:
    """``data`` with a ``DistributedSampler`` when it is a ``DataLoader`` over a map-style
    dataset with the default sampler; anything else is returned as it is (it must already
    give each rank its own part, with the same number of steps per epoch)."""
    return rank_loader(data, comm.size, comm.rank, seed)


def rank_loader(data: Any, ranks: int, rank: int, seed: int) -> Any:
    """``data`` as rank ``rank`` of ``ranks`` takes it (``shard_loader``'s division): no
    process group is needed, so ``plan --nproc`` counts a rank's batches by this very rule."""
    if not isinstance(data, DataLoader):
        return data
    sampler = data.sampler
    if isinstance(sampler, DistributedSampler) or not isinstance(
            sampler, RandomSampler | SequentialSampler) or data.batch_size is None:
        return data
    dist_sampler: DistributedSampler[Any] = DistributedSampler(
        data.dataset, num_replicas=ranks, rank=rank,
        shuffle=isinstance(sampler, RandomSampler), seed=seed, drop_last=data.drop_last)
    kwargs = {k: getattr(data, k) for k in LOADER_ARGS if hasattr(data, k)}
    if kwargs.get("num_workers", 0) == 0:
        for k in ("prefetch_factor", "persistent_workers", "multiprocessing_context"):
            kwargs.pop(k, None)
    return type(data)(data.dataset, sampler=dist_sampler, **kwargs)
