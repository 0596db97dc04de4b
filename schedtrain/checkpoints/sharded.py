"""Sharded checkpoints (FSDP2): every rank writes its part through
``torch.distributed.checkpoint`` (DCP).

A sharded checkpoint is a directory (docs/checkpoints.md)::

    step-00000120.dcp/
      .metadata            DCP's index of every tensor's shards
      __0_0.distcp ...     each rank's shard of the model and optimizer states
      run.pt               the rest, as in a one-file checkpoint, with "model" and
                           "optimizer" None and "shards" the checksum of every file above

Model and optimizer states go through ``get_state_dict``/``set_state_dict``, keyed by
parameter name, so DCP reshards them on load: a checkpoint from 2 ranks resumes on 1
(no process group: the plain model gets full tensors) or on 3. A one-file checkpoint
(one process, DDP) loads into a sharded model too: each rank keeps its shard.

``torch.distributed.checkpoint`` is imported only when a sharded checkpoint is written or
read: it takes over a second to import, which a one-process run never needs.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from schedtrain.checkpoints.files import fresh_dir, fsync_dir, replace_dir
from schedtrain.checkpoints.format import STATE_FILE, file_digests
from schedtrain.checkpoints.rng import preserved_rng
from schedtrain.checkpoints.store import write_checkpoint
from schedtrain.distributed.comm import Comm

__all__ = ["SUFFIX", "is_sharded", "load_full", "load_sharded", "save_sharded"]

#: A sharded checkpoint's directory name ends so; ``step-00000120.dcp``.
SUFFIX = ".dcp"


def is_sharded(model_state: dict[str, Any]) -> bool:
    """Whether a model's ``state_dict`` holds sharded tensors (DTensors of FSDP2)."""
    return any(type(v).__name__ == "DTensor" for v in model_state.values())


def save_sharded(path: Path, body: dict[str, Any] | None, *, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, comm: Comm) -> Path:
    """Write a sharded checkpoint directory at ``path``; every rank calls this.

    ``body`` (the chief's; ``None`` elsewhere) is what goes into ``run.pt``. The shards
    are written into ``.NAME.tmp`` beside ``path``, which replaces ``path`` only once
    complete and synced: a crash leaves the previous checkpoint as it was.
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    tmp = path.with_name(f".{path.name}.tmp")  # the same name on every rank
    if comm.is_chief:
        fresh_dir(tmp)
    comm.barrier()
    # DCP must not move the generators: the uninterrupted run would then differ from
    # the resumed one, which restores them as they were before the save.
    with preserved_rng():
        msd, osd = get_state_dict(model, optimizer)
        dcp_save({"model": msd, "optimizer": osd}, checkpoint_id=tmp)
    if comm.is_chief:
        assert body is not None
        fsync_dir(tmp)
        shards = {"world_size": comm.size, "files": file_digests(tmp)}
        write_checkpoint({**body, "model": None, "optimizer": None, "shards": shards},
                         tmp / STATE_FILE)
        replace_dir(tmp, path)
    comm.barrier()  # nobody prunes or saves again before the directory is in place
    return path


def load_sharded(path: Path, *, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer) -> None:
    """Load a sharded checkpoint's model and optimizer into ``model`` (sharded on any
    number of ranks, or plain on one process) and ``optimizer``."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    with preserved_rng():  # building the optimizer's empty state must not move them
        msd, osd = get_state_dict(model, optimizer)
        state: dict[str, Any] = {"model": msd, "optimizer": osd}
        alone = not (dist.is_available() and dist.is_initialized())
        with warnings.catch_warnings():  # one process on purpose: DCP's warning says so
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            dcp_load(state, checkpoint_id=path, no_dist=alone)
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])


def load_full(model_state: dict[str, Any], optim_state: dict[str, Any], *,
              model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load a one-file checkpoint's full states (``model.state_dict()``,
    ``optimizer.state_dict()``) into a sharded ``model`` and its ``optimizer``."""
    # The file's optimizer state numbers parameters in its groups' order, which
    # ``wrap_model`` keeps; DCP wants them by name.
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    by_name: dict[str, Any] = {
        "state": {order[i]: v for i, v in optim_state["state"].items()},
        "param_groups": [{**g, "params": [order[i] for i in g["params"]]}
                         for g in optim_state["param_groups"]]}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    with preserved_rng():
        set_state_dict(model, optimizer, model_state_dict=model_state,
                       optim_state_dict=by_name,
                       options=StateDictOptions(full_state_dict=True))
