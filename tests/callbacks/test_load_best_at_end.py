"""MinSaver/MaxSaver(load_best_at_end=True), as pytorch-accelerated's SaveBestModelCallback:
after training the model holds the best checkpoint's weights."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import structlog.testing
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import UnevenData, tiny_model

from schedtrain import SpecError
from schedtrain.callbacks import Callback, EarlyStopping, MaxSaver, MinSaver
from schedtrain.spec import loads_spec
from schedtrain.training import Trainer

mse = torch.nn.functional.mse_loss


class Feed(Callback):
    """Puts the scripted ``val/loss`` of each epoch and keeps the weights it measured."""

    may_stop_alone = False
    produces = ("val/loss",)

    def __init__(self, values: list[float], name: str = "val/loss") -> None:
        self.values, self.metric = values, name
        self.produces = (name,)
        self.weights: list[dict[str, torch.Tensor]] = []

    def _trigger(self) -> None:
        self.weights.append({k: v.clone() for k, v in self.model.state_dict().items()})
        self.metrics.put(self.metric, self.values[self.now.epoch - 1])


def _fit(feed: Feed, *callbacks: Callback, run_dir: Path, epochs: int) -> Trainer:
    model, opt = tiny_model()
    t = Trainer(model, opt, UnevenData([3] * epochs), mse, callbacks=[feed, *callbacks],
                max_epochs=epochs, run_dir=run_dir)
    t.fit()
    return t


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@settings(max_examples=10, deadline=None)
@given(st.lists(st.floats(0, 10), min_size=1, max_size=5), st.booleans())
def test_weights_after_training_are_the_best_epochs(
        tmp_path_factory: pytest.TempPathFactory, values: list[float], maximise: bool) -> None:
    """Whatever the values, the final weights are those of the best epoch (the first of
    equal bests), not the last epoch's."""
    feed = Feed(values)
    saver = (MaxSaver("val/loss", load_best_at_end=True) if maximise
             else MinSaver(load_best_at_end=True))
    t = _fit(feed, saver, run_dir=tmp_path_factory.mktemp("run"), epochs=len(values))
    best = values.index(max(values) if maximise else min(values))
    assert _same(t.model.state_dict(), feed.weights[best])


def test_after_early_stopping_and_logged(tmp_path: Path) -> None:
    """A run stopped by EarlyStopping also ends with the best weights, and says so."""
    feed = Feed([3.0, 1.0, 2.0, 2.5, 0.5])
    with structlog.testing.capture_logs() as logs:
        t = _fit(feed, MinSaver(load_best_at_end=True), EarlyStopping(patience=2),
                 run_dir=tmp_path, epochs=5)
    assert t.stopped and t.clock.epoch == 4
    assert _same(t.model.state_dict(), feed.weights[1])
    loaded = [x for x in logs if x["event"] == "best_checkpoint_loaded"]
    assert loaded and loaded[0]["step"] == 6 and loaded[0]["best"] == 1.0


def test_off_by_default_keeps_last_weights(tmp_path: Path) -> None:
    """Without the option the model keeps the weights training ended with."""
    feed = Feed([1.0, 2.0])
    t = _fit(feed, MinSaver(), run_dir=tmp_path, epochs=2)
    assert not _same(t.model.state_dict(), feed.weights[0])


def test_warns_when_no_best_was_saved(tmp_path: Path) -> None:
    """Only NaN values: nothing saved, a warning, the last weights kept."""
    feed = Feed([math.nan, math.nan])
    with structlog.testing.capture_logs() as logs:
        t = _fit(feed, MinSaver(load_best_at_end=True), run_dir=tmp_path, epochs=2)
    assert [x["event"] for x in logs if x["log_level"] == "warning"] == ["no_best_checkpoint"]
    assert t.outcome == "finished"


def test_failed_run_keeps_its_weights(tmp_path: Path) -> None:
    """A run that fails is not rewound to its best weights (the failure is what matters)."""

    class Boom(Callback):
        def _trigger(self) -> None:
            if self.now.epoch == 2:
                raise RuntimeError("boom")

    feed = Feed([1.0, 2.0, 3.0])
    model, opt = tiny_model()
    t = Trainer(model, opt, UnevenData([3] * 3), mse,
                callbacks=[feed, MinSaver(load_best_at_end=True), Boom()], max_epochs=3,
                run_dir=tmp_path)
    with pytest.raises(RuntimeError, match="boom"):
        t.fit()
    assert t.outcome == "failed"
    assert not _same(t.model.state_dict(), feed.weights[0])


def test_resumed_run_loads_the_best_of_the_first(tmp_path: Path) -> None:
    """The best checkpoint's step is saver state: resumed after it, the run still loads it."""
    feed = Feed([1.0, 2.0, 3.0])
    first = _fit(feed, MinSaver(load_best_at_end=True), run_dir=tmp_path / "a", epochs=3)
    best = first.run_dir / "best" / "min-val-loss.pt"
    model, opt = tiny_model()
    t = Trainer(model, opt, UnevenData([3] * 4), mse,
                callbacks=[Feed([1.0, 2.0, 3.0, 4.0]), MinSaver(load_best_at_end=True)],
                max_epochs=4, run_dir=tmp_path / "a", overwrite=True)
    t.resume(best)
    t.fit()
    assert _same(t.model.state_dict(), feed.weights[0])


def test_toml_key() -> None:
    """TOML: load_best_at_end is a true/false argument of MinSaver and MaxSaver."""
    head = '[callbacks.best]\ntype = "MaxSaver"\ntrigger = { every = "1 epoch" }\n'
    assert loads_spec(head + "load_best_at_end = true\n").callbacks["best"].args == {
        "load_best_at_end": True}
    with pytest.raises(SpecError, match=r"callbacks\.best\.load_best_at_end: expected true "
                                        "or false"):
        loads_spec(head + "load_best_at_end = 1\n")
