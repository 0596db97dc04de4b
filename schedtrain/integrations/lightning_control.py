"""Run control inside Lightning (``ScheduleCallback(..., control=HostControl(RUN_DIR))``):
a preemption saved as Lightning's own checkpoint, then exit 75.

At the end of the optimizer step where a signal or a cloud notice is seen, the schedule
fires ``preempt``, Lightning writes its checkpoint to ``RUN_DIR/preempted.ckpt``
(``trainer.save_checkpoint``, under a temporary name then renamed: a kill during the
write leaves the previous one whole) and ``HostPreempted`` (a ``SystemExit(75)``) ends
the fit with one line on standard error. The script started again resumes the Lightning
way: ``trainer.fit(model, data, ckpt_path=callback.resume_path)`` (``None`` when there is
nothing to resume). A fit that finishes removes the file, so a later start begins afresh.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import lightning.pytorch as pl

from schedtrain.checkpoints.files import remove
from schedtrain.integrations.driver import ScheduleDriver
from schedtrain.integrations.host_control import HostControl, HostPreempted, say_preempted
from schedtrain.training.control.retime import Retimer

__all__ = ["PREEMPT_CHECKPOINT", "check_control", "forget_preempted", "preempt", "resume_path",
           "retimer_of"]

#: The preemption checkpoint's name in the run folder.
PREEMPT_CHECKPOINT: Final = "preempted.ckpt"


def check_control(control: object) -> HostControl | None:
    """``control`` as Lightning takes it: a ``HostControl`` with a run folder."""
    if control is None:
        return None
    if not isinstance(control, HostControl):
        raise TypeError(f"control must be a schedtrain HostControl, got {control!r}")
    if control.run_dir is None:
        raise ValueError("control=HostControl(None): inside Lightning a preemption is saved "
                         "as a checkpoint in the run folder; give one, HostControl(RUN_DIR)")
    return control


def _path(control: HostControl) -> Path:
    assert control.run_dir is not None
    return control.run_dir / PREEMPT_CHECKPOINT


def retimer_of(control: HostControl | None) -> Retimer:
    """``control``'s retimer (live retime's Python API); refused without control."""
    if control is None:
        raise ValueError("live retime needs run control: ScheduleCallback(..., "
                         "control=HostControl(RUN_DIR))")
    return control.retimer


def resume_path(control: HostControl | None) -> str | None:
    """The preemption checkpoint to resume from, ``None`` when there is none."""
    if control is None:
        return None
    path = _path(control)
    return str(path) if path.is_file() else None


def preempt(trainer: pl.Trainer, driver: ScheduleDriver, control: HostControl | None) -> None:
    """Save Lightning's checkpoint for the preemption ``driver`` holds, then exit 75.

    Raises:
        HostPreempted: always (after the checkpoint is written).
    """
    assert control is not None  # only run control asks for a preemption
    path = _path(control)
    temporary = path.with_name(f".{path.name}.tmp")
    # the file written whole before it takes the name a resume reads
    with _loader_spent(trainer):
        trainer.save_checkpoint(temporary, weights_only=False)
    if trainer.is_global_zero:
        temporary.replace(path)
    stop = HostPreempted(driver.preempt_requested or "a request", driver.clock.step, path)
    say_preempted(stop)
    raise stop


@contextlib.contextmanager
def _loader_spent(trainer: pl.Trainer) -> Iterator[None]:
    """At an epoch's last batch, the checkpoint without the training loaders' positions:
    Lightning 2.6 resumes a stateful loader saved at its end as an empty next epoch,
    where a loader without a position runs it whole (mid-epoch, the position is kept)."""
    loop = trainer.fit_loop
    batches = trainer.num_training_batches
    try:
        done = loop.epoch_loop.batch_progress.current.processed  # type: ignore[attr-defined]
        loaders = loop._combined_loader
    except AttributeError:  # Lightning's loop moved: saved as Lightning saves it
        yield
        return
    if batches == float("inf") or done < batches:
        yield
        return
    loop._combined_loader = None  # its on_save_checkpoint then saves no positions
    try:
        yield
    finally:
        loop._combined_loader = loaders


def forget_preempted(trainer: pl.Trainer, control: HostControl | None) -> None:
    """A finished fit: its preemption checkpoint is older than what it trained."""
    if control is not None and trainer.is_global_zero:
        remove(_path(control))  # the checkpoint owner's delete, as the verb's pruning
