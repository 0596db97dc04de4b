"""Run control inside the HF Trainer: a preemption saved HF's way, then exit 75.

A preemption (SIGTERM, SIGINT, a cloud's notice) is acted on at the step end where the
run control reports it: the callback sets ``control.should_save`` and
``control.should_training_stop``, so the Trainer writes its own ``checkpoint-STEP``
(``_save_checkpoint``: weights, optimizer, scheduler, RNG states, ``trainer_state.json``
with this callback's state) and leaves its loop; at the first hook after the loop
(``on_epoch_end``, which HF calls for the epoch it stopped in) the callback raises
``HostPreempted``, a ``SystemExit(75)``: the user's script ends with exit code 75 and no
traceback (what SLURM's and Kubernetes' requeue rules read), after one line on stderr.
It is raised before HF's end of training, which would log the run's totals, load the best
model (``load_best_model_at_end``) and, with ``save_total_limit=1``, delete every
checkpoint but the best one, the preemption's among them. ``trainer.train(
resume_from_checkpoint=True)`` (or its path) goes on from there as if never stopped.

``every("auto")`` is fed by the measured cost of each save the schedule asks for: from the
last hook before HF's ``_save_checkpoint`` (``on_step_end``, ``on_log``, or
``on_evaluate`` when it evaluated first) to ``on_save``, right after it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from transformers import TrainerControl, TrainerState, TrainingArguments

__all__ = ["EXIT_PREEMPTED", "HostPreempted", "Preemption"]

#: The exit code of a preempted run (as ``schedtrain train``'s): run it again to resume.
EXIT_PREEMPTED: Final = 75


class HostPreempted(SystemExit):
    """The run was preempted after step ``step``, its checkpoint written at ``checkpoint``:
    exit code 75 (a ``SystemExit``: no traceback; ``except Exception`` lets it pass).

    Attributes:
        signal: what asked (``"SIGTERM"``, ``"the AWS preemption notice"``).
        step: the last completed step.
        checkpoint: HF's checkpoint folder (``None``: this process did not write one).
    """

    def __init__(self, signal: str, step: int, checkpoint: Path | None) -> None:
        super().__init__(EXIT_PREEMPTED)
        self.signal, self.step, self.checkpoint = signal, step, checkpoint

    def __str__(self) -> str:
        where = (f"checkpoint {self.checkpoint}; resume with trainer.train("
                 "resume_from_checkpoint=True)" if self.checkpoint is not None
                 else "no checkpoint written by this process")
        return f"preempted by {self.signal} after step {self.step}: {where}"


class Preemption:
    """One preemption's way through the Trainer: asked at a step end, saved by HF,
    raised after its loop."""

    __slots__ = ("checkpoint", "signal", "step")

    def __init__(self) -> None:
        self.signal: str | None = None
        self.step = 0
        self.checkpoint: Path | None = None

    @property
    def asked(self) -> bool:
        return self.signal is not None

    def ask(self, signal: str, state: TrainerState, control: TrainerControl) -> None:
        """At a step end: HF saves its checkpoint and leaves the loop."""
        self.signal, self.step = signal, state.global_step
        control.should_save = True
        control.should_training_stop = True

    def saved(self, args: TrainingArguments, state: TrainerState) -> None:
        """``on_save`` of the preemption's step: where HF wrote it."""
        if self.asked and state.global_step == self.step and args.should_save:
            self.checkpoint = Path(args.output_dir or "") / f"checkpoint-{state.global_step}"

    def leave(self, args: TrainingArguments) -> None:
        """After HF's loop: exit 75, one line on stderr (on the process that logs)."""
        if self.signal is None:
            return
        stop = HostPreempted(self.signal, self.step, self.checkpoint)
        if args.should_log:
            print(str(stop), file=sys.stderr, flush=True)
        raise stop


class InterimControl:
    """Signals and notices only, until the hosts' run control lands (same calls)."""

    def __init__(self, driver: Any, *, preempt_notice: str | None,
                 handle_signals: bool) -> None:
        from schedtrain.training.control.inbox import Inbox

        self.driver, self.notice, self.signals = driver, preempt_notice, handle_signals
        self.inbox = Inbox()

    @contextlib.contextmanager
    def open(self, *, fresh: bool, resumed: bool) -> Iterator[None]:
        from schedtrain.training.control.inbox import handle_signals
        from schedtrain.training.control.notice import watch_notices

        with contextlib.ExitStack() as stack:
            if self.signals:
                stack.enter_context(handle_signals(self.inbox))
            stack.enter_context(watch_notices(self.inbox, self.notice, None))
            yield

    def drain(self, step: int, due: bool) -> str | None:
        inbox = self.inbox
        if inbox.deadline is not None:
            found = inbox.take_deadline(self.driver.clock.time_ns)
            if found is not None:
                self.driver.table.set_deadline(found)
        return inbox.requested


class HFRunControl:
    """The callback's run control: opened for ``train()``, asked at each step end."""

    def __init__(self, control: Any) -> None:
        self.control = control
        self.preemption = Preemption()
        self._open: contextlib.ExitStack | None = None

    def begin(self, *, resumed: bool) -> None:
        self.end()  # a train() that raised left it open
        self.preemption = Preemption()
        stack = contextlib.ExitStack()
        stack.enter_context(self.control.open(fresh=not resumed, resumed=resumed))
        self._open = stack

    def step_end(self, state: TrainerState, control: TrainerControl, due: bool) -> None:
        asked = self.control.drain(state.global_step, due)
        if asked is not None and not self.preemption.asked:
            self.preemption.ask(asked, state, control)

    def after_loop(self, args: TrainingArguments) -> None:
        if self.preemption.asked:
            self.end()
            self.preemption.leave(args)

    def end(self) -> None:
        opened, self._open = self._open, None
        if opened is not None:
            opened.close()
