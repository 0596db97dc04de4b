"""Preparing a run's parts for several processes: device, process group, model, data."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs
import torch

from schedtrain.distributed.comm import Comm, multi_process_env
from schedtrain.distributed.wrap import shard_loader, wrap_model

__all__ = ["Prepared", "prepare"]


@attrs.frozen
class Prepared:
    """What the trainer trains with: ``model`` is the user's module (on ``device``),
    ``train_model`` the one steps run through (DDP's wrapper on several processes)."""

    comm: Comm | None
    device: torch.device
    model: torch.nn.Module
    train_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    train_data: Iterable[Any]
    val_data: Iterable[Any] | None


def prepare(*, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
            train_data: Iterable[Any], val_data: Iterable[Any] | None, device: torch.device,
            strategy: str, shard_data: bool, seed: int) -> Prepared:
    """On one process: the model moved to ``device``. On several (``torchrun``): the
    process group made (NCCL for CUDA, gloo otherwise), CUDA pinned to the local rank,
    the model wrapped by ``strategy`` and plain data loaders sharded."""
    comm = None
    if multi_process_env():
        if device.type == "cuda" and device.index is None:
            from schedtrain.distributed.comm import World

            device = torch.device("cuda", World.from_env().local_rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        comm = Comm.setup(device)
    model = model.to(device)
    if comm is None:
        return Prepared(None, device, model, model, optimizer, train_data, val_data)
    train_model, optimizer = wrap_model(model, optimizer,
                                        "ddp" if strategy == "auto" else strategy, device)
    if shard_data:
        train_data = shard_loader(train_data, comm, seed)
        val_data = shard_loader(val_data, comm, seed) if val_data is not None else None
    return Prepared(comm, device, model, train_model, optimizer, train_data, val_data)
