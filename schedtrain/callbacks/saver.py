"""``ModelSaver`` (the last N checkpoints) and ``MinSaver``/``MaxSaver`` (the best by a metric).

Checkpoints are written atomically, with a checksum, once every callback firing at the
current event has run, so each is resumable (see docs/checkpoints.md). A saver's ``keep``
prunes only checkpoints it wrote, and never the newest one whose weights and loss are
finite: a run that diverges keeps a good checkpoint to go back to. ``TopKSaver`` lives
in ``schedtrain.callbacks.topk`` (importable from here too).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

from schedtrain.callbacks.autosave import AutoPacing, logged_decisions
from schedtrain.callbacks.base import Callback
from schedtrain.callbacks.retaining import Ranking, Records, save_folder, save_time
from schedtrain.callbacks.topk import TopKSaver
from schedtrain.checkpoints.files import NAME_RE, checkpoint_name, plain_name
from schedtrain.logs import get_logger
from schedtrain.retention import Policy, Saved, parse_keep, saver_keep
from schedtrain.time import Timestamp
from schedtrain.triggers import Trigger, every

__all__ = ["MaxSaver", "MinSaver", "ModelSaver", "TopKSaver"]

_log = get_logger("schedtrain.callbacks")


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
    #: It feeds an ``every("auto")`` trigger the cost of each save (binding checks).
    measures_its_saves: ClassVar[bool] = True

    default_trigger: ClassVar[Trigger] = every("1 epoch")

    def __init__(self, keep: int | Policy | dict[str, Any] | None = 3,
                 folder: str | None = None) -> None:
        self.keep = parse_keep(keep)
        self.folder = folder
        self.needs = self.keep.monitors() if self.keep is not None else ()
        self._records = Records()  # what ``keep`` reads of each save
        self._pacing: AutoPacing | None = None  # with every("auto"): its measurements
        self._replay: list[tuple[int, float, float]] = []  # decisions read from the log

    def _dir(self) -> Path:
        return save_folder(self, self.folder, "checkpoints")

    def _setup(self) -> None:
        self._dir()  # fail at start, not at the first save
        self._pacing = AutoPacing.of(self)
        if self._pacing is not None and self._pacing.at_firing:
            # Decided inside the firing on several ranks: reduced (alike) before the log.
            name = self.name or "ModelSaver"
            self.produces = tuple(f"{name}/{k}" for k in ("interval", "save_cost", "step_time"))
        replayed, self._replay = self._replay, []
        if self._pacing is not None:  # the killed run's decisions after the checkpoint
            for decision in self._pacing.replay(replayed):
                self._put(decision)

    def _before_train(self) -> None:
        if self._records.restored:  # resumed: the pruning a kill cut short, by today's keep
            self._prune_files()
        if self._pacing is not None:
            self._pacing.started(self.now.step)

    def _trigger(self) -> None:
        # Every rank saves: each adds its generators and data position, the chief writes.
        path = self._dir() / checkpoint_name(self.now.step)
        # Recorded on every rank before the write, so the checkpoint holds its own record.
        if self.keep is not None:
            self._records.add(Saved(path.name, save_time(self), True, _values(self, self.needs)))
        if self._pacing is not None:
            for decision in self._pacing.fired(self.now.step):
                self._put(decision)
        self.trainer.save_checkpoint(path, on_saved=self._landed)

    def _landed(self, written: Path) -> None:
        """The save is committed: with every("auto") its cost decides the interval."""
        if self._pacing is not None:
            for decision in self._pacing.landed(self.now.step):
                self._put(decision)
        self._prune(written)

    def _put(self, decision: dict[str, Any]) -> None:
        """A decision of every("auto"), as three lines of ``events.jsonl``."""
        name = self.name or "ModelSaver"
        self.metrics.put(f"{name}/interval", decision["interval"])
        self.metrics.put(f"{name}/save_cost", decision["cost_s"])
        self.metrics.put(f"{name}/step_time", decision["step_s"])

    def _prune(self, written: Path) -> None:
        self._records.landed(written)
        self._prune_files()

    def _prune_files(self) -> None:
        """Delete this run's checkpoints ``keep`` does not keep, sparing the newest finite
        one (on the chief)."""
        if self.keep is None or not self.is_chief:
            self._records.restored = False
            return
        folder = self._dir().resolve()
        mine = []
        for path in self.trainer.written_checkpoints():
            m = NAME_RE.fullmatch(path.name)
            if m is not None and path.resolve().parent == folder:
                mine.append((int(m[1]), m[2] is None, path))
        mine.sort(key=lambda x: (x[0], x[1]))
        records = self._records.by_name
        # A file without a record (the trainer's own preemption checkpoint, or one of an
        # earlier version) is placed by its step alone. A reset trigger keeps the
        # records (``load_records``), so the saver's own files keep their whole clock.
        saved = [records.get(p.name) or Saved(p.name, Timestamp(step=step), ok)
                 for step, ok, p in mine]
        self._records.prune(self.keep, saved,
                            lambda name: self.trainer.delete_checkpoint(folder / name))

    def state_dict(self) -> dict[str, Any]:
        return {"records": self._records.state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load_records(state)

    def read_log(self, events: Path) -> None:
        """On a resume, before ``events.jsonl`` is cut back to the checkpoint: with
        every("auto"), the decisions logged (the one its own save made comes after it)."""
        if self.name is not None:
            self._replay = logged_decisions(events, self.name)

    def load_records(self, state: dict[str, Any]) -> None:
        # Absent from checkpoints of 0.3 and before: pruning then knows steps alone.
        self._records.load(state.get("records", []))


def _values(cb: Callback, names: tuple[str, ...]) -> dict[str, float]:
    """The monitored metrics put at this step (an older value measured older weights)."""
    out = {}
    for name in names:
        got, put = cb.metrics.latest(name), cb.metrics.put_at(name)
        if got is not None and (put is None or put[0] == cb.now.step):
            out[name] = got.value
    return out


class _BestSaver(Ranking):
    may_stop_alone: ClassVar[bool] = False
    mode = "min"
    default_trigger: ClassVar[Trigger] = every("1 epoch")

    def __init__(self, monitor: str = "val/loss", filename: str | None = None,
                 folder: str | None = None, load_best_at_end: bool = False,
                 keep: int | Policy | dict[str, Any] | None = None) -> None:
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
        #: the history of new bests (``min-val-loss-step-00000120.pt``) and what keeps it
        self.keep = saver_keep("MinSaver" if self.mode == "min" else "MaxSaver", keep)
        self._records = Records()

    def history_name(self, step: int) -> str:
        """The history file of the new best at ``step``: ``min-val-loss-step-00000120.pt``."""
        return f"{Path(self.filename).stem}-step-{step:08d}.pt"

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
        if self.keep is not None:
            path = self._path().with_name(self.history_name(self.now.step))
            self._records.add(Saved(path.name, save_time(self), True, {self.monitor: got.value}))
            self.trainer.save_checkpoint(path, on_saved=self._prune)

    def _before_train(self) -> None:
        if self._records.restored:  # resumed: the pruning a kill cut short, by today's keep
            self._prune_files()

    def _prune(self, written: Path) -> None:
        self._records.landed(written)
        self._prune_files()

    def _prune_files(self) -> None:
        """Delete the history files ``keep`` does not keep (on the chief)."""
        if not self.is_chief:
            self._records.restored = False
            return
        folder = self._path().parent
        mine = self._records.mine(folder, self.trainer.written_checkpoints())
        self._records.prune(self.keep, mine,
                            lambda name: self.trainer.delete_checkpoint(folder / name))

    def _path(self) -> Path:
        return save_folder(self, self.folder, "best") / self.filename

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
        return {"best": self.best, "best_step": self.best_step,
                "records": self._records.state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state["best"]
        self.load_records(state)
        step = state.get("best_step")  # absent from checkpoints of 0.2
        self.best_step = None if step is None else int(step)

    def load_records(self, state: dict[str, Any]) -> None:
        self._records.load(state.get("records", []), lambda n: plain_name(n, "a history file"))


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
        keep: also keep a history of the new bests, each its own file
            (``min-val-loss-step-00000120.pt``), pruned by this policy: ``N`` (the newest
            N), ``{ latest = N }``, ``{ every = "1000 steps" }`` or ``any`` of them (not
            ``best``: each is a new best). ``None`` (default): only the one best file.
    """

    may_stop_alone: ClassVar[bool] = False

    mode = "min"


class MaxSaver(_BestSaver):
    """Save a checkpoint to ``RUN_DIR/best/`` whenever ``monitor`` reaches a new maximum
    (``load_best_at_end`` and ``keep`` as ``MinSaver``'s)."""

    may_stop_alone: ClassVar[bool] = False

    mode = "max"

    def __init__(self, monitor: str = "val/accuracy", filename: str | None = None,
                 folder: str | None = None, load_best_at_end: bool = False,
                 keep: int | Policy | dict[str, Any] | None = None) -> None:
        super().__init__(monitor, filename, folder, load_best_at_end, keep)
