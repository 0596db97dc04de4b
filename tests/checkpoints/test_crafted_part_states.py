"""A checkpoint's parts' own states, crafted with a valid checksum: the generators, the
metric store, the losses, a callback's or a trigger's state. Each part is tried with its
state before a resume trusts it: one that cannot take it makes the checkpoint damaged,
named by key path (``resume(path)`` refused in one line, nothing restored), and
``--resume auto`` passes it over for the previous one; the run's own parts are left as
they were by the trial."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset
from training_helpers import tiny_model

from schedtrain import Schedule, every, improved
from schedtrain.callbacks import EarlyStopping, ModelSaver
from schedtrain.checkpoints import CheckpointError
from schedtrain.checkpoints.format import digest
from schedtrain.checkpoints.rng import rng_state
from schedtrain.readback import DamagedFile
from schedtrain.training import Trainer
from schedtrain.training.log_offset import check_offset

mse = torch.nn.functional.mse_loss


def _trainer(run_dir: Path) -> Trainer:
    model, opt = tiny_model()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, 3, generator=g)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4,
                        shuffle=True)
    return Trainer(model, opt, loader, mse,
                   schedule=Schedule({"save": every("1 step"),
                                      "stop": every("1 step") & improved("train/loss")}),
                   bindings={"save": ModelSaver(keep=None),
                             "stop": EarlyStopping("train/loss", patience=100)},
                   max_epochs=1, run_dir=run_dir, handle_signals=False, device="cpu")


def _craft(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    state = torch.load(path, weights_only=True)
    change(state["run"])
    state = {k: v for k, v in state.items() if k != "checksum"}
    state["checksum"] = {"algorithm": "blake2b-256", "digest": digest(state)}
    torch.save(state, path)


def _set(*keys: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(run: dict[str, Any]) -> None:
        part = run
        for k in keys[:-1]:
            part = part[k]
        part[keys[-1]] = value
    return change


_CRAFTED = {  # a crafted part state, and the key path a resume names
    "generators a string": (_set("rng", value="x"), "run.rng"),
    "numpy's generator a table": (_set("rng", "numpy", value={"a": 1}), "run.rng"),
    "the epoch's generators a number": (_set("data", "epoch_rng", value=1.5),
                                        "run.data.epoch_rng"),
    "a metric named with an escape": (
        lambda run: run["metrics"]["pending"].append(["\x1b[31mred", 1, 0, 0.5, 0.0]),
        "run.metrics.pending"),
    "a metric row too short": (
        lambda run: run["metrics"]["history"].setdefault("train/loss", []).append([1]),
        "run.metrics.history"),
    "a metric value a list": (
        lambda run: run["metrics"]["pending"].append(["x", 1, 0, [1], 0.0]),
        "run.metrics.pending"),
    "the losses' start a string": (_set("losses", "since", value="x"), "run.losses"),
    "the stopper's wait a table": (_set("callbacks", "stop", "wait", value={}),
                                   "run.callbacks.stop"),
    "the clock a list": (_set("clock", "now", value=[1, 2]), "run.clock"),
    "the loss sum past float32's range": (_set("losses", "sum", value=1e308),
                                          "run.losses.sum"),
    "the clock's epoch not the checkpoint's": (_set("clock", "now", "epoch", value=5),
                                               "run.clock.now.epoch"),
    "the losses' start before train/loss was last put": (_set("losses", "since", value=0),
                                                        "run.losses.since"),
    "the log's length 0": (_set("events_offset", value=0), "run.events_offset"),
    "the log's length past its end": (_set("events_offset", value=10**12),
                                      "run.events_offset"),
    "a step in the epoch past the step": (_set("clock", "now", "step_in_epoch", value=10**12),
                                          "run.clock.now.step_in_epoch"),
    "a trigger's state missing": (lambda run: run["table"]["triggers"].pop("stop"),
                                  "run.table.triggers.stop"),
    "a callback's state missing": (lambda run: run["callbacks"].pop("stop"), "run.callbacks"),
    "a value to write that its history lacks": (
        lambda run: run["metrics"]["pending"].append(["train/loss", 0, 0, 0.25, 0.0]),
        "run.metrics.pending"),
}


@pytest.mark.parametrize("how", sorted(_CRAFTED))
def test_a_part_that_cannot_take_its_state_makes_the_checkpoint_damaged(
        tmp_path: Path, how: str) -> None:
    change, key = _CRAFTED[how]
    _trainer(tmp_path).fit()
    saved = sorted((tmp_path / "checkpoints").glob("step-*.pt"))
    newest, previous = saved[-1], saved[-2]
    _craft(newest, change)
    # The log is judged where it is the checkpoint's own: a resume in its run directory.
    again = _trainer(tmp_path if "log" in how else tmp_path / "again")
    before = rng_state()
    with pytest.raises(CheckpointError) as caught:
        again.resume(newest)
    text = str(caught.value)
    assert key in text and "\n" not in text and "\x1b" not in text
    assert again.clock.step == 0 and again.metrics.state_dict()["history"] == {}
    assert torch.equal(rng_state()["torch"], before["torch"])  # the trial put them back
    resumed = _trainer(tmp_path)
    assert resumed.resume("auto") == previous
    assert resumed.clock.step == int(previous.stem.split("-")[1])


def _log(path: Path, steps: list[int]) -> bytes:
    body = "".join(f'{{"kind": "firing", "callback": "c", "step": {s}}}\n'
                   f'{{"kind": "scalar", "name": "x", "value": 1.0, "step": 0}}\n'
                   for s in steps).encode()
    path.write_bytes(body)
    return body


@given(st.lists(st.integers(0, 50), min_size=1, max_size=12).map(sorted),
       st.integers(0, 50), st.data())
def test_a_log_length_is_taken_exactly_when_it_falls_between_the_steps_firings(
        steps: list[int], step: int, data: st.DataObject) -> None:
    """``run.events_offset`` is taken where it is within the log and the log's firings
    before it come at or before the checkpoint's step, those after it at or after."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "events.jsonl"
        body = _log(log, steps)
        ends = [i + 1 for i, b in enumerate(body) if b == ord("\n")]
        offset = data.draw(st.sampled_from([0, *ends, len(body) + 100]))
        written = body[:offset].count(b'"firing"')
        before, after = steps[:written], steps[written:]
        fits = offset <= len(body) and all(s <= step for s in before) and all(
            s >= step for s in after)
        try:
            check_offset(log, offset, step, "ck.pt")
        except DamagedFile as exc:
            assert not fits and exc.key == "run.events_offset"
        else:
            assert fits
