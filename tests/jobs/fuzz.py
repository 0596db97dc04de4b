"""Callbacks that make the fuzzer's fixture run (tests/state_fuzz.py): a live retime and a
preemption, active only while the fixture is made (``SCHEDTRAIN_FUZZ_FIXTURE`` set), so a
resumed case runs the same spec without asking or preempting again."""

from __future__ import annotations

import os
import signal

from schedtrain.callbacks import Callback
from schedtrain.planning.changes import canonical
from schedtrain.planning.retime import write_request
from schedtrain.spec import load_spec

FIXTURE = "SCHEDTRAIN_FUZZ_FIXTURE"


class AskRetime(Callback):
    """Writes a retime request for ``spec`` (beside the run directory), as
    ``schedtrain retime`` would."""

    def __init__(self, spec: str) -> None:
        super().__init__()
        self.spec = spec

    def _trigger(self) -> None:
        run_dir = self.trainer.run_dir
        if not os.environ.get(FIXTURE) or run_dir is None:
            return
        text = canonical(load_spec(run_dir.parent / self.spec).schedule())
        assert text is not None
        write_request(run_dir, text)


class Preempt(Callback):
    """Sends the process SIGTERM, as a scheduler preempting the job would."""

    def _trigger(self) -> None:
        if os.environ.get(FIXTURE):
            os.kill(os.getpid(), signal.SIGTERM)
