"""The lifecycle of ``Trainer.fit``: open the run directory, set callbacks up, fire
``train_start``, run the loop, and end as the run ended (finished, stopped, preempted,
failed), recording it in ``run.json``."""

from __future__ import annotations

import contextlib
from typing import Any

import structlog

from schedtrain.errors import Preempted, StopTraining, failure_place, locate_failure
from schedtrain.training.preempt import handle_signals

__all__ = ["fit_run"]

_log = structlog.get_logger("schedtrain.training")


def fit_run(trainer: Any) -> None:
    """``trainer.fit()`` for a ``Trainer`` (typed ``Any``: the trainer imports this
    module, and this one reaches into the trainer's parts)."""
    trainer._open_directory()
    trainer._record("running")
    guard = trainer._guard
    guard.requested = None
    try:
        _setup(trainer)
    except BaseException as exc:
        _failed(trainer, exc)
        raise
    trainer.table.attach(trainer.clock, trainer.metrics, trainer.predicates)
    trainer.model.train()
    # Unconfigured structlog prints every debug line: log firings only when an
    # application (the CLI) has configured it.
    trainer.dispatch.log_firings = trainer.checkpoints.log = structlog.is_configured()
    trainer.dispatch.stop_reason = None
    outcome = "finished"
    # A checkpoint taken as training stopped, or after train_end with no more training
    # asked for, resumes to that end.
    phase, trainer._resume_phase = trainer._resume_phase, None
    ended = phase == "train_end" and trainer._at_end()
    signals = handle_signals(guard) if trainer.handle_signals else contextlib.nullcontext()
    try:
        with signals:
            trainer._loop_running = True
            for cb in trainer.callbacks:
                try:
                    cb.before_train()
                except Exception as exc:
                    locate_failure(exc, f"callback {cb.name!r} in its before_train hook")
                    raise
            trainer.clock.start_train()
            if not trainer._resumed:
                trainer.dispatch.fire("train_start")
            trainer._resumed = False
            if phase == "stopped":
                raise StopTraining("the run had stopped when its checkpoint was taken")
            if not ended:
                trainer._loop.run()
    except StopTraining as exc:
        outcome, trainer.stopped_early, trainer.stop_reason = "stopped", True, str(exc)
        trainer.stop_place = failure_place(exc)  # a callback that raised it
        _log.info("stop_training", step=trainer.clock.step, epoch=trainer.clock.epoch,
                  reason=str(exc))
        trainer.checkpoints.flush("stopped")
    except Preempted:
        _finish(trainer, "preempted", None)
        raise
    except BaseException as exc:
        if isinstance(exc, Exception):  # not in a callback: the step (forward, backward...)
            ts = trainer.clock.now()
            locate_failure(exc, f"the training step after step {ts.step} (epoch {ts.epoch})")
        _failed(trainer, exc)
        raise
    _finish(trainer, outcome, None, fire_end=not ended)


def _setup(trainer: Any) -> None:
    if trainer._setup_done:
        return
    for cb in trainer.callbacks:
        try:
            cb.setup(trainer)
        except Exception as exc:
            locate_failure(exc, f"callback {cb.name!r} in its setup")
            raise
    trainer._setup_done = True


def _failed(trainer: Any, exc: BaseException) -> None:
    """End a run that raised ``exc``: its traceback kept, ``run.json`` says failed."""
    trainer.checkpoints.discard()  # never a checkpoint of a half-done event
    if trainer.directory is not None and not isinstance(exc, KeyboardInterrupt):
        trainer.directory.save_traceback(exc)
    for cb in trainer.callbacks:
        with contextlib.suppress(Exception):
            cb.on_exception(exc)
    _finish(trainer, "failed", exc)


def _finish(trainer: Any, outcome: str, failed: BaseException | None, *,
            fire_end: bool = True) -> None:
    try:
        if failed is None and outcome != "preempted" and fire_end:
            trainer.clock.stop_train()
            try:
                with contextlib.suppress(StopTraining):
                    trainer.dispatch.fire("train_end")
            except Exception as exc:  # a train_end callback failed: so did the run
                outcome, failed = "failed", exc
                if trainer.directory is not None:
                    trainer.directory.save_traceback(exc)
                raise
    finally:
        trainer._loop_running = False
        try:
            for cb in trainer.callbacks:
                try:
                    cb.after_train()
                except Exception:
                    if failed is None:
                        raise
        finally:
            trainer.metrics.close()
            trainer._record(outcome)
            if trainer.directory is not None:
                trainer.directory.release()
