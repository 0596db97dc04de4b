"""One journal, five engines: the same schedtrain callbacks run by schedtrain's own
``Trainer``, by ``CallbackDriver`` in a hand-written loop, and inside Lightning, Ignite and
the HF ``Trainer`` call their hooks and fire in the same order at the same clock, so the
engines cannot drift apart."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("lightning")
pytest.importorskip("ignite")
pytest.importorskip("transformers")
import lightning.pytorch as pl
from host_strategies import host_triggers
from ignite.engine import Engine
from test_hosted_transformers import train as hf_train
from torch.utils.data import DataLoader
from training_helpers import UnevenData, tiny_model

from schedtrain import Schedule, Scheduled, ScheduleError, ScheduleWarning, Unit, every, on
from schedtrain.callbacks import Callback
from schedtrain.integrations import ignite as ig
from schedtrain.integrations import lightning as li
from schedtrain.integrations import transformers as hf
from schedtrain.integrations.hosted import CallbackDriver
from schedtrain.training import Trainer

for _name in ("lightning", "lightning.pytorch", "lightning.fabric"):
    logging.getLogger(_name).setLevel(logging.ERROR)

Entry = tuple[str, str, int, int]
"""(callback, hook, global_step, epoch_num) of one hook call or firing."""


class Journal(Callback):
    """Writes each hook the engine calls, and each firing, to a journal shared by all."""

    def __init__(self, journal: list[Entry]) -> None:
        self.journal = journal

    def _note(self, hook: str) -> None:
        self.journal.append((self.name, hook, self.global_step, self.epoch_num))

    def _before_train(self) -> None:
        self._note("before_train")

    def _before_epoch(self) -> None:
        self._note("before_epoch")

    def _trigger_step(self) -> None:
        self._note("trigger_step")

    def _before_firings(self) -> None:
        self._note("before_firings")

    def _trigger(self) -> None:
        self._note("trigger")

    def _after_epoch(self) -> None:
        self._note("after_epoch")

    def _after_train(self) -> None:
        self._note("after_train")


Triggers = dict[str, Any]
Engine_ = Callable[[Schedule, int, int, Path], None]


def journaled(triggers: Triggers) -> tuple[Schedule, list[Entry]]:
    journal: list[Entry] = []
    return Schedule([Scheduled(t, Journal(journal), n) for n, t in triggers.items()]), journal


def own_trainer(schedule: Schedule, epochs: int, steps: int, _: Path) -> None:
    model, opt = tiny_model()
    Trainer(model, opt, UnevenData([steps] * epochs), torch.nn.functional.mse_loss,
            schedule=schedule, max_epochs=epochs).fit()


def own_loop(schedule: Schedule, epochs: int, steps: int, _: Path) -> None:
    driver = CallbackDriver(schedule)
    driver.train_start()
    for _epoch in range(epochs):
        driver.epoch_start()
        for _step in range(steps):
            driver.step()
        driver.epoch_end()
    driver.train_end()


class _Module(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def lightning(schedule: Schedule, epochs: int, steps: int, _: Path) -> None:
    pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu",
               max_epochs=epochs, callbacks=[li.ScheduleCallback(schedule)]).fit(
        _Module(), DataLoader(torch.zeros(steps * 2, 3), batch_size=2))


def ignite(schedule: Schedule, epochs: int, steps: int, _: Path) -> None:
    engine = Engine(lambda e, batch: 0.0)
    ig.attach_schedule(engine, schedule)
    engine.run([torch.zeros(2, 3)] * steps, max_epochs=epochs)


def transformers(schedule: Schedule, epochs: int, steps: int, out: Path) -> None:
    hf_train(out, hf.ScheduleCallback(schedule), epochs=epochs, steps=steps, accum=1)


HOSTS: list[Engine_] = [own_loop, lightning, ignite, transformers]
TRIGGERS = st.dictionaries(st.sampled_from(["a", "b", "c"]),
                           host_triggers([Unit.STEP, Unit.EPOCH]), min_size=1, max_size=3)


@pytest.mark.filterwarnings("ignore")
class TestSameJournal:
    @settings(max_examples=3, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(triggers=TRIGGERS, epochs=st.integers(1, 2), steps=st.integers(1, 3))
    @example(triggers={"a": every("2 steps"), "b": on("epoch_end") | on("train_start"),
                       "c": on("train_end") | on("epoch_start")}, epochs=2, steps=3)
    def test_hooks_and_firings_in_the_trainers_order(
            self, triggers: Triggers, epochs: int, steps: int,
            tmp_path_factory: pytest.TempPathFactory) -> None:
        """Every hook call and firing, with the callback's name, ``global_step`` and
        ``epoch_num``, in the order schedtrain's ``Trainer`` makes them: the same list
        from each host's callback driver."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ScheduleWarning)
            try:
                Schedule(triggers).compile()
            except ScheduleError:
                assume(False)
            schedule, expected = journaled(triggers)
            own_trainer(schedule, epochs, steps, Path())
            assert ("a" if "a" in triggers else next(iter(triggers)),
                    "before_train", 0, 0) in expected
            for host in HOSTS:
                schedule, journal = journaled(triggers)
                host(schedule, epochs, steps, tmp_path_factory.mktemp(host.__name__))
                assert (host.__name__, journal) == (host.__name__, expected)
