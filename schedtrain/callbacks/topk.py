"""``TopKSaver``: the best k checkpoints by a metric (a ``best`` retention rule), and the last."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

from schedtrain.callbacks.retaining import Ranking, Records, save_folder, save_time
from schedtrain.checkpoints.files import plain_name
from schedtrain.retention import AnyOf, Best, Policy, Saved, saver_keep
from schedtrain.time import Timestamp
from schedtrain.triggers import Trigger, every

__all__ = ["TopKSaver"]


class TopKSaver(Ranking):
    """Keep the ``save_top_k`` best checkpoints by ``monitor``, and the last one.

    Lightning's ``ModelCheckpoint(save_top_k, monitor, mode, save_last)``. When fired
    (default: every epoch) with a finite value of ``monitor`` better than the worst kept
    (or fewer than ``save_top_k`` kept), it writes ``FOLDER/val-loss-step-00000120.pt``
    and deletes the one that fell out; a tie keeps the earlier. A NaN or missing value,
    or a checkpoint of non-finite weights (``-nonfinite``, left beside), never displaces
    a kept one. Nor does a value put at an earlier step than the firing's: it measured
    older weights (``schedtrain check`` warns where that happens; fire it with the
    validation). With ``save_last`` every firing also writes ``FOLDER/last.pt``. Which
    files are the best is checkpointed state, so a resumed run keeps ranking the same.

    ``save_top_k = k`` is the retention rule ``keep = { best = k }``; ``keep`` takes the
    schedule's other rules beside a ``best`` one (``{ any = [{ best = 3 }, { every =
    "10000 steps" }] }``): a firing writes a file when a rule would keep it, and files no
    rule keeps are deleted (never the newest finite one).

    Args:
        monitor: the metric (default ``val/loss``).
        mode: ``"min"`` or ``"max"``.
        save_top_k: how many best checkpoints to keep (0: none, only ``last.pt``;
            default 1).
        save_last: also write ``last.pt`` at every firing.
        folder: default ``RUN_DIR/best``.
        keep: instead of ``save_top_k``, a retention policy with a ``best`` rule
            (its ``monitor`` and ``mode`` are the saver's).
    """

    may_stop_alone: ClassVar[bool] = False

    default_trigger: ClassVar[Trigger] = every("1 epoch")

    def __init__(self, monitor: str = "val/loss", mode: str = "min",
                 save_top_k: int | None = None, save_last: bool = True,
                 folder: str | None = None, *,
                 keep: Policy | dict[str, Any] | None = None) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"`mode` must be 'min' or 'max', got {mode!r}")
        if keep is not None and save_top_k is not None:
            raise ValueError("give `save_top_k` or `keep`, not both (save_top_k = k is "
                             "keep = { best = k })")
        k = 1 if save_top_k is None else save_top_k
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"`save_top_k` must be a whole number >= 0, got {save_top_k!r}")
        self.keep: Policy | None = (saver_keep("TopKSaver", keep, monitor, mode)
                                    if keep is not None
                                    else Best(k, monitor, mode) if k else None)  # type: ignore[arg-type]
        self.monitor, self.mode = monitor, mode
        self.save_top_k = sum(r.n for r in _bests(self.keep))
        self.save_last, self.folder = save_last, folder
        self.needs = (monitor,)
        self.stem = monitor.replace("/", "-")
        self._records = Records()

    def _dir(self) -> Path:
        return save_folder(self, self.folder, "best")

    def _setup(self) -> None:
        self._dir()

    def _key(self, value: float, step: int) -> tuple[float, int]:
        return (value if self.mode == "min" else -value, step)

    def _trigger(self) -> None:
        got = self.metrics.latest(self.monitor)
        if self.save_last:
            self.trainer.save_checkpoint(self._dir() / "last.pt")
        if self.keep is None:
            return
        ranked = got is not None and math.isfinite(got.value) and self._fresh()
        path = self._dir() / f"{self.stem}-step-{self.now.step:08d}.pt"
        new = Saved(path.name, save_time(self), True,
                    {self.monitor: got.value} if ranked and got is not None else {})
        saved = [s for s in self._records.by_name.values() if s.name != path.name] + [new]
        if len(saved) - 1 not in self.keep.keeps(saved):
            return  # no rule would keep it: not written
        # Recorded now, so every checkpoint written at this event holds the new ranking.
        self._records.add(new)
        self.trainer.save_checkpoint(path, on_saved=self._saved)

    def _saved(self, written: Path) -> None:
        """Delete the files no rule keeps now; a ``-nonfinite`` one stays beside, unranked."""
        self._records.landed(written)
        if written.stem.endswith("-nonfinite"):
            self._records.by_name.pop(written.name, None)
        self._prune_files()

    def _before_train(self) -> None:
        if self._records.restored:  # resumed: the pruning a kill cut short, by today's keep
            self._prune_files()

    def _prune_files(self) -> None:
        """Delete this saver's files no rule keeps (on the chief)."""
        if not self.is_chief:
            self._records.restored = False
            return
        folder = self._dir()
        mine = self._records.mine(folder, self.trainer.written_checkpoints())
        self._records.prune(self.keep, mine,
                            lambda name: self.trainer.delete_checkpoint(folder / name))

    @property
    def best(self) -> list[list[Any]]:
        """``[value, step, file name]`` of the checkpoints the ``best`` rules keep, best first."""
        saved = list(self._records.by_name.values())
        kept = set().union(*(r.keeps(saved) for r in _bests(self.keep)))
        rows = [[saved[i].values[self.monitor], saved[i].at.step, saved[i].name] for i in kept]
        return sorted(rows, key=lambda b: self._key(b[0], b[1]))

    def best_paths(self) -> list[Path]:
        """The kept best checkpoints, best first."""
        return [self._dir() / name for _, _, name in self.best]

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "records": self._records.state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # The names come from a checkpoint: each must be a file in this saver's folder.
        def check(name: str) -> str:
            return plain_name(name, "a kept checkpoint's name")
        for _, _, name in state.get("best", []):
            check(str(name))  # refused even where the records below are what is used
        if "records" in state:
            self._records.load(state["records"], check)
            return
        self._records = Records()  # an older checkpoint: the ranked files alone
        self._records.restored = True
        for v, s, n in sorted(state["best"], key=lambda b: int(b[1])):
            self._records.add(Saved(check(n), Timestamp(step=int(s)), True,
                                    {self.monitor: float(v)}))


    def load_records(self, state: dict[str, Any]) -> None:
        # Its state is the record of its ranked files: all of it stays across a reset.
        self.load_state_dict(state)


def _bests(policy: Policy | None) -> tuple[Best, ...]:
    rules = policy.rules if isinstance(policy, AnyOf) else (policy,)
    return tuple(r for r in rules if isinstance(r, Best))
