"""``Snapshot``: what a checkpoint holds, gathered from the run's parts and put back.

The checkpoint's keys (documented in docs/checkpoints.md)::

    format        "schedtrain-checkpoint-2"
    phase         the event it was taken after ("step_end", "epoch_end", "preempt"...)
    step, epoch   the clock then
    finite        whether the weights and the last loss were all finite
    model         model.state_dict(): load it alone with torch.load(..., weights_only=True)
    optimizer     optimizer.state_dict()
    scaler        the fp16 GradScaler's state, or None
    run           everything else a resumed run needs: clock, trigger table, callbacks,
                  metrics, losses, random generators, data position, the epoch in
                  progress, events.jsonl's length, the checkpoints this run wrote
    checksum      {"algorithm": "blake2b-256", "digest": ...} of all the above

Under FSDP2 (sharded weights) a checkpoint is a directory ``NAME.dcp`` that every rank
writes its shard into (``training.sharded``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from schedtrain.callbacks.base import Callback
from schedtrain.clock import LoopClock
from schedtrain.distributed.comm import Comm
from schedtrain.monitors.jsonl import JsonlWriter
from schedtrain.monitors.store import MetricStore
from schedtrain.schedule.table import TriggerTable
from schedtrain.training.checkpoint import is_finite, read_checkpoint, write_checkpoint
from schedtrain.training.losses import LossKeeper
from schedtrain.training.sharded import (
    SUFFIX,
    is_sharded,
    load_full,
    load_sharded,
    save_sharded,
)
from schedtrain.training.state import DataPosition, rng_state, set_rng_state

__all__ = ["Snapshot"]


class Snapshot:
    """Reads and writes the run's state; every part is held by reference.

    Args:
        model, optimizer, scaler, clock, table, callbacks, metrics, losses, position: the
            run's parts.
        epoch_open: whether an epoch is in progress now (checked at save time).
        events: the ``events.jsonl`` writer, or ``None`` without a run directory.
        run_dir: paths of checkpoints this run wrote are kept relative to it.
    """

    def __init__(self, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scaler: Any, clock: LoopClock, table: TriggerTable,
                 callbacks: Mapping[str, Callback], metrics: MetricStore, losses: LossKeeper,
                 position: DataPosition, epoch_open: Callable[[], bool],
                 events: JsonlWriter | None, run_dir: Path | None,
                 comm: Comm | None = None) -> None:
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.clock, self.table, self.callbacks = clock, table, callbacks
        self.metrics, self.losses, self.position = metrics, losses, position
        self.epoch_open, self.events, self.run_dir = epoch_open, events, run_dir
        self.comm = comm
        #: checkpoints this run wrote (relative to the run directory when inside it);
        #: pruning deletes only these
        self.written: list[str] = []

    def key(self, path: Path) -> str:
        """How ``path`` is recorded among ``written``."""
        if self.run_dir is not None:
            try:
                return str(path.resolve().relative_to(self.run_dir.resolve()))
            except ValueError:
                pass
        return str(path.resolve())

    def resolve(self, key: str) -> Path:
        """The path a ``written`` entry stands for, in this run's directory."""
        path = Path(key)
        return path if path.is_absolute() or self.run_dir is None else self.run_dir / path

    def write(self, path: Path, phase: str) -> Path:
        """Write a checkpoint of the run now; returns the path written.

        A checkpoint of non-finite weights or loss never replaces a file: it goes beside
        it as ``<name>-nonfinite.pt``. On several processes every rank calls this: each
        rank's generators and data position are gathered, and the chief writes the file;
        of a sharded (FSDP2) model every rank writes its shard into ``<name>.dcp/``.
        """
        ranks = None
        if self.comm is not None:
            ranks = self.comm.gather({"rng": rng_state(), "data": self.position.state_dict()})
        model_state = self.model.state_dict()
        comm = self.comm
        sharded = comm is not None and is_sharded(model_state)
        finite = is_finite(model_state, self.losses.last)
        if sharded and comm is not None:
            finite = not comm.any(not finite)  # each rank checked its own shard
            path = path.with_suffix(SUFFIX)
        if not finite:
            path = path.with_name(f"{path.stem}-nonfinite{path.suffix}")
        key = self.key(path)
        if key not in self.written:
            self.written.append(key)
        now = self.clock.now()
        run = self._run_state()
        body: dict[str, Any] | None = {
            "phase": phase, "step": now.step, "epoch": now.epoch, "finite": finite,
            "model": None, "optimizer": None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "run": run}
        if comm is not None:
            run["ranks"] = ranks
            body = body if comm.is_chief else None
        if sharded and comm is not None:
            return save_sharded(path, body, model=self.model, optimizer=self.optimizer,
                                comm=comm)
        if body is None:
            return path
        body["model"], body["optimizer"] = model_state, self.optimizer.state_dict()
        return write_checkpoint(body, path)

    def _run_state(self) -> dict[str, Any]:
        return {
            "clock": self.clock.state_dict(),
            "table": self.table.state_dict(),
            "callbacks": {n: cb.state_dict() for n, cb in self.callbacks.items()},
            "metrics": self.metrics.state_dict(),  # with the values not yet written
            "losses": self.losses.state_dict(),
            "rng": rng_state(),
            "data": self.position.state_dict(),
            "epoch_open": self.epoch_open(),
            "events_offset": self.events.position() if self.events is not None else None,
            "written": list(self.written),
        }

    def read(self, path: Path) -> dict[str, Any]:
        """Load ``path`` (checked) and put everything back; returns the checkpoint (its
        ``phase``, ``step``, ``run``... with the model's and optimizer's states consumed).

        Raises:
            CheckpointError: a missing, corrupt or foreign file.
            ValueError: the checkpoint was saved with other callbacks.
        """
        # On the host: tensors are copied into the model's and optimizer's own devices.
        state = read_checkpoint(path, map_location="cpu")
        run = state["run"]
        saved = set(run["callbacks"])
        if saved != set(self.callbacks):
            raise ValueError(
                f"checkpoint {str(path)!r} was saved with callbacks {sorted(saved)}, "
                f"this trainer has {sorted(self.callbacks)}")
        if state.get("shards") is not None:
            load_sharded(path, model=self.model, optimizer=self.optimizer)
        elif is_sharded(self.model.state_dict()):
            load_full(state["model"], state["optimizer"], model=self.model,
                      optimizer=self.optimizer)
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.clock.load_state_dict(run["clock"])
        self.metrics.load_state_dict(run["metrics"])
        self.table.load_state_dict(run["table"])
        for name, cb_state in run["callbacks"].items():
            self.callbacks[name].load_state_dict(cb_state)
        rng, data = self._own_part(path, run)
        set_rng_state(rng)
        self.position.load_state_dict(data)
        self.losses.load_state_dict(run["losses"])
        self.written = list(run["written"])
        if self.events is not None and run["events_offset"] is not None:
            self.events.truncate(int(run["events_offset"]))
        return state

    def _own_part(self, path: Path, run: dict[str, Any]) -> tuple[Any, Any]:
        """This rank's generators and data position in ``run``."""
        ranks = run.get("ranks")
        if ranks is None:
            return run["rng"], run["data"]
        size = self.comm.size if self.comm is not None else 1
        if len(ranks) == size:
            mine = ranks[self.comm.rank if self.comm is not None else 0]
            return mine["rng"], mine["data"]
        if run["epoch_open"]:
            raise ValueError(
                f"checkpoint {str(path)!r} was taken inside an epoch on {len(ranks)} "
                f"processes; resume it on {len(ranks)}, or resume an epoch-end checkpoint "
                f"on {size}")
        return ranks[0]["rng"], ranks[0]["data"]
