"""Putting a read checkpoint back: the model and optimizer states, and which rank's
generators and data position are this process's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schedtrain.checkpoints.contract import RunParts
from schedtrain.checkpoints.format import (
    CheckpointError,
    DamagedCheckpoint,
    UnfitCheckpoint,
    check_shape,
)
from schedtrain.checkpoints.remote_shards import Remote
from schedtrain.checkpoints.sharded import is_sharded, load_full, load_sharded
from schedtrain.distributed.comm import Comm
from schedtrain.readback import DamagedFile

__all__ = ["check_state", "load_model", "own_part"]


def check_state(parts: RunParts, state: dict[str, Any], shown: Path | str) -> None:
    """Refuse a checkpoint a resume of the own loop cannot trust, before anything is
    restored: a missing key, or a run state of the wrong type or out of bounds (its
    checksum may be valid: a crafted file can carry one). Hosted and sharded checkpoints
    hold other shapes: only the own loop's resume and pick check this.

    Raises:
        DamagedCheckpoint: naming the key path and what was expected.
    """
    try:
        check_shape(state, shown)
        parts.validate(shown, state["run"])
        now = state["run"]["clock"]["now"]  # typed by validate
        for key in ("step", "epoch"):
            if now[key] != state[key]:
                raise DamagedFile(shown, f"run.clock.now.{key}", (
                    f"expected the checkpoint's own {key} {state[key]}, found {now[key]}"))
    except DamagedFile as exc:
        raise DamagedCheckpoint(shown, f"{exc.key}: {exc.reason}: it is damaged or not "
                                       "written by schedtrain") from None
    except CheckpointError as exc:
        raise DamagedCheckpoint(shown, exc.reason) from None


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

    A checkpoint taken inside an epoch on another number of processes continues where
    its data position says how the epoch was divided (a plain ``DataLoader``): the
    position then carries ``"note"``, the one line a resume says about it.

    Raises:
        ValueError: ``run`` was taken inside an epoch on another number of processes,
            with data whose rest cannot be re-divided.
    """
    ranks = run.get("ranks")
    size, rank = (comm.size, comm.rank) if comm is not None else (1, 0)
    saved = [run] if ranks is None else ranks
    if len(saved) == size:
        return saved[rank]["rng"], saved[rank]["data"]
    mine = saved[rank] if rank < len(saved) else saved[0]
    if not run["epoch_open"]:
        return mine["rng"], saved[0]["data"]
    data = saved[0]["data"]
    if not isinstance(data, dict) or data.get("split") is None:
        what = ("a loader that keeps its own state (a StatefulDataLoader)"
                if isinstance(data, dict) and "loader" in data else
                "data schedtrain does not divide (not a plain DataLoader that shard_data "
                "gives a DistributedSampler)")
        raise UnfitCheckpoint(
            path, f"was taken inside an epoch on {len(saved)} processes with {what}, whose "
                  f"rest cannot be re-divided among {size}; resume it on {len(saved)}, or "
                  f"resume an epoch-end checkpoint on {size}")
    # One line of at most 300 characters with a long path before it: said briefly.
    note = (f"checkpoint {Path(str(path)).name}, taken inside an epoch on {len(saved)} "
            f"processes, resumes on {size}: the samples no rank took are re-divided among "
            f"{size}, so this epoch's batches differ (docs/distributed.md)")
    return mine["rng"], {**data, "note": note}
