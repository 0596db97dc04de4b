"""GradientAccumulationScheduler: micro-batches per step by epoch, every counter exact."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset
from training_helpers import comparable

from schedtrain import Schedule, SpecError, at, every, simulate
from schedtrain.callbacks import Callback, GradientAccumulationScheduler, ModelSaver
from schedtrain.spec import loads_spec
from schedtrain.training import Trainer
from schedtrain.training.from_spec import build_callbacks

BATCHES, BATCH_SIZE, EPOCHS = 7, 2, 4


class Counters(Callback):
    """Records the clock at each firing."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, ...]] = []

    def _trigger(self) -> None:
        t = self.now
        self.seen.append((t.step, t.step_in_epoch, t.batch, t.sample, t.epoch))


def _data() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCHES * BATCH_SIZE, 3, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=BATCH_SIZE,
                      shuffle=True)


def _trainer(schedule: dict[int, int] | None, triggers: dict[str, Any],
             bindings: dict[str, Any], run_dir: Path | None = None,
             grad_accum: int = 1) -> Trainer:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    if schedule is not None:
        triggers = {"accum": every("1 epoch"), **triggers}
        bindings = {"accum": GradientAccumulationScheduler(schedule), **bindings}
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05), _data(),
                   torch.nn.functional.mse_loss, schedule=Schedule(triggers),
                   bindings=bindings, max_epochs=EPOCHS, run_dir=run_dir,
                   grad_accum=grad_accum)


_schedules = st.dictionaries(st.integers(0, EPOCHS - 1), st.integers(1, 4), min_size=1,
                             max_size=3)


def _lengths(gas: GradientAccumulationScheduler) -> list[int]:
    return [math.ceil(BATCHES / gas.factor(e)) for e in range(EPOCHS)]


@settings(max_examples=10, deadline=None)
@given(_schedules)
def test_counters_follow_the_accumulation_of_each_epoch(schedule: dict[int, int]) -> None:
    """At every step: step, step_in_epoch, batch and sample are what the epoch's
    accumulation makes them (a short last step holds the epoch's leftover batches)."""
    rec = Counters()
    _trainer(schedule, {"rec": every("1 step")}, {"rec": rec}).fit()
    gas = GradientAccumulationScheduler(schedule)
    expected, step, batch = [], 0, 0
    for e in range(EPOCHS):
        f = gas.factor(e)
        for k in range(1, math.ceil(BATCHES / f) + 1):
            step += 1
            batch += min(f, BATCHES - (k - 1) * f)
            expected.append((step, k, batch, batch * BATCH_SIZE, e))
    assert rec.seen == expected


@settings(max_examples=10, deadline=None)
@given(_schedules)
def test_step_and_epoch_firings_agree_with_simulate(schedule: dict[int, int]) -> None:
    """simulate() with each epoch's length in steps fires the same step and epoch triggers
    at the same steps, epochs and places in the epoch."""
    triggers = {"a": every("3 steps"), "b": every("1 epoch"), "c": at("5 steps", "9 steps")}
    trainer = _trainer(schedule, triggers, {n: Counters() for n in triggers})
    trainer.fit()
    gas = GradientAccumulationScheduler(schedule)
    sim = simulate(Schedule(triggers), epoch_lengths=_lengths(gas))

    def key(firings: Any) -> list[tuple[Any, ...]]:
        return [(f.callback, f.event, f.timestamp.step, f.timestamp.epoch,
                 f.timestamp.step_in_epoch) for f in firings if f.callback != "accum"]
    assert key(trainer.firings) == key(sim)


def test_same_as_a_constant_accumulation() -> None:
    """{0: 2} trains exactly as grad_accum=2: the same weights, bit for bit."""
    a = _trainer({0: 2}, {}, {})
    a.fit()  # each trainer seeds the global generator, which shuffles the data
    b = _trainer(None, {}, {}, grad_accum=2)
    b.fit()
    for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(p, q)


@settings(max_examples=6, deadline=None)
@given(st.integers(1, 13))
def test_resume_anywhere_equals_uninterrupted(tmp_path_factory: pytest.TempPathFactory,
                                              cut: int) -> None:
    """Resumed from a checkpoint at any step (inside an epoch whose accumulation changed
    too), the run fires and trains exactly as the uninterrupted one."""
    schedule = {0: 1, 1: 3, 3: 2}  # epoch lengths 7, 3, 3, 4 steps: 17 in all

    def make(run_dir: Path) -> Trainer:
        return _trainer(schedule, {"save": at(f"{cut} steps"), "rec": every("2 steps")},
                        {"save": ModelSaver(keep=None), "rec": Counters()}, run_dir)
    full_dir = tmp_path_factory.mktemp("full")
    full = make(full_dir)
    full.fit()
    resumed = make(tmp_path_factory.mktemp("resumed"))
    resumed.resume(full_dir / "checkpoints" / f"step-{cut:08d}.pt")
    resumed.fit()
    # the checkpoint is written once every firing of its event has run
    done = [i for i, f in enumerate(full.firings)
            if f.event == "step_end" and f.timestamp.step == cut][-1] + 1
    assert comparable(resumed.firings) == comparable(full.firings[done:])
    for p, q in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_from_toml_and_bad_schedules() -> None:
    """TOML keys are epochs as strings; a bad key or factor is refused at its path."""
    body = '[callbacks.acc]\ntype = "GradientAccumulationScheduler"\n{}\n' \
           'trigger = {{ every = "1 epoch" }}\n'
    gas = build_callbacks(loads_spec(body.format('schedule = { 0 = 1, 4 = 2 }')))["acc"]
    assert [gas.factor(e) for e in range(6)] == [1, 1, 1, 1, 2, 2]
    with pytest.raises(SpecError, match=r"callbacks\.acc\.schedule: expected a table of "
                                        r"epoch = micro-batches per step"):
        loads_spec(body.format('schedule = { first = 2 }'))
    with pytest.raises(ValueError, match=r"`schedule\[3\]` must be a whole number >= 1"):
        GradientAccumulationScheduler({3: 0})


def test_plan_says_what_it_cannot_predict() -> None:
    """A spec with the scheduler is planned with a warning naming it and what is not exact."""
    from schedtrain.planning import plan_spec

    spec = loads_spec('[clock]\nepoch_lengths = [8, 8, 4]\n'
                      '[callbacks.acc]\ntype = "GradientAccumulationScheduler"\n'
                      'schedule = { 2 = 2 }\ntrigger = { every = "1 epoch" }\n')
    plan = plan_spec(spec)
    assert len(plan.notes) == 1
    assert plan.notes[0].startswith("callbacks.acc (GradientAccumulationScheduler)")
    assert "batch-, sample- and token-unit firings are not predicted" in plan.notes[0]
    assert [f.timestamp.step for f in plan.log] == [8, 16, 20]
