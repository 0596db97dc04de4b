"""What the savers share: where they write, their own files' records, and pruning by a policy.

A saver records each checkpoint it asks for (``Saved``: name, clock, monitored values)
before the write, so the checkpoint holds its own record and a resumed run prunes as
the unbroken one would. Pruning (on the chief, once a write has landed, and once
more when a resumed run starts training) deletes the saver's own landed files that
``retention.retained`` does not keep: never another's, never the newest finite one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs

from schedtrain.callbacks.base import Callback
from schedtrain.logs import get_logger
from schedtrain.readback import PartStateError, printable
from schedtrain.retention import Policy, Saved, retained, saved_at, saved_row
from schedtrain.time import Timestamp

__all__ = ["Ranking", "Records", "save_folder", "save_time"]

_log = get_logger("schedtrain.callbacks")


def save_time(cb: Callback) -> Timestamp:
    """The clock of a save now, as its record keeps it (``retention.saved_at``)."""
    return saved_at(cb.now, between_epochs=not cb.trainer.clock.in_epoch)


def save_folder(cb: Callback, folder: str | None, default: str) -> Path:
    """Where a saver writes: its ``folder``, else ``RUN_DIR/default``."""
    if folder is not None:
        return Path(folder)
    if cb.trainer.run_dir is None:
        kind = type(cb).__name__
        raise ValueError(f"callback {cb.name!r} ({kind}): the trainer has no run_dir; give "
                         f"Trainer(run_dir=...) or {kind}(folder=...)")
    return cb.trainer.run_dir / default


class Records:
    """A saver's own checkpoints, in the order it saved them."""

    def __init__(self) -> None:
        #: file name -> when it was saved and the monitored values then
        self.by_name: dict[str, Saved] = {}
        #: read back from a checkpoint and not pruned since: a resumed saver prunes once
        #: before training goes on (the pruning of the save it resumed from may have
        #: been cut short by a kill after its commit, and ``keep`` may have changed)
        self.restored = False

    def add(self, saved: Saved) -> None:
        """Record a save (one at the same name again replaces it, as its file)."""
        self.by_name.pop(saved.name, None)
        self.by_name[saved.name] = saved

    def landed(self, written: Path) -> None:
        """A write landed as ``written``: a ``-nonfinite`` one is renamed in place (a
        background save lands after the next one is recorded, and the records, held in
        every checkpoint, keep the order of the saves)."""
        stem, suffix = written.stem, written.suffix
        planned = (stem.removesuffix("-nonfinite") + suffix) if stem.endswith("-nonfinite") \
            else written.name
        if written.name == planned or planned not in self.by_name:
            return
        self.by_name = {
            (written.name if name == planned else name):
                (attrs.evolve(saved, name=written.name, finite=False)
                 if name == planned else saved)
            for name, saved in self.by_name.items()}

    def prune(self, policy: Policy | None, existing: Iterable[Saved],
              delete: Callable[[str], object]) -> None:
        """Delete (``delete(name)``) those of ``existing`` (oldest first) ``policy`` does
        not keep, sparing the newest finite one, and forget those deleted."""
        self.restored = False
        if policy is None:
            return
        saved = list(existing)
        keep = retained(policy, saved)
        for i, s in enumerate(saved):
            # One the trainer refused (``False``: in no folder this process may delete
            # in yet) stays recorded, for a later pruning there.
            if i not in keep and delete(s.name) is not False:
                self.by_name.pop(s.name, None)

    def mine(self, folder: Path, written: Iterable[Path]) -> list[Saved]:
        """The recorded files of ``folder`` that have landed (of ``written``), in save order."""
        here = {p.name for p in written if p.resolve().parent == folder.resolve()}
        return [s for name, s in self.by_name.items() if name in here]

    def state(self) -> list[list[Any]]:
        """The records as plain values (a checkpoint's callback state)."""
        return [[s.name, s.at.step, s.at.batch, s.at.epoch, s.at.step_in_epoch, s.at.sample,
                 s.at.token, s.at.time_ns, s.finite, dict(s.values)]
                for s in self.by_name.values()]

    def load(self, rows: Iterable[Any], check: Callable[[str], str] = str) -> None:
        """Restore ``state()``'s rows (``check`` vets each name read from a checkpoint)."""
        self.by_name, self.restored = {}, True
        for i, row in enumerate(rows):
            try:
                saved = saved_row(row)
            except (TypeError, ValueError):  # named by its index, never echoed raw
                raise PartStateError(f"records[{i}]", (
                    "expected a saver's record [name, 7 counters, finite, values], found "
                    f"{printable(repr(row))[:60]}")) from None
            try:
                name = check(saved.name)
            except ValueError as exc:
                raise PartStateError(f"records[{i}][0]", printable(str(exc))) from None
            self.add(attrs.evolve(saved, name=name))


class Ranking(Callback):
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
