"""The Ignite training of the run-control tests (tests/integrations/test_ignite_control.py):
a 3-1 linear model with SGD on 6 fixed batches of 4 rows an epoch, 3 epochs, on a
``DeterministicEngine`` (a resumed engine fetches on from its saved iteration), with a
schedule attached by ``attach_schedule`` and its run control: the folder ``RUN`` that
``schedtrain retime RUN NEW`` finds, SIGTERM and SIGINT, a cloud notice (``--notice``).
A preemption is saved by Ignite's ``Checkpoint`` in ``RUN/checkpoints`` and ends the
process with exit 75.

Run as ``python tests/jobs/ignite_job.py RUN [--resume CKPT] [--term-at N] [--notice URL]``;
it writes ``RUN/out.json``: the firings ``(callback, event, step)`` of this process and
the final weights' digest. ``--term-at N`` sends the process SIGTERM from iteration N's
handler (as a scheduler would, mid-run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from ignite.engine import DeterministicEngine, Engine, Events
from ignite.handlers import Checkpoint

from schedtrain import Schedule, ScheduleWarning, at, every, on
from schedtrain.integrations.host_control import HostControl
from schedtrain.integrations.ignite import ScheduleHandle, attach_schedule

BATCHES, ROWS, EPOCHS = 6, 4, 3


def schedule() -> Schedule:
    from schedtrain.triggers import before_deadline

    return Schedule({"tick": every("4 steps"), "epoch": on("epoch_end"),
                     "soon": before_deadline("60 s"), "late": before_deadline("20 s"),
                     "once": at("9 steps")})


def data() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(ROWS, 3, generator=g) for _ in range(BATCHES)]


@dataclass
class Run:
    """One process's training: what it fired, and what a checkpoint holds."""

    engine: Engine
    handle: ScheduleHandle
    model: torch.nn.Module
    fired: list[tuple[str, str, int]]

    @property
    def to_save(self) -> dict[str, Any]:
        return self.handle.to_save

    def digest(self) -> str:
        h = hashlib.sha256()
        for name, p in sorted(self.model.state_dict().items()):
            h.update(name.encode() + p.detach().numpy().tobytes())
        return h.hexdigest()


def build(run_dir: Path | None, sched: Schedule | None = None,
          actions: dict[str, Callable[[Engine], Any]] | None = None, **kw: Any) -> Run:
    """The engine, model and attached schedule with run control in ``run_dir`` (``kw``:
    HostControl's)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def step(engine: Engine, batch: torch.Tensor) -> float:
        opt.zero_grad()
        loss = (model(batch).squeeze(1) - batch.sum(1)).pow(2).mean()
        loss.backward()
        opt.step()
        return float(loss.item())

    engine = DeterministicEngine(step)
    sched = sched if sched is not None else schedule()
    fired: list[tuple[str, str, int]] = []
    handle = None

    def record(name: str) -> Callable[..., None]:
        own = (actions or {}).get(name)

        def act(engine: Engine) -> None:
            assert handle is not None
            fired.append((name, handle.driver.event, handle.driver.clock.step))
            if own is not None:
                own(engine)
        return act

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        handle = attach_schedule(
            engine, sched, {n: record(n) for n in sched.names},
            control=HostControl(run_dir, **kw),
            to_save={"model": model, "optimizer": opt, "trainer": engine},
            save_handler=None if run_dir is not None else Path("checkpoints"))
    return Run(engine, handle, model, fired)


def resume(run: Run, checkpoint: Path) -> None:
    """Load ``checkpoint`` into ``run`` the Ignite way (a DeterministicEngine keeps its
    random generators' states: numpy arrays, so not ``weights_only``)."""
    Checkpoint.load_objects(run.to_save, torch.load(checkpoint, weights_only=False))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run", type=Path)
    parser.add_argument("--resume", type=Path)
    parser.add_argument("--term-at", type=int)
    parser.add_argument("--notice")
    args = parser.parse_args()
    torch.set_num_threads(1)
    run = build(args.run, preempt_notice=args.notice)
    if args.term_at is not None:
        run.engine.add_event_handler(Events.ITERATION_COMPLETED(once=args.term_at),
                                     lambda _: os.kill(os.getpid(), signal.SIGTERM))
    out = args.run / "out.json"

    def write(_: Engine | None = None) -> None:
        out.write_text(json.dumps({"fired": run.fired, "digest": run.digest()}))

    run.engine.add_event_handler(Events.TERMINATE, write)  # before the exit
    if args.resume is not None:
        resume(run, args.resume)
    run.engine.run(data(), max_epochs=EPOCHS)
    write()


if __name__ == "__main__":
    sys.exit(main())
