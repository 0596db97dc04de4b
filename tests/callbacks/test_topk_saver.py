"""TopKSaver keeps the best k checkpoints by a metric plus the last, across resumes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import UnevenData, tiny_model

from schedtrain import Schedule, every, on
from schedtrain.callbacks import Callback, ModelSaver, TopKSaver
from schedtrain.training import Trainer


class Feed(Callback):
    """Puts the next value of a list as ``score`` at each epoch's end."""

    produces = ("score",)

    def __init__(self, values: Sequence[float]) -> None:
        self.values = list(values)

    def _trigger(self) -> None:
        self.metrics.put("score", self.values[self.now.epoch - 1])


def _trainer(values: Sequence[float], run_dir: Path, saver: TopKSaver, *,
             epochs: int | None = None, extra: dict[str, Any] | None = None) -> Trainer:
    model, opt = tiny_model()
    triggers = {"feed": every("1 epoch"), "topk": every("1 epoch")}
    bindings: dict[str, Any] = {"feed": Feed(values), "topk": saver}
    for name, cb in (extra or {}).items():
        triggers[name] = every("1 epoch")
        bindings[name] = cb
    return Trainer(model, opt, UnevenData([1] * len(values)), torch.nn.functional.mse_loss,
                   schedule=Schedule(triggers), bindings=bindings,
                   max_epochs=epochs or len(values), run_dir=run_dir)


def _expected(values: Sequence[float], k: int, mode: str) -> set[str]:
    """The rule: the k best finite values, the earlier on a tie; step i+1 for values[i]."""
    finite = [(v if mode == "min" else -v, i + 1) for i, v in enumerate(values)
              if math.isfinite(v)]
    return {f"score-step-{s:08d}.pt" for _, s in sorted(finite)[:k]}


_values = st.lists(st.one_of(st.sampled_from([0.0, 1.0, 2.0, math.nan, math.inf]),
                             st.floats(-5, 5)), min_size=1, max_size=7)


@settings(max_examples=15, deadline=None)
@given(_values, st.integers(0, 3), st.sampled_from(["min", "max"]))
def test_keeps_the_best_k_finite_and_the_last(tmp_path_factory: pytest.TempPathFactory,
                                              values: list[float], k: int, mode: str) -> None:
    """Whatever the values (ties, NaN, inf), the folder holds the k best finite ones and
    last.pt; a NaN never displaces a kept checkpoint."""
    run_dir = tmp_path_factory.mktemp("run")
    saver = TopKSaver("score", mode=mode, save_top_k=k)
    _trainer(values, run_dir, saver).fit()
    assert {p.name for p in (run_dir / "best").iterdir()} == _expected(values, k, mode) | {
        "last.pt"}
    assert [p.name for p in saver.best_paths()] == sorted(
        _expected(values, k, mode), key=lambda n: (
            values[int(n[11:19]) - 1] * (1 if mode == "min" else -1), n))


def test_resumed_run_keeps_ranking_the_same_files(tmp_path: Path) -> None:
    """Stopped and resumed mid-run, the kept files are those of the uninterrupted run."""
    values = [3.0, 1.0, 4.0, 1.5, 0.5, 9.0, 2.0]
    full_dir = tmp_path / "full"
    _trainer(values, full_dir, TopKSaver("score", save_top_k=2)).fit()
    run_dir = tmp_path / "cut"
    _trainer(values, run_dir, TopKSaver("score", save_top_k=2), epochs=4,
             extra={"ckpt": ModelSaver(keep=None)}).fit()
    resumed = _trainer(values, run_dir, TopKSaver("score", save_top_k=2),
                       extra={"ckpt": ModelSaver(keep=None)})
    resumed.resume(run_dir / "checkpoints" / f"step-{4:08d}.pt")
    resumed.fit()
    assert ({p.name for p in (run_dir / "best").iterdir()}
            == {p.name for p in (full_dir / "best").iterdir()}
            == {"score-step-00000005.pt", "score-step-00000002.pt", "last.pt"})


class Poison(Callback):
    """Makes the weights NaN at one epoch (before the saver runs)."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def _trigger(self) -> None:
        if self.now.epoch == self.epoch:
            with torch.no_grad():
                for p in self.model.parameters():
                    p.fill_(math.nan)


def test_non_finite_weights_never_displace_a_kept_checkpoint(tmp_path: Path) -> None:
    """A best score with NaN weights is written as -nonfinite beside, never ranked."""
    model, opt = tiny_model()
    saver = TopKSaver("score", save_top_k=1, save_last=False)
    Trainer(model, opt, UnevenData([1] * 3), torch.nn.functional.mse_loss,
            schedule=Schedule({"feed": every("1 epoch"), "poison": on("epoch_end"),
                               "topk": every("1 epoch")}),
            bindings={"feed": Feed([2.0, 1.0, 0.0]), "poison": Poison(3), "topk": saver},
            max_epochs=3, run_dir=tmp_path).fit()
    assert [p.name for p in saver.best_paths()] == ["score-step-00000002.pt"]
    assert {p.name for p in (tmp_path / "best").iterdir()} == {
        "score-step-00000002.pt", "score-step-00000003-nonfinite.pt"}


def test_bad_arguments_are_refused() -> None:
    """mode and save_top_k are checked when the saver is made."""
    with pytest.raises(ValueError, match="`mode` must be 'min' or 'max'"):
        TopKSaver(mode="best")
    with pytest.raises(ValueError, match="`save_top_k` must be a whole number >= 0"):
        TopKSaver(save_top_k=-1)
