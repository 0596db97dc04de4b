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

Under ``checkpoint_mode = "async"`` every rank stages its shards to host memory
(``async_save``) and a DCP thread writes them, talking over a gloo group of its own (the
loop's collectives go on meanwhile on the default group). The write is finished by
``finish_sharded``, which every rank calls at the same agreed point (the next save, or a
way out of the loop): each waits for its own future, the ranks agree all succeeded, the
chief commits (``run.pt`` with the shards' checksums, then the rename) and a barrier ends
it.

``torch.distributed.checkpoint`` is imported only when a sharded checkpoint is written or
read: it takes over a second to import, which a one-process run never needs.
"""

from __future__ import annotations

import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import attrs
import torch

from schedtrain.checkpoints.files import fresh_dir, fsync_dir, replace_dir
from schedtrain.checkpoints.format import STATE_FILE, CheckpointError, file_digests
from schedtrain.checkpoints.remote_shards import Remote, commit_remote, reader, uncommit, writer
from schedtrain.checkpoints.rng import preserved_rng
from schedtrain.checkpoints.store import write_checkpoint
from schedtrain.distributed.comm import Comm

__all__ = ["SUFFIX", "InFlight", "finish_sharded", "is_sharded", "load_full", "load_sharded",
           "save_sharded", "start_sharded"]

#: A sharded checkpoint's directory name ends so; ``step-00000120.dcp``.
SUFFIX = ".dcp"


def is_sharded(model_state: dict[str, Any]) -> bool:
    """Whether a model's ``state_dict`` holds sharded tensors (DTensors of FSDP2)."""
    return any(type(v).__name__ == "DTensor" for v in model_state.values())


def save_sharded(path: Path, body: dict[str, Any] | None, *, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, comm: Comm,
                 remote: Remote | None = None) -> Path:
    """Write a sharded checkpoint directory at ``path``; every rank calls this.

    ``body`` (the chief's; ``None`` elsewhere) is what goes into ``run.pt``. The shards
    are written into ``.NAME.tmp`` beside ``path``, which replaces ``path`` only once
    complete and synced: a crash leaves the previous checkpoint as it was. ``remote``:
    the checkpoint goes to an object store instead (``remote_shards``), committed by its
    manifest.
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    tmp = _begin(path, comm, remote)
    # DCP must not move the generators: the uninterrupted run would then differ from
    # the resumed one, which restores them as they were before the save.
    with preserved_rng():
        msd, osd = get_state_dict(model, optimizer)
        if remote is not None:
            dcp_save({"model": msd, "optimizer": osd}, storage_writer=writer(remote))
        else:
            dcp_save({"model": msd, "optimizer": osd}, checkpoint_id=tmp)
    _commit(tmp, path, body, comm, remote=remote)
    return path


@attrs.frozen
class InFlight:
    """A sharded checkpoint being written in the background on this rank."""

    path: Path
    tmp: Path
    body: dict[str, Any] | None
    future: Future[Any]
    remote: Remote | None = None


_groups: dict[int, Any] = {}  # the DCP thread's gloo group, one per world


def start_sharded(path: Path, body: dict[str, Any] | None, *, model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer, comm: Comm,
                  remote: Remote | None = None) -> InFlight:
    """Stage this rank's shards to host memory and write them in the background; every
    rank calls this, then ``finish_sharded`` at one agreed later point. ``body`` is the
    chief's ``run.pt`` as of now (a snapshot)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint.state_dict_saver import async_save

    group = _groups.get(comm.size)
    if group is None:  # collective: every rank is here at its first sharded save
        group = _groups[comm.size] = dist.new_group(backend="gloo")
    tmp = _begin(path, comm, remote)
    where: dict[str, Any] = ({"checkpoint_id": tmp} if remote is None else
                             {"storage_writer": writer(remote)})
    with preserved_rng():
        msd, osd = get_state_dict(model, optimizer)
        future = async_save({"model": msd, "optimizer": osd}, process_group=group, **where)
    assert isinstance(future, Future)  # the default stager copies now: a plain future
    return InFlight(path, tmp, body, future, remote)


def finish_sharded(flight: InFlight, comm: Comm, *, together: bool = True) -> Path:
    """Wait for this rank's background write of ``flight``, then commit it.

    ``together``: every rank calls this at the same point; they agree all wrote, the
    chief commits and a barrier ends it. Otherwise (a way out on an exception, which
    other ranks may not share) no collective runs: each rank waits for its own write and
    the chief commits once its write is done, for DCP ends the chief's write only after
    every rank's shards and the index are written.

    Raises:
        CheckpointError: a rank's write failed (``together``: on every rank, and none
            commits).
    """
    error: BaseException | None = None
    try:
        flight.future.result()
    except Exception as exc:  # told every rank below: they fail alike
        error = exc
    if not together:
        if error is not None:
            raise error
        if comm.is_chief:
            _commit(flight.tmp, flight.path, flight.body, comm, barrier=False,
                    remote=flight.remote)
        return flight.path
    if comm.any(error is not None):
        if error is not None:
            raise error
        raise CheckpointError(flight.path, "another rank could not write its shard; the "
                                           "previous checkpoints are as they were")
    _commit(flight.tmp, flight.path, flight.body, comm, remote=flight.remote)
    return flight.path


def _begin(path: Path, comm: Comm, remote: Remote | None = None) -> Path:
    """The temporary directory ``.NAME.tmp`` beside ``path`` (the same name on every
    rank), fresh and empty once every rank returns; ``remote``'s folder is emptied
    (its manifest first) instead."""
    tmp = path.with_name(f".{path.name}.tmp")
    if comm.is_chief:
        if remote is not None:
            uncommit(remote)
        else:
            fresh_dir(tmp)
    comm.barrier()
    return tmp


def _commit(tmp: Path, path: Path, body: dict[str, Any] | None, comm: Comm, *,
            barrier: bool = True, remote: Remote | None = None) -> None:
    """The shards in ``tmp`` are complete on every rank: the chief adds ``run.pt`` (with
    their checksums) and renames ``tmp`` to ``path`` (``remote``: writes its manifest)."""
    if comm.is_chief and remote is not None:
        assert body is not None
        commit_remote(remote, body, comm.size)
    elif comm.is_chief:
        assert body is not None
        fsync_dir(tmp)
        shards = {"world_size": comm.size, "files": file_digests(tmp)}
        write_checkpoint({**body, "model": None, "optimizer": None, "shards": shards},
                         tmp / STATE_FILE)
        replace_dir(tmp, path)
    if barrier:
        comm.barrier()  # nobody prunes or saves again before the directory is in place


def load_sharded(path: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 remote: Remote | None = None) -> None:
    """Load a sharded checkpoint's model and optimizer into ``model`` (sharded on any
    number of ranks, or plain on one process) and ``optimizer``; ``remote``: the one
    in an object store that ``path`` stands for."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    with preserved_rng():  # building the optimizer's empty state must not move them
        msd, osd = get_state_dict(model, optimizer)
        state: dict[str, Any] = {"model": msd, "optimizer": osd}
        alone = not (dist.is_available() and dist.is_initialized())
        with warnings.catch_warnings():  # one process on purpose: DCP's warning says so
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            where: dict[str, Any] = ({"checkpoint_id": path} if remote is None else
                                     {"storage_reader": reader(remote)})
            dcp_load(state, no_dist=alone, **where)
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
