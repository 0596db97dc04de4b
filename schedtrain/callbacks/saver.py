"""``ModelSaver`` (the last N checkpoints) and ``MinSaver``/``MaxSaver`` (the best by a metric).

Checkpoints are written atomically, with a checksum, once every callback firing at the
current event has run, so each is resumable (see docs/checkpoints.md). ``ModelSaver``
prunes only checkpoints this run wrote, and never the newest one whose weights and loss
are finite: a run that diverges keeps a good checkpoint to go back to.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

import attrs
import structlog

from schedtrain.callbacks.base import Callback
from schedtrain.checkpoints.files import NAME_RE, checkpoint_name, plain_name
from schedtrain.retention import Policy, Saved, parse_keep, retained
from schedtrain.time import Timestamp
from schedtrain.triggers import Trigger, every

__all__ = ["MaxSaver", "MinSaver", "ModelSaver", "TopKSaver"]

_log = structlog.get_logger("schedtrain.callbacks")


def _save_folder(cb: Callback, folder: str | None, default: str) -> Path:
    """Where a saver writes: its ``folder``, else ``RUN_DIR/default``."""
    if folder is not None:
        return Path(folder)
    if cb.trainer.run_dir is None:
        kind = type(cb).__name__
        raise ValueError(f"callback {cb.name!r} ({kind}): the trainer has no run_dir; give "
                         f"Trainer(run_dir=...) or {kind}(folder=...)")
    return cb.trainer.run_dir / default


class ModelSaver(Callback):
    """Save a resumable checkpoint when fired (default: every epoch), keeping the last ``keep``.

    Files are ``RUN_DIR/checkpoints/step-00000120.pt`` (``--resume auto`` picks the newest
    valid one); a checkpoint of non-finite weights or loss is written as
    ``step-00000120-nonfinite.pt`` and never chosen to resume from. Under FSDP2 each
    is a directory, ``step-00000120.dcp``, that every rank writes its shard into.

    Args:
        keep: which checkpoints to keep: ``N`` (the newest N), a retention policy
            (``Latest``, ``Every``, ``Best``, ``AnyOf`` from ``schedtrain.retention``)
            or its TOML table (``{ any = [{ latest = 3 }, { every = "10000 steps" }] }``),
            ``None``: all. The newest finite one is always kept besides.
        folder: where to write them (default: ``RUN_DIR/checkpoints``).
    """

    may_stop_alone: ClassVar[bool] = False

    default_trigger: ClassVar[Trigger] = every("1 epoch")

    def __init__(self, keep: int | Policy | dict[str, Any] | None = 3,
                 folder: str | None = None) -> None:
        self.keep = parse_keep(keep)
        self.folder = folder
        self.needs = self.keep.monitors() if self.keep is not None else ()
        #: file name -> when it was saved and the monitored values then (for ``keep``)
        self._records: dict[str, Saved] = {}

    def _dir(self) -> Path:
        return _save_folder(self, self.folder, "checkpoints")

    def _setup(self) -> None:
        self._dir()  # fail at start, not at the first save

    def _trigger(self) -> None:
        # Every rank saves: each adds its generators and data position, the chief writes.
        path = self._dir() / checkpoint_name(self.now.step)
        # Recorded on every rank before the write, so the checkpoint holds its own record.
        if self.keep is not None:
            self._records[path.name] = Saved(path.name, self.now, True, self._values())
        self.trainer.save_checkpoint(path, on_saved=self._prune)

    def _values(self) -> dict[str, float]:
        """The monitored metrics put at this step (an older value measured older weights)."""
        out = {}
        for name in self.needs:
            got, put = self.metrics.latest(name), self.metrics.put_at(name)
            if got is not None and (put is None or put[0] == self.now.step):
                out[name] = got.value
        return out

    def _prune(self, written: Path) -> None:
        """Delete this run's checkpoints ``keep`` does not keep, sparing the newest finite
        one (on the chief)."""
        planned = written.name.replace("-nonfinite", "")
        if written.name != planned and planned in self._records:
            # renamed in place: a background save lands after the next one is recorded,
            # and the records (in every checkpoint) keep the order of the saves
            self._records = {
                (written.name if name == planned else name):
                    (attrs.evolve(saved, name=written.name, finite=False)
                     if name == planned else saved)
                for name, saved in self._records.items()}
        if self.keep is None or not self.is_chief:
            return
        folder = self._dir().resolve()
        mine = []
        for path in self.trainer.written_checkpoints():
            m = NAME_RE.fullmatch(path.name)
            if m is not None and path.resolve().parent == folder:
                mine.append((int(m[1]), m[2] is None, path))
        mine.sort(key=lambda x: (x[0], x[1]))
        saved = [self._records.get(p.name) or Saved(p.name, Timestamp(step=step), ok)
                 for step, ok, p in mine]
        keep = retained(self.keep, saved)
        for i, (_, _, path) in enumerate(mine):
            if i not in keep:
                self.trainer.delete_checkpoint(path)
                self._records.pop(path.name, None)

    def state_dict(self) -> dict[str, Any]:
        return {"records": [[s.name, s.at.step, s.at.batch, s.at.epoch, s.at.step_in_epoch,
                             s.at.sample, s.at.token, s.at.time_ns, s.finite, dict(s.values)]
                            for s in self._records.values()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Absent from checkpoints of 0.3 and before: pruning then knows steps alone.
        self._records = {}
        for name, *counters, finite, values in state.get("records", []):
            at = Timestamp.make(*(int(c) for c in counters))
            self._records[str(name)] = Saved(str(name), at, bool(finite),
                                             {str(k): float(v) for k, v in values.items()})


class _Ranking(Callback):
    """A saver that ranks the weights it saves by ``monitor``."""

    monitor: str
    _stale_logged = False

    def _fresh(self) -> bool:
        """Whether the newest value of ``monitor`` was put at this step, so it measures
        the weights a save now writes. One from an earlier step measured older weights:
        ranking these by it would keep them under another's score. The first stale
        firing is logged."""
        put = self.metrics.put_at(self.monitor)
        if put is None or put[0] == self.now.step:
            return True
        if not self._stale_logged:
            self._stale_logged = True
            _log.warning("stale_metric", callback=self.name, metric=self.monitor,
                         put_at_step=put[0], step=self.now.step,
                         note="not ranked: the weights changed since; fire it with what "
                              "produces the metric (schedtrain check warns)")
        return False


class _BestSaver(_Ranking):
    may_stop_alone: ClassVar[bool] = False
    mode = "min"
    default_trigger: ClassVar[Trigger] = every("1 epoch")

    def __init__(self, monitor: str = "val/loss", filename: str | None = None,
                 folder: str | None = None, load_best_at_end: bool = False) -> None:
        if not isinstance(load_best_at_end, bool):
            raise ValueError(f"`load_best_at_end` must be True or False, got "
                             f"{load_best_at_end!r}")
        self.monitor = monitor
        self.needs = (monitor,)
        self.filename = plain_name(filename or f"{self.mode}-{monitor.replace('/', '-')}.pt",
                                   "`filename`")
        self.folder = folder
        self.load_best_at_end = load_best_at_end
        self.best: float | None = None
        #: the step of the best checkpoint written (``None``: none yet)
        self.best_step: int | None = None

    def _trigger(self) -> None:
        got = self.metrics.latest(self.monitor)
        if got is None or math.isnan(got.value) or not self._fresh():
            return
        better = self.best is None or (got.value < self.best if self.mode == "min"
                                       else got.value > self.best)
        if not better:
            return
        self.best = got.value  # on every rank: they save together, the chief writes
        # Set now, so the checkpoint written at this event knows it is the best.
        earlier, self.best_step = self.best_step, self.now.step
        self.trainer.save_checkpoint(self._path(), on_saved=lambda p: self._saved(p, earlier))

    def _path(self) -> Path:
        return _save_folder(self, self.folder, "best") / self.filename

    def _saved(self, written: Path, earlier: int | None) -> None:
        """A ``-nonfinite`` file went beside the best one: the best to load is the earlier.
        Else, with ``export``, its weights also go beside it (``min-val-loss.safetensors``)."""
        if written.name != self.filename:
            self.best_step = earlier
            return
        self.trainer.export_checkpoint(written, written.with_suffix(".safetensors"))

    def _after_train(self) -> None:
        """With ``load_best_at_end``, once training finished or stopped: the best
        checkpoint's model (and optimizer) states go into the model."""
        if not self.load_best_at_end or self.trainer.outcome not in ("finished", "stopped"):
            return
        if self.best_step is None:
            _log.warning("no_best_checkpoint", callback=self.name, metric=self.monitor,
                         note="load_best_at_end: no best checkpoint was saved; the model "
                              "keeps its last weights")
            return
        path = self._path()
        self.trainer.load_weights(path)
        _log.info("best_checkpoint_loaded", callback=self.name, path=str(path),
                  step=self.best_step, metric=self.monitor, best=self.best)

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_step": self.best_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state["best"]
        step = state.get("best_step")  # absent from checkpoints of 0.2
        self.best_step = None if step is None else int(step)


class MinSaver(_BestSaver):
    """Save a checkpoint to ``RUN_DIR/best/`` whenever ``monitor`` reaches a new minimum.

    Only a value put at the firing's own step counts: one put earlier measured older
    weights. With ``load_best_at_end`` (pytorch-accelerated's ``SaveBestModelCallback``),
    once training finishes or stops (``EarlyStopping`` too) the best checkpoint's weights
    and optimizer state are loaded into the model, with a log line; a warning says so when
    no best was saved. A failed or preempted run keeps its weights.

    Args:
        monitor: the metric (default ``val/loss``).
        filename: default ``min-val-loss.pt``.
        folder: default ``RUN_DIR/best``.
        load_best_at_end: load the best weights when training ends.
    """

    may_stop_alone: ClassVar[bool] = False

    mode = "min"


class MaxSaver(_BestSaver):
    """Save a checkpoint to ``RUN_DIR/best/`` whenever ``monitor`` reaches a new maximum
    (``load_best_at_end`` as ``MinSaver``'s)."""

    may_stop_alone: ClassVar[bool] = False

    mode = "max"

    def __init__(self, monitor: str = "val/accuracy", filename: str | None = None,
                 folder: str | None = None, load_best_at_end: bool = False) -> None:
        super().__init__(monitor, filename, folder, load_best_at_end)


class TopKSaver(_Ranking):
    """Keep the ``save_top_k`` best checkpoints by ``monitor``, and the last one.

    Lightning's ``ModelCheckpoint(save_top_k, monitor, mode, save_last)``. When fired
    (default: every epoch) with a finite value of ``monitor`` better than the worst kept
    (or fewer than ``save_top_k`` kept), it writes ``FOLDER/val-loss-step-00000120.pt``
    and deletes the one that fell out; a tie keeps the earlier. A NaN or missing value,
    or a checkpoint of non-finite weights (``-nonfinite``), never displaces a kept one.
    Nor does a value put at an earlier step than the firing's: it measured older weights
    (``schedtrain check`` warns where that happens; fire it with the validation).
    With ``save_last`` every firing also writes ``FOLDER/last.pt``. Which files are the
    best is checkpointed state, so a resumed run keeps ranking the same files.

    Args:
        monitor: the metric (default ``val/loss``).
        mode: ``"min"`` or ``"max"``.
        save_top_k: how many best checkpoints to keep (0: none, only ``last.pt``).
        save_last: also write ``last.pt`` at every firing.
        folder: default ``RUN_DIR/best``.
    """

    may_stop_alone: ClassVar[bool] = False

    default_trigger: ClassVar[Trigger] = every("1 epoch")

    def __init__(self, monitor: str = "val/loss", mode: str = "min", save_top_k: int = 1,
                 save_last: bool = True, folder: str | None = None) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"`mode` must be 'min' or 'max', got {mode!r}")
        if isinstance(save_top_k, bool) or not isinstance(save_top_k, int) or save_top_k < 0:
            raise ValueError(f"`save_top_k` must be a whole number >= 0, got {save_top_k!r}")
        self.monitor, self.mode, self.save_top_k = monitor, mode, save_top_k
        self.save_last, self.folder = save_last, folder
        self.needs = (monitor,)
        self.stem = monitor.replace("/", "-")
        #: ``[value, step, file name]`` of the kept checkpoints, best first
        self.best: list[list[Any]] = []

    def _dir(self) -> Path:
        return _save_folder(self, self.folder, "best")

    def _setup(self) -> None:
        self._dir()

    def _key(self, value: float, step: int) -> tuple[float, int]:
        return (value if self.mode == "min" else -value, step)

    def _trigger(self) -> None:
        step = self.now.step
        got = self.metrics.latest(self.monitor)
        if self.save_last:
            self.trainer.save_checkpoint(self._dir() / "last.pt")
        if (got is None or not math.isfinite(got.value) or self.save_top_k == 0
                or not self._fresh()):
            return
        value = got.value
        if (len(self.best) >= self.save_top_k
                and self._key(value, step) >= self._key(*self.best[-1][:2])):
            return
        path = self._dir() / f"{self.stem}-step-{step:08d}.pt"
        # Ranked now, so every checkpoint written at this event holds the new ranking.
        entry = [value, step, path.name]
        ranked = sorted([*self.best, entry], key=lambda b: self._key(b[0], b[1]))
        self.best, dropped = ranked[:self.save_top_k], ranked[self.save_top_k:]
        self.trainer.save_checkpoint(path, on_saved=lambda p: self._saved(entry, dropped, p))

    def _saved(self, entry: list[Any], dropped: list[list[Any]], written: Path) -> None:
        """Delete the file the new one displaced; a ``-nonfinite`` one is unranked again."""
        if written.name.endswith("-nonfinite.pt"):
            kept = [b for b in self.best if b is not entry] + dropped
            self.best = sorted(kept, key=lambda b: self._key(b[0], b[1]))
            return
        for _, _, name in dropped:
            self.trainer.delete_checkpoint(self._dir() / name)

    def best_paths(self) -> list[Path]:
        """The kept checkpoints, best first."""
        return [self._dir() / name for _, _, name in self.best]

    def state_dict(self) -> dict[str, Any]:
        return {"best": [list(b) for b in self.best]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # The names come from a checkpoint: each must be a file in this saver's folder.
        self.best = [[float(v), int(s), plain_name(n, "a kept checkpoint's name")]
                     for v, s, n in state["best"]]
