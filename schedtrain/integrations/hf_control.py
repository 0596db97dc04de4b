"""Run control inside the HF Trainer (``ScheduleCallback(control=HostControl(...))``): a
preemption saved HF's way, then exit 75.

The driver drains the control at its slow-path step ends (``driver_control``): a retime
is applied there, a notice's deadline reaches ``before_deadline`` before the step's
firings, and a preemption asked for (SIGTERM, SIGINT, a cloud's notice) waits in
``driver.preempt_requested``. At that step end the schedule fires ``preempt`` and the
callback sets ``control.should_save``
and ``control.should_training_stop``: the Trainer writes its own ``checkpoint-STEP``
(``_save_checkpoint``: weights, optimizer, scheduler, RNG states, ``trainer_state.json``
holding this callback's state and the schedule with its retimes) and leaves its loop. At
the first hook after the loop (``on_epoch_end``, which HF calls for the epoch it stopped
in) the callback says one line on stderr and raises ``HostPreempted``, a
``SystemExit(75)``: the user's script ends with exit code 75 and no traceback (what
SLURM's and Kubernetes' requeue rules read). It is raised before HF's end of training,
which would log the run's totals, load the best model (``load_best_model_at_end``) and,
with ``save_total_limit=1``, delete every checkpoint but the best, the preemption's among
them. ``trainer.train(resume_from_checkpoint=True)`` (or its path) goes on from there as
if never stopped, retimes included.

HF calls no callback when ``train()`` raises: the control (signal handlers, the notice
poller, the folder's lock) stays open until the callback's next ``train()`` closes it as
failed, or ``ScheduleCallback.close()``.
"""

from __future__ import annotations

from pathlib import Path

from transformers import TrainerControl, TrainerState, TrainingArguments

from schedtrain.integrations.driver import ScheduleDriver
from schedtrain.integrations.host_control import HostPreempted, say_preempted
from schedtrain.integrations.hosted import CallbackDriver

__all__ = ["HF_RESUME", "Preemption"]

#: How an HF user resumes a preempted run (said in the preemption's line).
HF_RESUME = "resume with trainer.train(resume_from_checkpoint=True)"


class Preemption:
    """One preemption's way through the Trainer: asked at a step end, saved by HF,
    raised after its loop."""

    __slots__ = ("checkpoint", "driver", "signal", "step")

    def __init__(self, driver: ScheduleDriver) -> None:
        self.driver = driver
        self.signal: str | None = None
        self.step = 0
        self.checkpoint: Path | None = None

    def step_end(self, state: TrainerState, flags: TrainerControl) -> None:
        """After the driver's step end: a preemption it was asked for makes HF save its
        checkpoint and leave the loop (``flags``: HF's ``TrainerControl``)."""
        asked = self.driver.preempt_requested
        if asked is None or self.signal is not None:
            return
        self.signal, self.step, self.checkpoint = asked, state.global_step, None
        self.driver.fire("preempt")  # as the own loop: before the checkpoint
        flags.should_save = True
        flags.should_training_stop = True

    def saved(self, args: TrainingArguments, state: TrainerState) -> None:
        """``on_save``: the preemption's checkpoint, where HF wrote it."""
        if self.signal is not None and state.global_step == self.step:
            self.checkpoint = Path(args.output_dir or "") / f"checkpoint-{state.global_step}"

    def leave(self, args: TrainingArguments) -> None:
        """After HF's loop: the control closed as preempted, one line, exit 75."""
        signal, self.signal = self.signal, None
        if signal is None:
            return
        stop = HostPreempted(signal, self.step, self.checkpoint)
        if self.checkpoint is not None:
            stop.line = f"{stop.line}; {HF_RESUME}"
            stop.args = (stop.line,)
        d = self.driver
        if isinstance(d, CallbackDriver):
            d.exception(stop)  # after_train with outcome "preempted"; control closed
        else:
            d.close_control(stop)
        if args.should_log:
            say_preempted(stop)
        raise stop

    def reopen(self) -> None:
        """A new ``train()``: a control left open by one that raised closes as failed."""
        self.signal = None
        self.driver.close_control(RuntimeError("trainer.train() raised"))
