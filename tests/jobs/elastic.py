"""Callbacks for elastic restarts (tests/test_elastic.py, benchmarks/elastic_restart.py):
a worker that dies once, and the times and attempt the run saw.

``SCHEDTRAIN_TEST_FAULT = "RANK:STEP:HOW"`` makes rank RANK die at ``step_end`` of step
STEP on the first attempt only (``TORCHELASTIC_RESTART_COUNT`` 0): ``kill`` sends itself
SIGKILL (as ``kill -9``), ``raise`` raises. Without it nothing dies, so one spec serves
the faulty runs and the uninterrupted one they must equal.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from schedtrain.callbacks import Callback

FAULT_ENV = "SCHEDTRAIN_TEST_FAULT"


def _attempt() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


class _Notes(Callback):
    def _note(self, name: str, text: str) -> None:
        assert self.trainer.run_dir is not None
        (Path(self.trainer.run_dir).parent / name).write_text(text)


class Fault(_Notes):
    """Dies as ``SCHEDTRAIN_TEST_FAULT`` says, first writing the time it died."""

    def _trigger(self) -> None:
        fault = os.environ.get(FAULT_ENV)
        if not fault or _attempt() != 0:
            return
        rank, step, how = fault.split(":")
        if self.rank != int(rank) or self.now.step != int(step):
            return
        self._note("died.txt", f"{time.time()!r}")
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"deliberate failure on rank {rank} at step {step}")


class Stamp(_Notes):
    """On the chief: at the first step each attempt trains, the time in
    ``first-step-<attempt>.txt`` (``TORCHELASTIC_RESTART_COUNT``); at every firing the
    attempt in ``attempt.txt`` (at the end: the attempt that finished)."""

    def _setup(self) -> None:
        self.stamped = False

    def _trigger(self) -> None:
        if not self.is_chief:
            return
        if self.now.step > 0 and not self.stamped:
            self.stamped = True
            self._note(f"first-step-{_attempt()}.txt", f"{time.time()!r}")
        self._note("attempt.txt", str(_attempt()))
