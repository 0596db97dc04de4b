"""Run control inside a host, against the own loop's rules (the retime and notice cases
of ``host_agreement``).

- ``check_retime``: a host run asked for a new schedule at a step's end (in Python,
  ``control.retimer.retime``, or by the request file ``schedtrain retime`` writes), and
  maybe preempted by SIGTERM at another step and resumed the host's way, fires what
  ``simulate(old).continue_with(new, at=step)`` says.
- ``check_notice``: a host run preempted at a step's end (SIGTERM, or a notice from a
  local AWS or GCE metadata server), saved the host's way (exit 75) and resumed the
  host's way, fires what the uninterrupted run fires and ends with the same weights.

A host takes part through an ``Adapter`` (``LIGHTNING`` here, ``TRANSFORMERS`` in
``host_control_hf``; ``ADAPTERS`` by host name):
``run`` trains the host's tiny model over a ``Shape`` with a schedule whose callbacks
run the given actions, ``control`` given to the host's schedule callback, from the
host's preemption checkpoint when ``resume``. The schedule's first callback is the
case's cue (``ask`` or ``cue``): at its step's end it asks or preempts.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
import torch
from host_agreement import UNITS, Case, Shape, _quietly, shapes, simulated
from host_control_hf import TRANSFORMERS
from host_strategies import counters, host_schedules, host_triggers
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st
from notice_server import NoticeServer

from schedtrain import Firing, Schedule, ScheduleError, ScheduleWarning, at
from schedtrain.integrations.host_control import EXIT_PREEMPTED, HostControl
from schedtrain.planning.changes import canonical
from schedtrain.planning.requests import live_refusal, read_history, write_request
from schedtrain.training.control import retime as live
from schedtrain.training.control.notice import POLL_ENV
from schedtrain.triggers import Trigger


def few(examples: int) -> settings:
    """A host's hypothesis settings: ``examples`` derandomized runs, no deadline (each
    trains a real host several times)."""
    return settings(max_examples=examples, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


# One thread for torch's ops, as tests/training_helpers sets for the suite: the hosts'
# models are tiny, and a second thread only spins on a loaded 2-core machine.
torch.set_num_threads(1)



@pytest.fixture(autouse=True)
def fast_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request file is seen at the next look, a notice within 10 ms (imported by each
    host's test file, where it applies to every test)."""
    monkeypatch.setattr(live, "POLL_NS", 0)
    monkeypatch.setenv(POLL_ENV, "0.01")

Actions = Mapping[str, Callable[[], None]]
SOURCES = ("SIGTERM", "aws", "gce")


@dataclass
class Ran:
    """One process's part of a host run."""

    firings: list[Firing]
    code: int  # 0: it ended; EXIT_PREEMPTED: preempted
    weights: list[torch.Tensor]


class Adapter(Protocol):
    host: str

    def run(self, schedule: Schedule, shape: Shape, folder: Path, *,
            control: HostControl | None, actions: Actions, resume: bool = False) -> Ran:
        """Train over ``shape``; each of ``schedule``'s callbacks runs ``actions[name]``
        (nothing when absent) as it fires; ``resume``: from the host's preemption
        checkpoint in ``folder``, the host's own way."""
        ...


@dataclass(frozen=True)
class RetimeCase:
    old: Schedule  # its first callback, "ask", is at(step) in both
    new: Schedule
    shape: Shape
    step: int
    by_file: bool
    preempt: int | None  # a SIGTERM at this step's end (the "cue"), then resumed


@dataclass(frozen=True)
class NoticeCase:
    schedule: Schedule  # its first callback, "cue", is at(step)
    shape: Shape
    step: int
    source: str  # "SIGTERM", or the cloud whose local server serves a notice


def steps(shape: Shape) -> int:
    """The run's optimizer steps."""
    return len(shape.closing())


def _fires(schedule: Schedule) -> tuple[str, ...]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        return ("batch_end",) if schedule.compile().needs_batch_end else ()


def retime_case(old: Mapping[str, Trigger], new: Mapping[str, Trigger], shape: Shape,
                step: int, *, by_file: bool, preempt: int | None) -> RetimeCase:
    """A case whose cues ask at ``step`` and preempt at ``preempt``."""
    cues = {"ask": at(f"{step} steps"), "cue": at(f"{preempt or steps(shape)} steps")}
    return RetimeCase(Schedule({**cues, **old}), Schedule({**cues, **new}), shape, step,
                      by_file, preempt)


@st.composite
def retime_cases(draw: st.DrawFn, host: str) -> RetimeCase:
    shape = draw(shapes(host), label="shape")
    n = steps(shape)
    step = draw(st.integers(1, n), label="asked at step")
    preempt = draw(st.one_of(st.none(), st.integers(1, n)), label="preempted at step")
    base = draw(host_schedules(UNITS[host]), label="old").triggers()
    changed = {name: draw(st.one_of(st.just(t), host_triggers(UNITS[host])))
               for name, t in base.items()}
    case = retime_case(base, changed, shape, step, by_file=draw(st.booleans(), label="by file"),
                       preempt=preempt)
    old, new = case.old, case.new
    try:
        a, b = canonical(old), canonical(new)
        _fires(new)
    except ScheduleError:
        assume(False)
    assert a is not None and b is not None
    assume(live_refusal(a, b, _fires(old)) is None)
    return case


@st.composite
def notice_cases(draw: st.DrawFn, host: str) -> NoticeCase:
    shape = draw(shapes(host), label="shape")
    step = draw(st.integers(1, steps(shape)), label="preempted at step")
    base = draw(host_schedules(UNITS[host]), label="schedule")
    return NoticeCase(Schedule({"cue": at(f"{step} steps"), **base.triggers()}), shape, step,
                      draw(st.sampled_from(SOURCES), label="source"))


def predicted(host: str, schedule: Schedule, shape: Shape) -> Any:
    return simulated(Case(host, schedule, shape, 1))


def _preempter(source: str, control: HostControl, server: NoticeServer) -> Callable[[], None]:
    """The cue's action: a SIGTERM, or a notice served, waited for until the poller has
    seen it (so that it preempts at this step's end)."""
    def cue() -> None:
        if source == "SIGTERM":
            os.kill(os.getpid(), signal.SIGTERM)
            return
        server.serve_notice()
        until = time.monotonic() + 20
        while control.inbox.requested is None and time.monotonic() < until:
            time.sleep(0.005)
        assert control.inbox.requested is not None, "the notice was not seen in 20 s"
    return cue


def check_retime(case: RetimeCase, adapter: Adapter, folder: Path) -> int:
    """Run ``case``; assert it fires as ``continue_with``; the firings compared."""
    host = adapter.host

    def asked(control: HostControl) -> dict[str, Callable[[], None]]:
        def ask() -> None:
            if case.by_file:
                text = canonical(case.new)
                assert text is not None
                write_request(folder, text)
            else:
                control.retimer.retime(case.new)

        def cue() -> None:
            if case.preempt is not None:
                os.kill(os.getpid(), signal.SIGTERM)
        return {"ask": ask, "cue": cue}

    control = HostControl(folder)
    ran = _quietly(lambda: adapter.run(case.old, case.shape, folder, control=control,
                                       actions=asked(control)))
    firings = ran.firings
    if case.preempt is not None:
        assert ran.code == EXIT_PREEMPTED, f"{host}: not preempted at {case.preempt}"
        again = HostControl(folder)
        ran = _quietly(lambda: adapter.run(case.old, case.shape, folder, control=again,
                                           actions=asked(again), resume=True))
        firings = firings + ran.firings
    assert ran.code == 0
    want = predicted(host, case.old, case.shape).continue_with(case.new, at=case.step)
    assert counters(firings) == counters(want), f"{host}: {case}"
    history = read_history(folder)
    if canonical(case.old) == canonical(case.new):
        assert history is None
    else:
        assert history is not None
        assert [(a.step, a.schedule) for a in history.applied] == [
            (case.step, canonical(case.new))]
    return len(firings)


def check_notice(case: NoticeCase, adapter: Adapter, folder: Path) -> int:
    """Run ``case`` uninterrupted, then preempted and resumed; assert both agree."""
    host = adapter.host
    whole = _quietly(lambda: adapter.run(case.schedule, case.shape, folder / "whole",
                                         control=None, actions={}))
    run_dir = folder / "run"
    with NoticeServer() as server:
        notice = None if case.source == "SIGTERM" else server.url(case.source)
        control = HostControl(run_dir, preempt_notice=notice)
        cut = _quietly(lambda: adapter.run(case.schedule, case.shape, run_dir,
                                           control=control,
                                           actions={"cue": _preempter(case.source, control,
                                                                      server)}))
    if cut.code == 0:  # a notice at the run's last step: its triggers see the deadline at
        # the next step end, as in the own loop, and there is none: the run finishes
        assert case.step == steps(case.shape), f"{host}: not preempted at step {case.step}"
        assert counters(cut.firings) == counters(whole.firings), f"{host}: {case}"
        return len(whole.firings)
    assert cut.code == EXIT_PREEMPTED, f"{host}: not preempted at step {case.step}"
    assert threading.current_thread() is threading.main_thread()
    rest = _quietly(lambda: adapter.run(case.schedule, case.shape, run_dir,
                                        control=HostControl(run_dir), actions={},
                                        resume=True))
    assert rest.code == 0
    assert counters(cut.firings + rest.firings) == counters(whole.firings), f"{host}: {case}"
    assert counters(whole.firings) == counters(predicted(host, case.schedule, case.shape))
    for a, b in zip(whole.weights, rest.weights, strict=True):
        assert torch.equal(a, b), f"{host}: weights differ after the resume ({case})"
    return len(whole.firings)


class LightningAdapter:
    """Lightning: ``ScheduleCallback(..., control=...)``; resumed with
    ``fit(ckpt_path=callback.resume_path)``."""

    host = "lightning"

    def run(self, schedule: Schedule, shape: Shape, folder: Path, *,
            control: HostControl | None, actions: Actions, resume: bool = False) -> Ran:
        from test_integrations_lightning import Module, trainer
        from torch.utils.data import DataLoader
        from torchdata.stateful_dataloader import StatefulDataLoader

        from schedtrain.integrations.lightning import ScheduleCallback

        s = shape
        g = torch.Generator().manual_seed(0)
        rows = torch.randn((s.batches - 1) * s.rows + s.last, 3, generator=g)
        # Lightning resumes a plain DataLoader mid-epoch from the epoch's first batch: a
        # run preempted inside an epoch needs one with its own position.
        loader = StatefulDataLoader if control is not None else DataLoader

        def act(name: str) -> Callable[..., None]:
            return lambda trainer, module: actions.get(name, lambda: None)()

        cb = ScheduleCallback(schedule, {n: act(n) for n in schedule.names},
                              tokens=lambda b: b.numel(), record=True, control=control)
        torch.manual_seed(0)
        module = Module()
        path = cb.resume_path if resume else None
        assert not resume or path is not None, "no preemption checkpoint to resume from"
        code = 0
        try:
            trainer([cb], max_epochs=s.epochs, accumulate_grad_batches=s.accum).fit(
                module, loader(rows, batch_size=s.rows), ckpt_path=path)
        except SystemExit as exc:
            code = int(exc.code or 0)
        return Ran(list(cb.firings), code,
                   [p.detach().clone() for p in module.parameters()])


LIGHTNING = LightningAdapter()
ADAPTERS: dict[str, Adapter] = {"lightning": LIGHTNING, "transformers": TRANSFORMERS}


class IgniteAdapter:
    """Ignite: ``attach_schedule(..., control=..., to_save=...)`` on a
    ``DeterministicEngine`` (it resumes its data at the saved iteration); the preemption
    is Ignite's ``Checkpoint`` in ``RUN_DIR/checkpoints``, resumed with
    ``Checkpoint.load_objects(handle.to_save, ...)`` then ``engine.run``."""

    host = "ignite"

    def run(self, schedule: Schedule, shape: Shape, folder: Path, *,
            control: HostControl | None, actions: Actions, resume: bool = False) -> Ran:
        from ignite.engine import DeterministicEngine, Engine
        from ignite.handlers import Checkpoint

        from schedtrain.integrations.ignite import attach_schedule

        s = shape
        g = torch.Generator().manual_seed(0)
        batches = [torch.randn(n, 2, generator=g) for n in s.rows_per_batch()]
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)

        def train_step(engine: Engine, batch: torch.Tensor) -> float:
            loss = model(batch).pow(2).mean() / s.accum
            loss.backward()
            if engine.state.iteration % s.accum == 0:  # batches_per_step's rule
                opt.step()
                opt.zero_grad()
            return float(loss.item())

        engine = DeterministicEngine(train_step)

        def act(name: str) -> Callable[[Engine], None]:
            return lambda _: actions.get(name, lambda: None)()

        handle = attach_schedule(
            engine, schedule, {n: act(n) for n in schedule.names}, batches_per_step=s.accum,
            samples=lambda b: b.shape[0], tokens=lambda b: b.numel(), record=True,
            control=control, to_save=None if control is None else {
                "model": model, "optimizer": opt, "trainer": engine})
        if resume:
            found = sorted((folder / "checkpoints").glob("preempted_checkpoint_*.pt"),
                           key=lambda p: int(p.stem.rsplit("_", 1)[1]))
            assert found, "no preemption checkpoint to resume from"
            Checkpoint.load_objects(handle.to_save, torch.load(found[-1], weights_only=False))
        code = 0
        try:
            engine.run(batches, max_epochs=s.epochs)
        except SystemExit as exc:
            code = int(exc.code or 0)
        return Ran(list(handle.driver.firings), code,
                   [p.detach().clone() for p in model.parameters()])


IGNITE = IgniteAdapter()
ADAPTERS["ignite"] = IGNITE
