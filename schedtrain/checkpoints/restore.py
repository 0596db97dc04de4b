"""Putting a read checkpoint back: the model and optimizer states, and which rank's
generators and data position are this process's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schedtrain.checkpoints.contract import RunParts
from schedtrain.checkpoints.remote_shards import Remote
from schedtrain.checkpoints.sharded import is_sharded, load_full, load_sharded
from schedtrain.distributed.comm import Comm

__all__ = ["load_model", "own_part"]


def load_model(parts: RunParts, path: Path, state: dict[str, Any],
               remote: Remote | None = None) -> None:
    """Put a read checkpoint's model and optimizer states into the run's (``remote``:
    the sharded one in an object store that ``path`` stands for)."""
    if state.get("shards") is not None:
        load_sharded(path, model=parts.model, optimizer=parts.optimizer, remote=remote)
    elif is_sharded(parts.model.state_dict()):
        load_full(state["model"], state["optimizer"], model=parts.model,
                  optimizer=parts.optimizer)
    else:
        parts.model.load_state_dict(state["model"])
        parts.optimizer.load_state_dict(state["optimizer"])


def own_part(comm: Comm | None, path: Path | str, run: dict[str, Any]) -> tuple[Any, Any]:
    """This rank's generators and data position in ``run``.

    Raises:
        ValueError: ``run`` was taken inside an epoch on another number of processes.
    """
    ranks = run.get("ranks")
    if ranks is None:
        return run["rng"], run["data"]
    size = comm.size if comm is not None else 1
    if len(ranks) == size:
        mine = ranks[comm.rank if comm is not None else 0]
        return mine["rng"], mine["data"]
    if run["epoch_open"]:
        raise ValueError(
            f"checkpoint {str(path)!r} was taken inside an epoch on {len(ranks)} "
            f"processes; resume it on {len(ranks)}, or resume an epoch-end checkpoint "
            f"on {size}")
    return ranks[0]["rng"], ranks[0]["data"]
