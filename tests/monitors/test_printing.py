"""PrintProgress and PrintMetrics: plain lines, one per event, for logs that are not a terminal."""

from __future__ import annotations

import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import UnevenData, tiny_model

from schedtrain import Scheduled, every
from schedtrain.callbacks import Callback, PrintMetrics, PrintProgress
from schedtrain.spec import loads_spec
from schedtrain.training import Trainer
from schedtrain.training.from_spec import build_callbacks


def _fit(callbacks: list[object], lengths: list[int], **kw: object) -> Trainer:
    model, opt = tiny_model()
    trainer = Trainer(model, opt, UnevenData(lengths), torch.nn.functional.mse_loss,
                      callbacks=callbacks, max_epochs=len(lengths), **kw)  # type: ignore[arg-type]
    trainer.fit()
    return trainer


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=3), st.integers(1, 4))
def test_progress_lines_follow_the_run(lengths: list[int], every_k: int) -> None:
    """Start, each epoch's start and end, a line per firing, the end: in order, counted
    the way the clock counts (data without a length: no total)."""
    out = io.StringIO()
    _fit([Scheduled(every(f"{every_k} steps"), PrintProgress(out))], lengths)
    expected = ["training: starting (step 0, epoch 0)"]
    step = 0
    for e, n in enumerate(lengths, start=1):
        expected.append(f"epoch {e}: starting")
        for s in range(1, n + 1):
            step += 1
            if step % every_k == 0:
                expected.append(f"epoch {e}: step {s}")
        expected.append(f"epoch {e}: finished at step {step}")
    expected.append(f"training: finished at step {step}, epoch {len(lengths)}")
    assert out.getvalue().splitlines() == expected


class Feed(Callback):
    """Puts ``a`` every step and ``b`` at step 6 only."""

    produces = ("a", "b")

    def _trigger(self) -> None:
        now = self.now
        self.metrics.put("a", float(now.step))
        if now.step == 6:
            self.metrics.put("b", 20.0)


@pytest.mark.parametrize(("names", "expected"), [
    (None, ["epoch 1 step 3  a=3", "epoch 2 step 6  a=6  b=20", "epoch 3 step 9  a=9"]),
    (["b"], ["epoch 2 step 6  b=20"]),
])
def test_metrics_lines_hold_the_new_values(names: list[str] | None,
                                           expected: list[str]) -> None:
    """Each line holds the metrics that got a value since the last line."""
    out = io.StringIO()
    feed = Scheduled(every("1 step"), Feed())
    _fit([feed, PrintMetrics(names, stream=out)], [3, 3, 3])
    # the loop's own train/loss is printed too; it is not what this test is about
    lines = ["  ".join(x for x in line.split("  ") if not x.startswith("train/"))
             for line in out.getvalue().splitlines()]
    assert lines == expected


def test_from_toml() -> None:
    """Both are built-ins TOML can name; a stream is Python's only."""
    cbs = build_callbacks(loads_spec(
        '[callbacks.p]\ntype = "PrintProgress"\ntrigger = { every = "1 epoch" }\n'
        '[callbacks.m]\ntype = "PrintMetrics"\nnames = ["val/loss"]\n'
        'trigger = { every = "1 epoch" }\n'))
    assert isinstance(cbs["p"], PrintProgress)
    assert cbs["m"].names == ["val/loss"]
