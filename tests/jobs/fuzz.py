"""Callbacks that make the fuzzer's fixture runs (tests/fuzz_runs.py, tests/fuzz_notice.py):
a live retime, a preemption and a cloud notice asked for, active only while a fixture is
made (``SCHEDTRAIN_FUZZ_FIXTURE`` set), so a resumed case runs the same spec without
asking or preempting again."""

from __future__ import annotations

import os
import signal
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from schedtrain.callbacks import Callback
from schedtrain.planning.changes import canonical
from schedtrain.planning.requests import write_request
from schedtrain.spec import load_spec
from schedtrain.training import Task

FIXTURE = "SCHEDTRAIN_FUZZ_FIXTURE"
#: The file (beside the run directory) whose appearance asks the test's metadata server
#: to serve a preemption notice.
NOTICE_FLAG = "notice.flag"


class AskRetime(Callback):
    """Writes a retime request for ``spec`` (beside the run directory), as
    ``schedtrain retime`` would (the chief only: one request per job)."""

    def __init__(self, spec: str) -> None:
        super().__init__()
        self.spec = spec

    def _trigger(self) -> None:
        run_dir = self.trainer.run_dir
        if not os.environ.get(FIXTURE) or run_dir is None or not self.is_chief:
            return
        text = canonical(load_spec(run_dir.parent / self.spec).schedule())
        assert text is not None
        write_request(run_dir, text)


class Preempt(Callback):
    """Sends the process SIGTERM, as a scheduler preempting the job would."""

    def _trigger(self) -> None:
        if os.environ.get(FIXTURE):
            os.kill(os.getpid(), signal.SIGTERM)


class AskNotice(Callback):
    """Asks the test's metadata server for a preemption notice (the chief writes
    ``NOTICE_FLAG`` beside the run directory), then holds every rank ``seconds`` so the
    job's notice thread sees it before the next steps."""

    may_stop_alone = False

    def __init__(self, seconds: float = 1.0) -> None:
        super().__init__()
        self.seconds = seconds

    def _trigger(self) -> None:
        run_dir = self.trainer.run_dir
        if not os.environ.get(FIXTURE) or run_dir is None:
            return
        if self.is_chief:
            (run_dir.parent / NOTICE_FLAG).write_text("notice\n")
        time.sleep(self.seconds)


def make_task() -> Task:
    """``jobs.crash``'s job (Adam, dropout, shuffled data) on 256 samples in batches of
    2: epochs of 64 steps a rank on two processes, long enough that a preemption agreed
    at a check step (every 16 on several processes) falls inside one."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(256, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long()
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 2))
    train = DataLoader(TensorDataset(x, y), batch_size=2, shuffle=True)
    val = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=32)
    return Task(model, torch.optim.Adam(model.parameters(), lr=1e-3), train, val,
                loss_fn=nn.functional.cross_entropy)
