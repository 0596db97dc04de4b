"""``RunState``: what a checkpoint holds of the run besides its weights, and putting it back.

The checkpoint's keys (documented in docs/checkpoints.md)::

    format        "schedtrain-checkpoint-2"
    phase         the event it was taken after ("step_end", "epoch_end", "preempt"...)
    step, epoch   the clock then
    finite        whether the weights and the last loss were all finite
    model         model.state_dict(): load it alone with torch.load(..., weights_only=True)
    optimizer     optimizer.state_dict()
    scaler        the fp16 GradScaler's state, or None
    run           everything else a resumed run needs (``RunState.capture``): clock, trigger
                  table, callbacks, metrics, losses, random generators, data position, the
                  epoch in progress, events.jsonl's length, why the run stopped (or None),
                  the checkpoints this run wrote (``written``) and each one's size and
                  digest (``owned``), those a preemption wrote of its own
                  (``preempted``), the run's schedule as canonical TOML
                  (``schedule``; ``None``: a trigger without a TOML form)
    checksum      {"algorithm": "blake2b-256", "digest": ...} of all the above

The files themselves are written and read by ``schedtrain.checkpoints``; this module
holds no file.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from schedtrain.callbacks.base import Callback
from schedtrain.checkpoints.format import UnfitCheckpoint
from schedtrain.checkpoints.rng import rng_state, set_rng_state
from schedtrain.clock import LoopClock
from schedtrain.monitors.jsonl import JsonlWriter
from schedtrain.monitors.store import MetricStore
from schedtrain.readback import DamagedFile
from schedtrain.schedule.table import TriggerTable
from schedtrain.training.control.schedule_change import ScheduleChange
from schedtrain.training.data_position import DataPosition, EpochFlag
from schedtrain.training.log_offset import check_offset
from schedtrain.training.losses import LossKeeper
from schedtrain.training.run_records import check_run
from schedtrain.training.trial import missing_key, refusals, run_trials, try_states
from schedtrain.urls import is_url

__all__ = ["RunState"]


def _names(names: set[str]) -> str:
    """Callback names for a one-line message: the first few of many."""
    shown = sorted(names)
    more = f" and {len(shown) - 6:,} more" if len(shown) > 6 else ""
    return f"{shown[:6]}{more}"


def _present(exists: Callable[[list[Path]], list[Path]], callbacks: Mapping[str, Callback],
             run_dir: Path | None, name: str, names: list[str]) -> set[str]:
    """Which of saver ``name``'s files are there now (in its folder, wherever that is)."""
    folder = getattr(callbacks[name], "folder", None)
    where = Path(folder) if folder is not None else (
        run_dir / "checkpoints" if run_dir is not None else None)
    if where is None:
        return set(names)
    return {p.name for p in exists([where / n for n in names])}


class RunState:
    """The run's parts a checkpoint captures, held by reference (a ``RunParts``).

    Args:
        model, optimizer, scaler, clock, table, callbacks, metrics, losses, position: the
            run's parts.
        epoch: whether an epoch is in progress (the loop's flag, read at save time).
        events: the ``events.jsonl`` writer, or ``None`` without a run directory.
        change: the run's schedule and the rule for a resume with another one (default:
            no stored schedule).
        replay: what a resume replays besides the checkpoint, given its ``run`` before
            it is checked (run control's ``replay``: retimes, then interval decisions).
        run_dir: the run directory, where a saver without a folder of its own keeps its
            files (``None``: none).
    """

    def __init__(self, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scaler: Any, clock: LoopClock, table: TriggerTable,
                 callbacks: Mapping[str, Callback], metrics: MetricStore, losses: LossKeeper,
                 data: DataPosition, epoch: EpochFlag,
                 events: JsonlWriter | None, change: ScheduleChange | None = None,
                 replay: Callable[[Mapping[str, Any]], None] | None = None,
                 run_dir: Path | None = None) -> None:
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.clock, self.table, self.callbacks = clock, table, callbacks
        self.metrics, self.losses, self.data = metrics, losses, data
        self.epoch, self.events = epoch, events
        self.events_offset: int | None = None
        #: a checkpoint's callback states its callbacks refused, by key path (``validate``),
        #: judged once the schedule change's rules say which are kept (``check``)
        self._untrusted: dict[str, str] = {}
        #: why the run stopped (``StopTraining``), once it has: a checkpoint taken at its
        #: ``train_end`` then resumes to that stop instead of training on
        self.stopped: str | None = None
        #: the run's schedule (canonical TOML, stored in every checkpoint) and what a
        #: resume does when the checkpoint's differs
        self.change = change if change is not None else ScheduleChange(None)
        self.replay, self.run_dir = replay, run_dir

    def position(self) -> tuple[int, int]:
        """The clock's ``(step, epoch)`` now."""
        return self.clock.step, self.clock.epoch

    def last_loss(self) -> torch.Tensor | None:
        """The last optimizer step's loss."""
        return self.losses.last

    def data_state(self) -> Any:
        """This rank's position in the data."""
        return self.data.state_dict()

    def capture(self) -> dict[str, Any]:
        """The checkpoint's ``run`` key now (the checkpoint owner adds ``written``)."""
        return {
            "clock": self.clock.state_dict(),
            "table": self.table.state_dict(),
            "callbacks": {n: cb.state_dict() for n, cb in self.callbacks.items()},
            "metrics": self.metrics.state_dict(),  # with the values not yet written
            "losses": self.losses.state_dict(),
            "rng": rng_state(),
            "data": self.data.state_dict(),
            "epoch_open": self.epoch.open,
            "events_offset": self.events.position() if self.events is not None else None,
            "stopped": self.stopped,
            "schedule": self.change.text,
        }

    def check(self, path: Path | str, run: dict[str, Any],
              exists: Callable[[list[Path]], list[Path]] | None = None) -> None:
        """Refuse a checkpoint saved with another schedule (``ScheduleChanged``) unless
        told to apply it, or, its schedule unknown, with other callbacks (``ValueError``).
        ``exists``: which of these files the checkpoint storage holds (a changed
        schedule's diff says what ``keep`` would delete of them)."""
        if self.replay is not None:
            self.replay(run)
        present = (functools.partial(_present, exists, self.callbacks, self.run_dir)
                   if exists is not None else None)
        self.change.check(path, run, present)
        for name in self.change.kept(run["callbacks"]):
            why = self._untrusted.get(f"run.callbacks.{name}")
            if why is not None:
                raise DamagedFile(path, f"run.callbacks.{name}", why)
        if self.change.carried is not None:
            return
        saved = set(run["callbacks"])
        if saved != set(self.callbacks):
            raise UnfitCheckpoint(path, f"was saved with callbacks {_names(saved)}, this "
                                        f"trainer has {_names(set(self.callbacks))}")

    def validate(self, path: Path | str, run: dict[str, Any]) -> None:
        """Refuse (``DamagedFile``, by key path) a ``run`` a resume cannot trust: checked
        before anything is restored (``run_records``)."""
        record = check_run(run, path, self.data, self.metrics.history_limit)
        if self.events is not None and record.events_offset is not None and (
                is_url(str(path)) or self.events.path.parent.resolve()
                in Path(path).resolve().parents):  # its own log, not another run's
            check_offset(self.events.path, record.events_offset, record.clock.now.step, path)
        same = run.get("schedule") == self.change.text  # else the change's rules decide
        table = run.get("table")
        if same and self.change.text is not None and isinstance(table, dict):
            gap = missing_key(self.table.state_dict()["triggers"], table.get("triggers"))
            if gap is not None:  # a trigger would start afresh: another schedule silently
                raise DamagedFile(path, f"run.table.triggers{gap}", (
                    "missing: expected the state of each stateful trigger of its schedule"))
        saved = run.get("callbacks")
        if same and self.change.text is not None and isinstance(saved, dict) \
                and set(saved) != set(self.callbacks):
            missing = sorted(set(self.callbacks) - set(saved))[:3]
            raise DamagedFile(path, "run.callbacks", (
                f"expected a state for each callback of its schedule, found {len(saved)} "
                f"for {len(self.callbacks)} (missing {missing})"))
        try_states(run_trials(
            run, {"clock": self.clock, "metrics": self.metrics, "losses": self.losses,
                  **({"table": self.table} if same else {})},
            self.callbacks if same else {}), path)
        # Another schedule: the change's rules (``check``) say which callbacks keep their
        # state; those are refused there if they cannot take it.
        self._untrusted = {} if same else dict(refusals(run_trials({"callbacks": saved}, {},
                                                                   self.callbacks)))

    def restore(self, run: dict[str, Any], rng: Any, data: Any) -> None:
        """Put ``run`` back, with this rank's generators ``rng`` and data position."""
        self.clock.load_state_dict(run["clock"])
        self.metrics.load_state_dict(run["metrics"])
        kept = self.change.kept  # a changed schedule: the rules say whose state stays
        self.table.load_state_dict({**run["table"],
                                    "triggers": kept(run["table"].get("triggers", {}))})
        for name, cb_state in kept(run["callbacks"]).items():
            self.callbacks[name].load_state_dict(cb_state)
        if self.change.carried is not None:  # a reset saver still knows its files
            for name in self.change.carried.reset:
                self.callbacks[name].load_records(run["callbacks"][name])
        set_rng_state(rng)
        if "note" in data:  # resumed inside an epoch on another number of processes
            data = dict(data)
            self.change.notes.append(data.pop("note"))
        self.data.load_state_dict(data)
        self.losses.load_state_dict(run["losses"])
        #: where ``events.jsonl`` is cut back to once the run directory is this run's
        #: (never before: another process may be using it)
        self.events_offset = run["events_offset"]
        self.stopped = run.get("stopped")  # absent from checkpoints of earlier versions
