"""A run crashed at random points and resumed each time equals the uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

from schedtrain import Schedule, every, improved, on, plateau
from schedtrain.callbacks import Callback, InferenceRunner, ModelSaver
from schedtrain.checkpoints import newest_valid
from schedtrain.errors import Preempted
from schedtrain.training import Trainer

STEPS_PER_EPOCH = 10
EPOCHS = 4
#: The uninterrupted run's log and weights.
Whole = tuple[list[dict[str, Any]], list[torch.Tensor]]


class Crash(Callback):
    """Raises at the end of one step, as a crash there would end the process."""

    def __init__(self, at: int | None) -> None:
        self.at = at

    def _trigger(self) -> None:
        if self.now.step == self.at:
            raise RuntimeError(f"crash at step {self.at}")


class Preempt(Callback):
    """Sends this process SIGTERM at the end of one step, as a cluster's scheduler would."""

    def __init__(self, at: int | None) -> None:
        self.at = at

    def _trigger(self) -> None:
        if self.now.step == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


class Note(Callback):
    """Puts a metric that moves with the weights, so triggers depend on the run's state."""

    def _trigger(self) -> None:
        self.metrics.put("w/norm", sum(p.detach().abs().sum() for p in
                                       self.model.parameters()))


def _trainer(run_dir: Path, crash_at: int | None, accum: int, epochs: int, *,
             preempt: bool = False, **extra: Any) -> Trainer:
    torch.manual_seed(0)
    x = torch.randn(STEPS_PER_EPOCH * accum * 4, 6)
    y = (x[:, 0] - x[:, 1] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Dropout(0.3),
                                torch.nn.ReLU(), torch.nn.Linear(16, 2))
    schedule = Schedule({
        "validate": every("1 epoch") | every("7 steps"),
        "note": every("3 steps"),
        "save": every("2 steps") | on("train_end"),
        # val/loss gains 0.005-0.06 a check: some inside the band, so the best is not
        # always the last value and the resume must bring back the right one
        "best": improved("val/loss", min_delta=0.02),
        "flat": every("1 epoch") & plateau("w/norm", 2),
        "crash": every("1 step"),
    })
    return Trainer(
        model, torch.optim.Adam(model.parameters(), lr=0.01),
        DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True),
        torch.nn.functional.cross_entropy, schedule=schedule,
        bindings={"validate": InferenceRunner(), "note": Note(), "save": ModelSaver(keep=2),
                  "best": Callback(), "flat": Callback(),
                  "crash": Preempt(crash_at) if preempt else Crash(crash_at)},
        val_data=DataLoader(TensorDataset(x[:16], y[:16]), batch_size=8),
        max_epochs=epochs, grad_accum=accum, run_dir=run_dir, **extra)


def _log(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("time", "seconds", "duration")} for r in rows]


def _run_with_crashes(run_dir: Path, crashes: list[int], accum: int, epochs: int, *,
                      preempt: bool = False) -> Trainer:
    for at in [*crashes, None]:
        t = _trainer(run_dir, at, accum, epochs, preempt=preempt)
        found = newest_valid(run_dir / "checkpoints")
        if found is not None:
            t.resume(found)
        else:
            t.start_over()
        try:
            t.fit()
        except RuntimeError as exc:
            assert "crash at step" in str(exc)
            continue
        except Preempted as exc:
            assert exc.step == at and exc.checkpoint is not None
            continue
        assert at is None, f"the run went past step {at} without its crash"
        return t
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], Whole]:
    """The uninterrupted run (seeded, so the same each time) for one ``grad_accum``,
    trained once per module: every example compares its crashed run with it."""
    done: dict[int, Whole] = {}

    def get(accum: int) -> Whole:
        if accum not in done:
            run_dir = tmp_path_factory.mktemp("whole")
            whole = _trainer(run_dir, None, accum, EPOCHS)
            whole.fit()
            done[accum] = (_log(run_dir), [p.detach().clone() for p in whole.model.parameters()])
        return done[accum]

    return get


def _same_as_whole(whole: Whole, run_dir: Path, resumed: Trainer) -> None:
    log, weights = whole
    assert _log(run_dir) == log
    for a, b in zip(weights, resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)


# Each grad_accum a test of its own (the examples split between them, as many in all as
# one test drew before): two parts pytest-xdist can put on two workers.
@pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")
@pytest.mark.parametrize("accum", [1, 2], ids=["accum1", "accum2"])
@settings(max_examples=4, deadline=None)
@given(crashes=st.lists(st.integers(1, 39), min_size=1, max_size=3, unique=True))
def test_crashes_at_random_steps(whole_run: Callable[[int], Whole], tmp_path_factory:
                                 pytest.TempPathFactory, crashes: list[int],
                                 accum: int) -> None:
    """Up to three crashes at random steps, each resumed from the newest valid checkpoint:
    the same log (firings and scalars) and bit-identical weights as the uninterrupted run."""
    run_dir = tmp_path_factory.mktemp("crashed")
    crashed = _run_with_crashes(run_dir, sorted(crashes), accum, EPOCHS)
    _same_as_whole(whole_run(accum), run_dir, crashed)


@pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")
@pytest.mark.parametrize("accum", [1, 2], ids=["accum1", "accum2"])
@settings(max_examples=3, deadline=None)
@given(preempts=st.lists(st.integers(1, 39), min_size=1, max_size=3, unique=True))
def test_preemptions_at_random_steps(whole_run: Callable[[int], Whole], tmp_path_factory:
                                     pytest.TempPathFactory, preempts: list[int],
                                     accum: int) -> None:
    """SIGTERM at random steps (the checkpoint is taken between two events, with metrics
    not yet written), resumed each time: the same log line for line, identical weights."""
    run_dir = tmp_path_factory.mktemp("preempted")
    resumed = _run_with_crashes(run_dir, sorted(preempts), accum, EPOCHS, preempt=True)
    _same_as_whole(whole_run(accum), run_dir, resumed)


@pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_from_its_own_state(tmp_path: Path, workers: int) -> None:
    """A torchdata StatefulDataLoader (shuffled, with workers) resumes mid-epoch from its
    own state: the same batches, bit-identical weights."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def make(run_dir: Path, crash_at: int | None) -> Trainer:
        torch.manual_seed(0)
        x = torch.randn(48, 6)
        y = (x[:, 0] > 0).long()
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Dropout(0.3),
                                    torch.nn.Linear(8, 2))
        data = stateful.StatefulDataLoader(TensorDataset(x, y), batch_size=4, shuffle=True,
                                           num_workers=workers)
        return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), data,
                       torch.nn.functional.cross_entropy,
                       schedule=Schedule({"save": every("5 steps"), "crash": every("1 step")}),
                       bindings={"save": ModelSaver(keep=None), "crash": Crash(crash_at)},
                       max_epochs=2, run_dir=run_dir)

    whole = make(tmp_path / "whole", None)
    whole.fit()
    crashed = make(tmp_path / "crashed", 7)
    with pytest.raises(RuntimeError, match="crash at step 7"):
        crashed.fit()
    resumed = make(tmp_path / "crashed", None)
    resumed.resume(tmp_path / "crashed" / "checkpoints" / "step-00000005.pt")
    resumed.fit()
    for a, b in zip(whole.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert _log(tmp_path / "crashed") == _log(tmp_path / "whole")
