"""Host runs killed and resumed the host's own way, against ``simulate()``.

A case is a random schedule, a run shape (epochs, micro-batches per epoch, accumulation,
rows per batch and in an epoch's last batch) and a kill point: the number of micro-batches
done when the process dies, as a crash would (an exception out of a host hook, no clean
end). The run is then resumed the host's own way from its newest checkpoint (one is
written at every optimizer step; none yet: started afresh). ``check(case, folder)``
returns what was compared and raises ``AssertionError`` when the firings (every counter
but time) or the host step each action saw differ from ``simulate()``'s.

Shared by ``tests/test_host_agreement_table.py`` (hypothesis, a few cases per host) and
``benchmarks/host_agreement.py`` (many, as a table). Run control's cases (a live retime
against ``continue_with``, a preemption by a signal or a cloud notice saved and resumed
the host's way) are in ``host_control_cases.py``, one adapter per host.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from host_strategies import counters, host_schedules
from hypothesis import strategies as st

# The hosts' tiny models, imported here: a test module's @given defined inside a running
# test is a nested given. Each of them skips when its host is not installed.
from test_integrations_lightning import Module, trainer
from test_integrations_transformers import SEQ, dataset, model

from schedtrain import FiringLog, Schedule, ScheduleWarning, Unit, simulate

Row = tuple[object, ...]
HOSTS = ("lightning", "transformers", "ignite")


@dataclass(frozen=True)
class Shape:
    """A run: ``batches`` micro-batches an epoch of ``rows`` rows (``last`` in the epoch's
    last), ``accum`` of them a step (a partial step ends the epoch where the host has one)."""

    epochs: int
    batches: int
    accum: int
    rows: int
    last: int

    @property
    def total(self) -> int:
        return self.epochs * self.batches

    def rows_per_batch(self) -> list[int]:
        return [self.rows] * (self.batches - 1) + [self.last]

    def closing(self) -> set[int]:
        """The micro-batches (counted over the run) whose end takes an optimizer step."""
        ends = [*range(self.accum, self.batches + 1, self.accum)]
        if self.batches % self.accum:
            ends.append(self.batches)
        return {e * self.batches + j for e in range(self.epochs) for j in ends}


@dataclass(frozen=True)
class Case:
    host: str
    schedule: Schedule
    shape: Shape
    kill: int
    """Micro-batches done when the process dies, before the host's next hook (1 .. total;
    total - 1 for Ignite)."""


@dataclass(frozen=True)
class Compared:
    """What one case compared: firings and actions' host steps, both equal."""

    firings: int
    actions: int
    resumed_from: int | None
    """The step of the checkpoint resumed from (None: none yet, started afresh)."""


# -- random cases --------------------------------------------------------------------------

UNITS = {"lightning": [Unit.STEP, Unit.BATCH, Unit.EPOCH, Unit.SAMPLE, Unit.TOKEN],
         "transformers": [Unit.STEP, Unit.BATCH, Unit.EPOCH, Unit.TOKEN],
         "ignite": [Unit.STEP, Unit.BATCH, Unit.EPOCH, Unit.SAMPLE, Unit.TOKEN]}
METRIC = {"ignite": "loss"}  # the Ignite engine's output; the other hosts' runs log none


@st.composite
def shapes(draw: st.DrawFn, host: str) -> Shape:
    """Ignite counts steps as iterations // accum over the run, so its epochs hold whole
    steps; Lightning and HF step on an epoch's last batch when fewer than accum remain."""
    rows = draw(st.integers(1, 3))
    last = draw(st.integers(1, rows))
    epochs = draw(st.integers(1, 3 if host == "ignite" else 2))
    accum = draw(st.integers(1, 3))
    batches = accum * draw(st.integers(1, 4)) if host == "ignite" else draw(st.integers(1, 6))
    if epochs * batches < 2:
        batches = 2 * accum if host == "ignite" else 2
    return Shape(epochs, batches, accum, rows, last)


@st.composite
def cases(draw: st.DrawFn, host: str) -> Case:
    schedule = draw(host_schedules(UNITS[host], METRIC.get(host)), label="schedule")
    shape = draw(shapes(host), label="shape")
    # Ignite starts a run whose last iteration is done afresh: killed before that one
    last = shape.total - 1 if host == "ignite" else shape.total
    kill = draw(st.integers(1, last), label="killed after micro-batch")
    return Case(host, schedule, shape, kill)


# -- what simulate() predicts --------------------------------------------------------------

TOKENS_PER_ROW = {"lightning": 3, "transformers": SEQ, "ignite": 2}


def loss_at(step: int) -> float:
    """What the Ignite engine outputs at the iteration that ends step ``step``."""
    return float((step * 7) % 5)


def simulated(case: Case) -> FiringLog:
    s = case.shape
    rows = s.rows_per_batch()
    tokens = [TOKENS_PER_ROW[case.host] * n for n in rows]
    kwargs: dict[str, Any] = {"tokens_per_batch": tokens}
    if case.host != "transformers":  # HF counts no samples
        kwargs["samples_per_batch"] = rows
    if case.host == "ignite":
        steps = s.total // s.accum
        kwargs["metrics"] = {"loss": [(k, loss_at(k)) for k in range(1, steps + 1)]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        return simulate(case.schedule, epochs=s.epochs, batches_per_epoch=s.batches,
                        batches_per_step=s.accum, **kwargs)


def predicted_actions(case: Case, log: FiringLog) -> list[Row]:
    """(callback, event, host step) each action should see: Ignite's iteration is the
    clock's batch; Lightning's and HF's global_step is the clock's step, but at a batch
    end that takes an optimizer step the host has already counted it."""
    if case.host == "ignite":  # its actions are not told the event
        return [(f.callback, f.timestamp.batch) for f in log]
    closing = case.shape.closing()
    return [(f.callback, f.event, f.timestamp.step + (f.event == "batch_end"
                                                      and f.timestamp.batch in closing))
            for f in log]


# -- the runs ------------------------------------------------------------------------------


class Killed(Exception):
    """Stands for the process dying."""


@dataclass
class Part:
    """One process's run: the host steps its actions saw and its firings."""

    seen: list[Row]
    firings: list[Any]


@dataclass
class Saved:
    """Per checkpoint step: how many actions had run and firings were made when it was
    written (what a resumed process keeps of the killed one)."""

    at: dict[int, tuple[int, int]]

    def newest(self) -> int | None:
        return max(self.at, default=None)

    def kept(self, part: Part) -> tuple[list[Row], list[Any]]:
        step = self.newest()
        if step is None:
            return [], []
        actions, firings = self.at[step]
        return part.seen[:actions], part.firings[:firings]


def check(case: Case, folder: Path) -> Compared:
    """Run ``case`` killed and resumed in ``folder``; assert it agrees with simulate()."""
    run = {"lightning": run_lightning, "transformers": run_transformers,
           "ignite": run_ignite}[case.host]
    killed, saved, resumed = run(case, folder)
    seen, firings = saved.kept(killed)
    seen += resumed.seen
    firings += resumed.firings
    log = simulated(case)
    want = counters(log)
    where = f"{case.host} killed after micro-batch {case.kill}, resumed from step " \
            f"{saved.newest()}"
    assert counters(firings) == want, where
    assert seen == predicted_actions(case, log), where
    return Compared(len(want), len(seen), saved.newest())


def _dies(run: Callable[[], object]) -> None:
    """Run until the kill (a run that ends before its kill point is a broken case)."""
    try:
        run()
    except Killed:
        return
    raise AssertionError("the run ended before its kill point")


def _quietly(build: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        return build()


for _name in ("lightning", "lightning.pytorch", "lightning.fabric", "accelerate"):
    logging.getLogger(_name).setLevel(logging.ERROR)
logging.getLogger("ignite").setLevel(logging.CRITICAL)  # each kill is logged as an error


def run_lightning(case: Case, folder: Path) -> tuple[Part, Saved, Part]:
    """Lightning: ``ModelCheckpoint(every_n_train_steps=1)``; killed from the hook after
    the micro-batch; resumed with ``fit(ckpt_path=...)``."""
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader
    from torchdata.stateful_dataloader import StatefulDataLoader

    from schedtrain.integrations.lightning import ScheduleCallback

    s = case.shape
    # Lightning resumes a plain DataLoader mid-epoch from the epoch's first batch (the
    # uneven last one never comes), so a loader with its own state is the way there; but
    # resumed from an epoch's last batch, Lightning 2.6 skips the next epoch of such a
    # loader (it finds it exhausted), where a plain one runs it.
    rows = torch.zeros((s.batches - 1) * s.rows + s.last, 3)
    resumed_at = max((b for b in s.closing() if b <= case.kill), default=0)
    loader = StatefulDataLoader if resumed_at % s.batches else DataLoader

    def part() -> tuple[ScheduleCallback, Part]:
        seen: list[Row] = []

        def action(name: str) -> Callable[..., None]:
            def act(trainer: pl.Trainer, module: pl.LightningModule, event: str) -> None:
                seen.append((name, event, trainer.global_step))
            return act

        cb = _quietly(lambda: ScheduleCallback(
            case.schedule, {n: action(n) for n in case.schedule.names},
            tokens=lambda b: b.numel(), record=True))
        return cb, Part(seen, cb.firings)

    def fit(callbacks: list[Any], ckpt_path: Path | None = None) -> None:
        trainer(callbacks, max_epochs=s.epochs, accumulate_grad_batches=s.accum).fit(
            Module(), loader(rows, batch_size=s.rows), ckpt_path=ckpt_path)

    saved = Saved({})
    cb, killed = part()

    class Kill(pl.Callback):
        done = 0

        def on_train_batch_end(self, tr: pl.Trainer, *_: Any) -> None:
            self.done += 1
            if tr.global_step and tr.global_step not in saved.at:  # a step: saved next
                saved.at[tr.global_step] = (len(killed.seen), len(killed.firings))

        def on_train_batch_start(self, tr: pl.Trainer, *_: Any) -> None:
            if self.done == case.kill:
                raise Killed

        on_train_epoch_end = on_train_batch_start  # the hook after an epoch's last batch

    saver = pl.callbacks.ModelCheckpoint(dirpath=folder, every_n_train_steps=1,
                                         save_top_k=-1, filename="{step}")
    _dies(lambda: fit([cb, Kill(), saver]))
    newest = saved.newest()
    cb2, resumed = part()
    fit([cb2], None if newest is None else folder / f"step={newest}.ckpt")
    return killed, saved, resumed


def run_transformers(case: Case, folder: Path) -> tuple[Part, Saved, Part]:
    """HF: ``save_strategy="steps", save_steps=1``; killed from the first hook after the
    micro-batch; resumed with ``train(resume_from_checkpoint=...)``."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from schedtrain.integrations.transformers import ScheduleCallback

    s = case.shape

    def part() -> tuple[ScheduleCallback, Part]:
        seen: list[Row] = []

        def action(name: str) -> Callable[..., None]:
            def act(args: Any, state: Any, control: Any, event: str, **kw: Any) -> None:
                seen.append((name, event, state.global_step))
            return act

        cb = _quietly(lambda: ScheduleCallback(
            case.schedule, {n: action(n) for n in case.schedule.names}, record=True))
        return cb, Part(seen, cb.firings)

    def train(callbacks: list[Any], resume: Path | None = None, **save: Any) -> None:
        args = TrainingArguments(
            output_dir=str(folder), use_cpu=True, report_to="none", disable_tqdm=True,
            per_device_train_batch_size=s.rows, gradient_accumulation_steps=s.accum,
            num_train_epochs=s.epochs, logging_strategy="no", eval_strategy="no",
            include_num_input_tokens_seen=True, seed=0, **({"save_strategy": "no"} | save))
        Trainer(model=model(), args=args,
                train_dataset=dataset((s.batches - 1) * s.rows + s.last),
                callbacks=callbacks).train(resume_from_checkpoint=resume and str(resume))

    saved = Saved({})
    cb, killed = part()

    class Kill(TrainerCallback):
        done = 0
        armed = False  # the kill's micro-batch took a step: die before what comes next

        def on_substep_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.done += 1
            if self.done == case.kill:
                raise Killed

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.done += 1
            self.armed = self.done == case.kill

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            saved.at[state.global_step] = (len(killed.seen), len(killed.firings))

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if self.armed:
                raise Killed

        on_epoch_end = on_step_begin

    _dies(lambda: train([cb, Kill()], save_strategy="steps", save_steps=1))
    newest = saved.newest()
    cb2, resumed = part()
    train([cb2], None if newest is None else folder / f"checkpoint-{newest}")
    return killed, saved, resumed


def run_ignite(case: Case, folder: Path) -> tuple[Part, Saved, Part]:
    """Ignite: ``Checkpoint`` of the engine and the schedule at every step; killed from
    ``ITERATION_COMPLETED``; resumed with ``Checkpoint.load_objects``."""
    import torch
    from ignite.engine import DeterministicEngine, Engine, Events
    from ignite.handlers import Checkpoint, DiskSaver

    from schedtrain.integrations.ignite import ScheduleHandle, attach_schedule

    s = case.shape
    batches = [torch.zeros(n, TOKENS_PER_ROW["ignite"]) for n in s.rows_per_batch()]

    def part() -> tuple[Engine, ScheduleHandle, Part]:
        engine = DeterministicEngine(lambda e, batch: loss_at(e.state.iteration // s.accum))
        seen: list[Row] = []

        def action(name: str) -> Callable[[Engine], None]:
            return lambda e: seen.append((name, e.state.iteration))

        handle = _quietly(lambda: attach_schedule(
            engine, case.schedule, {n: action(n) for n in case.schedule.names},
            batches_per_step=s.accum, samples=lambda b: b.shape[0],
            tokens=lambda b: b.numel(), metrics=lambda e: {"loss": e.state.output},
            record=True))
        return engine, handle, Part(seen, handle.driver.firings)

    saved = Saved({})
    engine, handle, killed = part()
    ckpt = Checkpoint({"trainer": engine, "schedule": handle},
                      DiskSaver(folder, require_empty=False), n_saved=None)
    engine.add_event_handler(Events.ITERATION_COMPLETED(every=s.accum), ckpt)

    @engine.on(Events.ITERATION_COMPLETED(every=s.accum))
    def note(e: Engine) -> None:
        saved.at[e.state.iteration // s.accum] = (len(killed.seen), len(killed.firings))

    @engine.on(Events.ITERATION_COMPLETED(once=case.kill))
    def kill(_: Engine) -> None:
        raise Killed

    _dies(lambda: engine.run(batches, max_epochs=s.epochs))
    engine, handle, resumed = part()
    if saved.newest() is None:
        engine.run(batches, max_epochs=s.epochs)
    else:
        assert ckpt.last_checkpoint is not None
        # DeterministicEngine keeps its RNG states (numpy arrays) too: our own file
        state = torch.load(folder / str(ckpt.last_checkpoint), weights_only=False)
        Checkpoint.load_objects({"trainer": engine, "schedule": handle}, state)
        engine.run(batches)
    return killed, saved, resumed
