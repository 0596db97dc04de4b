"""Savers never rank weights by a value older than them, and ``check``/``train`` warn
where a callback judges a metric at firings where it has no new value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import UnevenData, tiny_model

from schedtrain import Schedule, every, simulate
from schedtrain.callbacks import Callback, MaxSaver, MinSaver, TopKSaver
from schedtrain.cli import main
from schedtrain.planning.staleness import stale_notes, static_producers_by_callback
from schedtrain.spec import loads_spec
from schedtrain.training import Trainer

STEPS_PER_EPOCH = 3


def _score(step: int) -> float:
    """A value that jumps around, different at each step."""
    return ((step * 7919) % 101) / 101.0


class Score(Callback):
    """Puts ``score`` as a function of the step it is put at."""

    produces = ("score",)

    def _trigger(self) -> None:
        self.metrics.put("score", _score(self.now.step))


_periods = st.sampled_from(["1 step", "2 steps", "3 steps", "4 steps", "1 epoch", "2 epochs"])


@settings(max_examples=12, deadline=None)
@given(_periods, _periods, st.integers(1, 3))
def test_savers_rank_only_fresh_values(tmp_path_factory: pytest.TempPathFactory,
                                       produced: str, saved: str, k: int) -> None:
    """Whatever the two cadences, TopKSaver keeps the k best of the values put at the
    very steps it fired at (before it, in the run's order of events), and
    MinSaver/MaxSaver's best is the min/max of those."""
    run_dir = tmp_path_factory.mktemp("run")
    savers: dict[str, Any] = {"topk": TopKSaver("score", "max", save_top_k=k,
                                                save_last=False),
                              "low": MinSaver("score"), "high": MaxSaver("score")}
    schedule = Schedule({"score": every(produced), **dict.fromkeys(savers, every(saved))})
    model, opt = tiny_model()
    Trainer(model, opt, UnevenData([STEPS_PER_EPOCH]), torch.nn.functional.mse_loss,
            schedule=schedule, bindings={"score": Score(), **savers}, max_epochs=4,
            run_dir=run_dir, handle_signals=False).fit()
    log = simulate(schedule, epochs=4, steps_per_epoch=STEPS_PER_EPOCH)
    fresh, last = [], None
    for f in log:
        if f.callback == "score":
            last = f.step
        elif f.callback == "topk" and last == f.step:
            fresh.append(f.step)
    values = [(_score(s), s) for s in fresh]
    ranked = sorted(values, key=lambda v: (-v[0], v[1]))[:k]
    assert [(b[0], b[1]) for b in savers["topk"].best] == ranked
    assert savers["low"].best == (min(v for v, _ in values) if values else None)
    assert savers["high"].best == (max(v for v, _ in values) if values else None)


SPEC = """
[clock]
epochs = 6
steps_per_epoch = 4

[callbacks.validate]
type = "InferenceRunner"
trigger = {{ every = "{produced}" }}

[callbacks.best]
type = "{kind}"
{extra}trigger = {{ every = "{saved}" }}
"""


@given(_periods, _periods, st.sampled_from(["TopKSaver", "MinSaver", "MaxSaver",
                                            "EarlyStopping"]))
def test_warned_iff_a_firing_has_no_new_value(produced: str, saved: str, kind: str) -> None:
    """The judging callback is warned about exactly when one of its planned firings is
    at a step where the producer did not fire; the warning counts them."""
    extra = {"MaxSaver": 'monitor = "val/accuracy"\n',
             "EarlyStopping": "patience = 2\n"}.get(kind, "")
    spec = loads_spec(SPEC.format(produced=produced, saved=saved, kind=kind, extra=extra))
    notes = stale_notes(spec, static_producers_by_callback(spec))
    log = simulate(spec.schedule(), epochs=6, steps_per_epoch=4)
    stale, last = [], None
    for f in log:  # fresh: the producer fired at this step, before it
        if f.callback == "validate":
            last = f.step
        elif last != f.step:
            stale.append(f)
    assert bool(notes) == bool(stale), notes
    if stale:
        assert notes[0].startswith(f"callbacks.best.trigger: {kind} judges ")
        assert f"{len(stale)} of its {len(log.of('best'))} planned firings" in notes[0]


def test_unknown_producer_or_trainer_metric_is_not_warned() -> None:
    """A metric nothing known produces, or ``train/loss`` (put before every firing), is
    not judged stale."""
    for monitor in ("train/loss", "my/score"):
        spec = loads_spec(SPEC.format(produced="2 epochs", saved="1 step", kind="MinSaver",
                                      extra=f'monitor = "{monitor}"\n'))
        assert stale_notes(spec, static_producers_by_callback(spec)) == []


def test_check_and_train_warn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    """``check`` (the [clock] shape) and ``train`` (the task's shape) print the warning;
    the run's TopKSaver keeps only checkpoints of freshly validated weights."""
    (tmp_path / "stale_task.py").write_text('''
import torch
from torch.utils.data import DataLoader, TensorDataset
from schedtrain.training import Task

def make_task():
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
    model = torch.nn.Linear(4, 1)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    return Task(model, torch.optim.SGD(model.parameters(), lr=0.1), data, data,
                loss_fn=torch.nn.functional.mse_loss)
''')
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "s.toml"
    path.write_text('[run]\ntask = "stale_task:make_task"\nmax_epochs = 6\ndevice = "cpu"\n'
                    + SPEC.format(produced="2 epochs", saved="1 epoch", kind="TopKSaver",
                                  extra="save_top_k = 5\n").replace("steps_per_epoch = 4", ""))
    assert main(["check", "--import", str(path)]) == 0
    warned = [x for x in capsys.readouterr().err.splitlines() if "judges" in x]
    assert len(warned) == 1 and "3 of its 6 planned firings (epoch 1, epoch 3, epoch 5)" \
        in warned[0]
    assert main(["train", str(path), "--run-dir", "out"]) == 0
    assert [x for x in capsys.readouterr().err.splitlines() if "judges" in x] == warned
    kept = sorted(p.name for p in (tmp_path / "out" / "best").glob("val-loss-*.pt"))
    assert kept == [f"val-loss-step-{s:08d}.pt" for s in (8, 16, 24)]
