"""``Checkpoints``: the one owner of a run's checkpoints.

It writes a checkpoint of the run (one file, or a sharded directory every rank writes
into), reads one back and puts the run as it was, keeps the saves callbacks ask for
during an event until the event is over, remembers which checkpoints this run wrote
(pruning deletes only those) and picks the one ``--resume auto`` continues. What a
checkpoint holds besides the weights comes from the run's parts (``RunParts``:
``training.run_state``); the keys are documented in docs/checkpoints.md.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import structlog
import torch

from schedtrain.checkpoints.export import export_weights
from schedtrain.checkpoints.files import remove
from schedtrain.checkpoints.format import CheckpointError, is_finite
from schedtrain.checkpoints.rng import rng_state
from schedtrain.checkpoints.sharded import (
    SUFFIX,
    is_sharded,
    load_full,
    load_sharded,
    save_sharded,
)
from schedtrain.checkpoints.store import newest_valid, read_checkpoint, write_checkpoint
from schedtrain.distributed.comm import Comm
from schedtrain.errors import locate_failure

__all__ = ["Checkpoints", "RunParts", "Save"]

_log = structlog.get_logger("schedtrain.training")

#: A save asked for during an event: where, and who to tell the path written.
Save = tuple[Path, Callable[[Path], None] | None]


def _cause(exc: BaseException) -> str:
    """A write's failure in a few words: the OS error's own, or torch's first line."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip()
    if "unexpected pos" in text or "write" in text.lower():
        return "the file could not be written in full: the disk is full or a size limit hit"
    return (text.splitlines() or [type(exc).__name__])[0][:200]


class RunParts(Protocol):
    """What a checkpoint holds of the run besides its weights, and how it is put back."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: Any

    def position(self) -> tuple[int, int]:
        """The clock's ``(step, epoch)`` now."""

    def last_loss(self) -> torch.Tensor | None:
        """The last step's loss (its finiteness goes into the checkpoint)."""

    def data_state(self) -> Any:
        """This rank's position in the data."""

    def capture(self) -> dict[str, Any]:
        """The run's state (the checkpoint's ``run`` key) now."""

    def check(self, path: Path, run: dict[str, Any]) -> None:
        """Refuse a checkpoint this run cannot continue (``ValueError``)."""

    def restore(self, run: dict[str, Any], rng: Any, data: Any) -> None:
        """Put the run's state back, with this rank's generators and data position."""


class Checkpoints:
    """Writes, reads, queues and lists a run's checkpoints.

    Args:
        parts: the run's state to save and restore.
        run_dir: paths of checkpoints this run wrote are kept relative to it.
        comm: on several processes, how the ranks write together (``None``: one).
    """

    def __init__(self, parts: RunParts, *, run_dir: Path | None,
                 comm: Comm | None = None) -> None:
        self.parts, self.run_dir, self.comm = parts, run_dir, comm
        #: checkpoints this run wrote (relative to the run directory when inside it)
        self.written: list[str] = []
        #: saves asked for during the current event, written once it is over
        self.pending: list[Save] = []
        #: log each checkpoint written (an application configured structlog)
        self.log = False
        #: folders this process wrote checkpoints into: the only ones it deletes from
        self._folders: set[Path] = set()
        #: told ``(path, phase, step, epoch)`` after each checkpoint is written (the run
        #: directory records it in ``run.json``, so a killed run says how far it got)
        self.on_written: Callable[[Path, str, int, int], None] | None = None
        #: formats the model's weights are also exported in (``export.EXPORT_FORMATS``)
        self.export: tuple[str, ...] = ()

    # -- which checkpoints ---------------------------------------------------------------------
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

    def paths(self) -> list[Path]:
        """Checkpoints this run wrote (across resumes), oldest first."""
        return [self.resolve(k) for k in self.written]

    def delete(self, path: Path) -> bool:
        """Delete a checkpoint this run wrote (on the chief); any other path is left
        alone. Returns whether it was one of this run's.

        The list of what the run wrote is read back from checkpoints on resume, so it is
        not trusted alone: the file must also sit in a folder this process has written a
        checkpoint into.
        """
        if (self.key(path) not in self.written
                or path.parent.resolve() not in self._folders):
            return False
        if self.comm is None or self.comm.is_chief:
            remove(path)
        return True

    @staticmethod
    def newest_valid(folder: Path,
                     skipped: Callable[[Path, str], None] | None = None) -> Path | None:
        """The newest checkpoint in ``folder`` that loads, matches its checksum and is
        finite (``--resume auto``); each one passed over goes to ``skipped(path, why)``."""
        return newest_valid(folder, skipped)

    # -- the save queue ------------------------------------------------------------------------
    def request(self, path: Path, on_saved: Callable[[Path], None] | None = None) -> None:
        """Write a checkpoint once the current event is over (every firing has run)."""
        self.pending.append((path, on_saved))

    def flush(self, phase: str) -> None:
        """Write the checkpoints asked for during the event ``phase``."""
        saves, self.pending = self.pending, []
        for path, on_saved in saves:
            written = self.write(path, phase)
            if on_saved is not None:  # the path written: "-nonfinite" added when it was
                on_saved(written)

    def discard(self) -> None:
        """Forget the saves asked for: never a checkpoint of a half-done event."""
        self.pending = []

    # -- writing and reading -------------------------------------------------------------------
    def write(self, path: Path, phase: str) -> Path:
        """Write a checkpoint of the run now; returns the path written.

        A checkpoint of non-finite weights or loss never replaces a file: it goes beside
        it as ``<name>-nonfinite.pt``. On several processes every rank calls this: each
        rank's generators and data position are gathered, and the chief writes the file;
        of a sharded (FSDP2) model every rank writes its shard into ``<name>.dcp/``.
        """
        parts, comm = self.parts, self.comm
        ranks = None
        if comm is not None:
            ranks = comm.gather({"rng": rng_state(), "data": parts.data_state()})
        model_state = parts.model.state_dict()
        sharded = comm is not None and is_sharded(model_state)
        finite = is_finite(model_state, parts.last_loss())
        if sharded and comm is not None:
            finite = not comm.any(not finite)  # each rank checked its own shard
            path = path.with_suffix(SUFFIX)
        if not finite:
            path = path.with_name(f"{path.stem}-nonfinite{path.suffix}")
        key = self.key(path)
        if key not in self.written:
            self.written.append(key)
        self._folders.add(path.parent.resolve())
        step, epoch = parts.position()
        run = {**parts.capture(), "written": list(self.written)}
        body: dict[str, Any] | None = {
            "phase": phase, "step": step, "epoch": epoch, "finite": finite,
            "model": None, "optimizer": None,
            "scaler": parts.scaler.state_dict() if parts.scaler is not None else None,
            "run": run}
        if comm is not None:
            run["ranks"] = ranks
            body = body if comm.is_chief else None
        try:
            if sharded and comm is not None:
                written = save_sharded(path, body, model=parts.model,
                                       optimizer=parts.optimizer, comm=comm)
            elif body is None:
                written = path
            else:
                body["model"], body["optimizer"] = model_state, parts.optimizer.state_dict()
                written = write_checkpoint(body, path)
        except (OSError, RuntimeError) as exc:  # a full disk, a quota, a read-only mount
            failed = CheckpointError(path, f"could not be written ({_cause(exc)}); the "
                                           "previous checkpoints are as they were")
            locate_failure(failed, f"the checkpoint write after step {step} "
                                   f"(epoch {epoch}, {phase})")
            raise failed from exc
        if self.log:
            _log.debug("checkpoint", path=str(written), step=step, phase=phase)
        if self.on_written is not None and (comm is None or comm.is_chief):
            self.on_written(written, phase, step, epoch)
        return written

    # -- exports -------------------------------------------------------------------------------
    def export_model(self, path: Path) -> Path | None:
        """Export the model's weights now to ``path`` (with ``export``; on the chief):
        ``None`` when nothing is exported here."""
        if "safetensors" not in self.export or not (self.comm is None or self.comm.is_chief):
            return None
        step, epoch = self.parts.position()
        return export_weights(self.parts.model.state_dict(), path, step=step, epoch=epoch)

    def export_checkpoint(self, checkpoint: Path, path: Path) -> Path | None:
        """Export the weights of the committed ``checkpoint`` to ``path`` (with
        ``export``; on the chief): the file holds what the checkpoint holds, however
        long after its request it was written."""
        if "safetensors" not in self.export or not (self.comm is None or self.comm.is_chief):
            return None
        state = read_checkpoint(checkpoint, map_location="cpu")
        return export_weights(state["model"], path, step=state["step"], epoch=state["epoch"])

    def read(self, path: Path) -> dict[str, Any]:
        """Load ``path`` (checked) and put the run back as it was; returns the checkpoint
        (its ``phase``, ``step``, ``run``...).

        Raises:
            CheckpointError: a missing, corrupt or foreign file.
            ValueError: the checkpoint does not fit this run (other callbacks, or taken
                inside an epoch on another number of processes).
        """
        parts = self.parts
        # On the host: tensors are copied into the model's and optimizer's own devices.
        state = read_checkpoint(path, map_location="cpu")
        run = state["run"]
        parts.check(path, run)
        rng, data = self._own_part(path, run)
        self._load_model(path, state)
        if parts.scaler is not None and state["scaler"] is not None:
            parts.scaler.load_state_dict(state["scaler"])
        parts.restore(run, rng, data)
        self.written = list(run["written"])
        return state

    def load_weights(self, path: Path) -> dict[str, Any]:
        """Load only the model and optimizer states of checkpoint ``path`` (checked), as
        a saver's ``load_best_at_end`` does; the clock, metrics and callbacks stay as they
        are. Returns the checkpoint. On several processes every rank calls it, after the
        chief has finished writing."""
        if self.comm is not None:
            self.comm.barrier()  # the chief's last write is over before anyone reads
        state = read_checkpoint(path, map_location="cpu")
        self._load_model(path, state)
        return state

    def _load_model(self, path: Path, state: dict[str, Any]) -> None:
        """Put a read checkpoint's model and optimizer states into the run's."""
        parts = self.parts
        if state.get("shards") is not None:
            load_sharded(path, model=parts.model, optimizer=parts.optimizer)
        elif is_sharded(parts.model.state_dict()):
            load_full(state["model"], state["optimizer"], model=parts.model,
                      optimizer=parts.optimizer)
        else:
            parts.model.load_state_dict(state["model"])
            parts.optimizer.load_state_dict(state["optimizer"])

    def _own_part(self, path: Path, run: dict[str, Any]) -> tuple[Any, Any]:
        """This rank's generators and data position in ``run``."""
        ranks = run.get("ranks")
        if ranks is None:
            return run["rng"], run["data"]
        comm = self.comm
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

