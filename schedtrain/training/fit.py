"""A run's lifecycle: one explicit stage, and ``fit`` from opening the run directory to
recording how the run ended.

``fit`` opens the run directory, sets callbacks up, fires ``sanity_eval`` (a fresh run with
``sanity_eval_batches``) and ``train_start``, runs the loop, and ends as the run ended
(finished, stopped, preempted, failed), recording it in ``run.json``. The stages::

    NEW ──┬─ resume() ─→ RESUMED ─┐
          └─ start_over() ─→ STARTING_OVER ─┤
                                 fit(): OPENED → SET_UP → FITTING → ENDED ─ fit() again ─┐
                                                          ↑──────────────────────────────┘
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from schedtrain.checkpoints.rng import preserved_rng
from schedtrain.distributed.agreement import PreemptRequested
from schedtrain.distributed.comm import reraise_on_all
from schedtrain.errors import (
    Preempted,
    RunDirError,
    ScheduleWarning,
    StopTraining,
    failure_place,
    locate_failure,
)
from schedtrain.logs import get_logger, is_configured
from schedtrain.spec.run import RunConfig
from schedtrain.training.parts import Parts
from schedtrain.training.run_dir import RunDirectory
from schedtrain.training.stage import OWNS_DIRECTORY, Stage, Stopped

__all__ = ["Lifecycle", "Stage"]

_log = get_logger("schedtrain.training")


class Lifecycle:
    """The stage of one run, and what moves it on (``Trainer`` delegates here).

    Args:
        parts: the run's parts.
        config: its checked options.
        trainer: what callbacks' ``setup`` receives.
    """

    def __init__(self, parts: Parts, config: RunConfig, trainer: Any) -> None:
        self.parts, self.config, self.trainer = parts, config, trainer
        self.stage = Stage.NEW
        #: the event the loaded checkpoint was taken after, until fit continues it
        self.checkpoint_phase: str | None = None
        self.checkpoint_step: int | None = None
        #: how the last fit stopped early (``None``: it did not)
        self.stopped: Stopped | None = None
        #: how the run is ending, for ``after_train``: finished/stopped/failed/preempted
        self.outcome: str | None = None

    # -- before fit ----------------------------------------------------------------------------
    def resume_newest(self) -> Path | str | None:
        """``--resume auto``: restore the newest valid checkpoint of
        ``RUN_DIR/checkpoints`` (where ``checkpoint_dir`` really keeps it; each one passed
        over is logged), read once; without one, start over. Returns the checkpoint's
        path or URL (``None``: started over)."""
        run_dir, checkpoints = self.config.run_path, self.parts.checkpoints
        if run_dir is None:
            raise ValueError("resume('auto') looks in RUN_DIR/checkpoints: give "
                             "Trainer(run_dir=...)")
        shown = checkpoints.mount.shown
        found = checkpoints.mount.pick_to_resume(
            run_dir / "checkpoints", self.parts.comm, lambda p, why: _log.warning(
                "checkpoint_skipped", checkpoint=shown(p), reason=why), checkpoints.validate)
        if found is None:
            self.start_over()
            return None
        self.resume(*found)
        return found[0] if checkpoints.mount.stored(found[0]) is None else shown(found[0])

    def resume(self, path: Path, state: dict[str, Any] | None = None) -> None:
        """Restore a checkpoint (checked against its checksum); ``fit`` then continues it.
        ``state``: its content, already read and checked.

        The run directory is locked first, and an object-store folder claimed: one another
        run uses is refused (``RunDirError``) before anything is read or changed."""
        directory, mount = self.parts.directory, self.parts.checkpoints.mount
        if directory is not None:
            directory.acquire()
        try:
            mount.claim()
            state = self.parts.checkpoints.read(path, state)
        except (ValueError, RunDirError):  # another run, schedule or callbacks: all stays
            mount.close()
            if directory is not None:
                directory.release()
            raise
        change = self.parts.run_state.change
        if self.parts.comm is None or self.parts.comm.is_chief:  # the chief says it once
            for note in change.notes:
                warnings.warn(note, ScheduleWarning, stacklevel=3)
        change.notes.clear()
        self.checkpoint_step = int(state["step"])
        flag = self.parts.epoch
        flag.resume_inside = flag.open = bool(state["run"]["epoch_open"])
        self.checkpoint_phase = state["phase"]
        if self.stage in (Stage.NEW, Stage.STARTING_OVER):
            self.stage = Stage.RESUMED

    def start_over(self) -> None:
        """Fit from the start in a run directory that holds a run with nothing valid to
        resume: its files stay, its ``events.jsonl`` starts anew."""
        if self.stage is Stage.NEW:  # run control replays its retimes from the start
            self.stage = Stage.STARTING_OVER
            self.parts.control.start_over()

    def save(self, path: Path, on_saved: Callable[[Path], None] | None) -> None:
        """During ``fit``, once the current event is over; otherwise now."""
        checkpoints = self.parts.checkpoints
        if self.stage is Stage.FITTING:
            checkpoints.request(path, on_saved)
            return
        checkpoints.write(path, "manual", on_saved)
        checkpoints.wait()  # outside fit nothing collects it later

    # -- the run directory ---------------------------------------------------------------------
    def _open_directory(self) -> None:
        failed: RunDirError | None = None
        try:
            self._open_own_directory()
        except RunDirError as exc:
            failed = exc
        comm = self.parts.comm
        if comm is not None:  # the chief's answer is every rank's
            failed = reraise_on_all(comm, failed)
        if failed is not None:
            raise failed

    def _open_storage(self, directory: RunDirectory) -> None:
        """A ``checkpoint_dir`` elsewhere is claimed (its lease), emptied by ``--overwrite``,
        cleaned of its interrupted writes, refused to a fresh run holding checkpoints."""
        checkpoints, fresh = self.parts.checkpoints, self.stage is Stage.NEW
        try:
            checkpoints.mount.claim()  # before anything there is cleaned or emptied
            if fresh and self.config.overwrite:
                checkpoints.mount.clear()
            checkpoints.mount.open(fresh=fresh and not self.config.overwrite)
        except BaseException:
            checkpoints.mount.close()
            directory.release()
            raise

    def _open_own_directory(self) -> None:
        directory, config = self.parts.directory, self.config
        if self.stage in (Stage.NEW, Stage.RESUMED, Stage.STARTING_OVER):
            resumed = self.stage is Stage.RESUMED
            if directory is not None:
                directory.open_for_run(
                    fresh=self.stage is Stage.NEW, overwrite=config.overwrite,
                    ends_at=None if self.stage is Stage.NEW else (
                        config.max_epochs, config.max_steps),
                    resumed_step=self.checkpoint_step, on_ended=self._complete_log,
                    starting_over=self.stage is Stage.STARTING_OVER)
                self._open_storage(directory)
                self._cut_events(resumed)
            self.stage = Stage.OPENED
        elif directory is not None:  # a second fit() of this trainer continues its run
            directory.acquire()
            if self.checkpoint_phase is not None:  # resumed again in between
                self._cut_events(resumed=True)

    def _cut_events(self, resumed: bool) -> None:
        """``events.jsonl`` as the run now continues it: empty for a fresh run, cut back
        to the resumed checkpoint's length (only now that the directory is this run's)."""
        events = self.parts.events
        if events is None:
            return
        if not resumed:
            events.truncate(0)
            return
        offset = self.parts.run_state.events_offset
        if offset is not None:  # read by the resume's journal (``control.journal``) first
            events.truncate(int(offset))
        change = self.parts.run_state.change
        if change.record is not None:  # the rules applied, for the log's reader
            events.record(change.record)
            change.record = None

    def _complete_log(self) -> None:
        """A run that ended, resumed from its last checkpoint: write the values that
        checkpoint holds unwritten when ``events.jsonl`` stops exactly where it was
        taken (they were lost with the process that took it)."""
        events, offset = self.parts.events, self.parts.run_state.events_offset
        if (events is not None and offset is not None and self.checkpoint_phase
                == "train_end" and events.position() == offset):
            self.parts.metrics.flush()

    def _record(self, status: str) -> None:
        directory = self.parts.directory
        if directory is not None and self.stage in OWNS_DIRECTORY:
            ts, parts = self.parts.clock.now(), self.parts
            directory.record(status, step=ts.step, epoch=ts.epoch, schedule=parts.run_state
                             .change.text, batch_events=list(parts.control.retimer.fires))

    # -- fit -----------------------------------------------------------------------------------
    def fit(self) -> None:
        """Train until ``max_epochs``/``max_steps``, a stop, a signal or an exception."""
        resumed = self.checkpoint_phase is not None  # a checkpoint's run goes on
        fresh, over = self.stage is Stage.NEW, self.stage is Stage.STARTING_OVER
        self._open_directory()
        # Run control (signals, notices, retimes, the deadline) from the directory's
        # opening, before run.json says "running" (a retime request may come then).
        with self.parts.control.open(fresh=fresh, resumed=not (fresh or over)):
            self._fit(resumed)

    def _fit(self, resumed: bool) -> None:
        parts = self.parts
        self._record("running")
        self.outcome = None
        try:
            self._setup()
        except BaseException as exc:
            self._failed(exc)
            raise
        parts.table.attach(parts.clock, parts.metrics, parts.predicates)
        parts.model.train()
        # Unconfigured structlog prints every debug line: log firings only when an
        # application (the CLI) has configured it.
        parts.dispatch.log_firings = parts.checkpoints.log = is_configured()
        parts.dispatch.stop_reason = None
        # A checkpoint taken as training stopped, or after train_end with no more
        # training asked for, resumes to that end.
        phase, self.checkpoint_phase = self.checkpoint_phase, None
        ended = self._ended_at(phase)
        outcome = "stopped" if ended and parts.run_state.stopped is not None else "finished"
        try:
            self.stage = Stage.FITTING
            for cb in parts.callbacks:
                try:
                    cb.before_train()
                except Exception as exc:
                    locate_failure(exc, f"callback {cb.name!r} in its before_train hook")
                    raise
            self._start_train(resumed)
            if phase == "stopped":
                raise StopTraining("the run had stopped when its checkpoint was taken")
            if not ended:
                try:
                    parts.loop.run()
                except PreemptRequested as request:
                    self._preempt(request.signal)
        except StopTraining as exc:
            outcome = self._stopped(exc)
        except Preempted:
            self._finish("preempted", None)
            raise
        except BaseException as exc:
            if isinstance(exc, Exception):  # not in a callback: the step (forward...)
                ts = parts.clock.now()
                locate_failure(exc, f"the training step after step {ts.step} "
                                    f"(epoch {ts.epoch})")
            self._failed(exc)
            raise
        self._finish(outcome, None, fire_end=not ended)

    def _preempt(self, signal_name: str) -> None:
        """Fire ``preempt``, checkpoint (with a run directory) and raise ``Preempted``."""
        parts = self.parts
        parts.dispatch.fire("preempt")
        written = parts.checkpoints.write_preempt(parts.clock.step)
        raise Preempted(signal_name, parts.clock.step, written)

    def _start_train(self, resumed: bool) -> None:
        """Start training's clock; a fresh run first fires ``sanity_eval`` (with
        ``sanity_eval_batches``), then ``train_start``.

        The sanity evaluation runs before the clock starts (its time is not training's)
        and only on a fresh run: a resumed run adds nothing to ``events.jsonl`` that the
        uninterrupted run did not have. The random generators are restored after it, so
        training draws what it would have drawn without it.
        """
        parts, batches = self.parts, self.config.sanity_eval_batches
        if not resumed and batches:
            with preserved_rng():
                parts.dispatch.fire("sanity_eval", {"sanity_eval_batches": batches})
        parts.clock.start_train()
        if not resumed:
            parts.dispatch.fire("train_start")

    def _stopped(self, exc: StopTraining) -> str:
        """Record a stop (``"stopped"``), in every checkpoint taken from now on too."""
        parts = self.parts
        self.stopped = Stopped(str(exc), failure_place(exc))  # a callback that raised it
        parts.run_state.stopped = str(exc)
        _log.info("stop_training", step=parts.clock.step, epoch=parts.clock.epoch,
                  reason=str(exc))
        parts.checkpoints.flush("stopped")
        return "stopped"

    def _ended_at(self, phase: str | None) -> bool:
        """Whether a run resumed from a checkpoint taken after ``phase`` had ended there.

        A run stopped early (the checkpoint holds why) ended at that stop, whatever
        ``max_epochs`` says: resumed from its ``train_end`` checkpoint (killed before
        ``run.json`` said "stopped"), it writes the log the checkpoint holds and stops.
        """
        parts = self.parts
        stopped = parts.run_state.stopped if phase == "train_end" else None
        parts.run_state.stopped = stopped
        if stopped is not None:
            self.stopped = Stopped(stopped)
            return True
        return phase == "train_end" and self.config.ended(parts.clock.step,
                                                           parts.clock.epoch)

    def _setup(self) -> None:
        if self.stage is not Stage.OPENED:
            return
        for cb in self.parts.callbacks:
            try:
                cb.setup(self.trainer)
            except Exception as exc:
                locate_failure(exc, f"callback {cb.name!r} in its setup")
                raise
        self.stage = Stage.SET_UP

    def _export_final(self) -> None:
        """With ``export``: the weights training ended with, as
        ``RUN_DIR/export/final.safetensors`` (before ``after_train`` hooks such as
        ``load_best_at_end`` change them)."""
        run_dir = self.config.run_path
        if run_dir is not None:
            self.parts.checkpoints.write_export(run_dir / "export" / "final.safetensors")

    def _failed(self, exc: BaseException) -> None:
        """End a run that raised ``exc``: its traceback kept, ``run.json`` says failed."""
        parts = self.parts
        parts.checkpoints.discard()  # never a checkpoint of a half-done event
        if isinstance(exc, KeyboardInterrupt):  # the second Ctrl-C: no waiting
            parts.checkpoints.abandon()
        else:  # the save in flight is committed before the exit
            parts.checkpoints.settle()
        if parts.directory is not None and not isinstance(exc, KeyboardInterrupt):
            parts.directory.save_traceback(exc)
        for cb in parts.callbacks:
            with contextlib.suppress(Exception):
                cb.on_exception(exc)
        self._finish("failed", exc)

    def _finish(self, outcome: str, failed: BaseException | None, *,
                fire_end: bool = True) -> None:
        parts = self.parts
        self.outcome = outcome
        try:
            if failed is None and outcome != "preempted" and fire_end:
                parts.clock.stop_train()
                try:
                    with contextlib.suppress(StopTraining):
                        parts.dispatch.fire("train_end")
                    parts.checkpoints.wait()  # the last save is committed, or the run fails
                    self._export_final()
                except Exception as exc:  # a train_end callback failed: so did the run
                    outcome, failed = "failed", exc
                    self.outcome = outcome
                    if parts.directory is not None:
                        parts.directory.save_traceback(exc)
                    raise
        finally:
            parts.checkpoints.settle()  # every way out waits for the save in flight
            if self.stage in (Stage.SET_UP, Stage.FITTING):
                self.stage = Stage.ENDED
            try:
                for cb in parts.callbacks:
                    try:
                        cb.after_train()
                    except Exception:
                        if failed is None:
                            raise
            finally:
                parts.metrics.close()
                self._record(outcome)
                parts.checkpoints.mount.close()
                if parts.directory is not None:
                    parts.directory.release()
                if outcome == "preempted" and parts.comm is not None:  # none leaves first:
                    parts.comm.barrier()  # torchrun would stop the chief mid-way
