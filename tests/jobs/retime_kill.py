"""A job killed with SIGKILL inside a live retime, at one point of its bookkeeping:
``python -m jobs.retime_kill RUN_DIR KILL MARKER ASK_AT WEIGHTS``.

It trains 3 epochs of 40 steps (20 ms each), a checkpoint every 7 steps; at step
``ASK_AT`` it asks its own run to retime (checkpoints every 5 steps), as ``schedtrain
retime`` would, unless ``MARKER`` exists (the request's id is written there: asked once).
``KILL`` is where the process kills itself while it applies the request:

- ``before-journal``: the request taken and applied, before ``retimes.json`` is written;
- ``after-journal``: ``retimes.json`` written, before the answer and the request removed;
- ``after-answer``: the answer written, before the request is removed;
- ``none``: no kill.

A run directory that holds a run (or a journal) is resumed (``--resume auto``). The final
weights are saved to ``WEIGHTS``.

tests/training/test_retime_once.py calls :func:`job` in children it forks, with
``virtual``: each step moves the clock the run's retimer reads (``POLL_NS`` apart, its
looks for the request) 20 ms on instead of sleeping them: it looks at every 25th step,
as the sleeps make it do on an idle machine, without a fresh interpreter or the sleeps.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from training_helpers import UnevenData, tiny_model

import schedtrain.training.control.retime as live
from schedtrain import Schedule, every
from schedtrain.callbacks import Callback, ModelSaver
from schedtrain.planning.changes import canonical
from schedtrain.planning.requests import write_request
from schedtrain.training import Trainer

OLD: Schedule = Schedule({"ask": every("1 step"), "save": every("7 steps")})
NEW: Schedule = Schedule({"ask": every("1 step"), "save": every("5 steps")})
#: the module-level writer a kill point follows or precedes, and whether it follows
KILLS = {"before-journal": ("write_history", False), "after-journal": ("write_history", True),
         "after-answer": ("write_answer", True)}


class Ask(Callback):
    """The user's ``schedtrain retime``, once, at step ``at``; each step paced (20 ms), so
    the run looks for the request a few times an epoch (once per ``POLL_NS``). With a
    ``clock`` (nanoseconds), the pace moves it on instead of sleeping."""

    def __init__(self, run_dir: Path, marker: Path, at: int,
                 clock: list[int] | None = None) -> None:
        self.run_dir, self.marker, self.at, self.clock = run_dir, marker, at, clock

    def _trigger(self) -> None:
        if self.clock is None:
            time.sleep(0.02)
        else:
            self.clock[0] += 20_000_000
        if self.now.step == self.at and not self.marker.exists():
            text = canonical(NEW)
            assert text is not None
            self.marker.write_text(write_request(self.run_dir, text))


def kill_at(point: str) -> None:
    """SIGKILL this process before or after the writer of ``point`` (``KILLS``)."""
    name, after = KILLS[point]
    real = getattr(live, name)

    def write(*args: object) -> None:
        if after:
            real(*args)
        os.kill(os.getpid(), signal.SIGKILL)
    setattr(live, name, write)


def job(run_dir: Path, kill: str, marker: Path, ask_at: int, weights: Path, *,
        virtual: bool = False) -> None:
    """The job (see the module's text); ``virtual``: its steps paced on a clock of its
    own, which the retimer reads (in a process of its own: the retimer's clock is not
    restored)."""
    if kill != "none":
        kill_at(kill)
    clock = None
    if virtual:
        clock = [time.monotonic_ns()]
        live.time = SimpleNamespace(  # type: ignore[attr-defined,assignment]
            monotonic_ns=lambda: clock[0])
    model, opt = tiny_model()
    trainer = Trainer(model, opt, UnevenData([40] * 3), torch.nn.functional.mse_loss,
                      schedule=OLD, bindings={"ask": Ask(run_dir, marker, ask_at, clock),
                                              "save": ModelSaver(keep=None)},
                      max_epochs=3, run_dir=run_dir, handle_signals=False)
    if (run_dir / "run.json").exists() or (run_dir / "retimes.json").exists():
        trainer.resume("auto")
    trainer.fit()
    torch.save(trainer.model.state_dict(), weights)


def main() -> None:
    job(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]),
        Path(sys.argv[5]))


if __name__ == "__main__":
    main()
