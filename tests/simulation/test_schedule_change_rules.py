"""A resume with another schedule, applied: the real run does what the rules simulate
(``planning.changes.continue_with``) and what ``schedtrain diff --from STEP`` predicts."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset
from training_helpers import Noop, as_if_killed

from schedtrain import Schedule, at, every, on
from schedtrain.callbacks.saver import ModelSaver
from schedtrain.errors import ScheduleWarning
from schedtrain.planning.changes import canonical, continue_with, diff_texts
from schedtrain.schedule.firings import Firing
from schedtrain.simulation.simclock import RunShape
from schedtrain.triggers import Trigger

STEPS, EPOCHS = 5, 3  # 20 samples in batches of 4, 3 epochs: 15 steps
SHAPE = RunShape.build(epochs=EPOCHS, steps_per_epoch=STEPS)

TRIGGERS = st.one_of(
    st.integers(1, 6).map(lambda n: every(f"{n} steps")),
    st.integers(1, 2).map(lambda n: every(f"{n} epochs")),
    st.integers(1, 15).map(lambda n: at(f"{n} steps")),
    st.sampled_from([on("train_end"), on("epoch_start"), on("epoch_end"), on("train_start")]),
    st.tuples(st.integers(2, 5), st.sampled_from(["epoch_start", "epoch_end"])).map(
        lambda t: every(f"{t[0]} steps") | on(t[1])),
)


@st.composite
def edits(draw: st.DrawFn) -> tuple[dict[str, Trigger], dict[str, Trigger], int]:
    """A random schedule A, an edit B of it (each callback kept, changed or removed;
    some added) and a resume step."""
    old = draw(st.dictionaries(st.sampled_from("abcd"), TRIGGERS, min_size=1, max_size=3))
    new: dict[str, Trigger] = {}
    for name, trigger in old.items():
        what = draw(st.sampled_from(["keep", "change", "remove"]))
        if what != "remove":
            new[name] = trigger if what == "keep" else draw(TRIGGERS)
    new.update(draw(st.dictionaries(st.sampled_from("ef"), TRIGGERS, max_size=2)))
    return old, new, draw(st.integers(1, STEPS * EPOCHS - 1))


def _trainer(run_dir: Path, triggers: dict[str, Trigger], save_at: int,
             **kwargs: Any) -> Any:
    from schedtrain.training import Trainer

    torch.manual_seed(0)
    x = torch.randn(4 * STEPS, 3)
    model = torch.nn.Linear(3, 1)
    schedule = Schedule({"save": at(f"{save_at} steps"), **triggers})
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01),
                   DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4),
                   torch.nn.functional.mse_loss, schedule=schedule,
                   bindings={"save": ModelSaver(keep=None), **{n: Noop() for n in triggers}},
                   max_epochs=EPOCHS, run_dir=run_dir, **kwargs)


def _seen(firings: Any) -> list[tuple[str, str, int, int]]:
    return [(f.callback, f.event, f.step, f.epoch) for f in firings]


def _predicted(old: tuple[Firing, ...], diff: Any) -> Counter[tuple[str, str, int, int]]:
    """Old's firings after the step, changed as the diff says."""
    out = Counter(_seen(old))
    for c in diff.firings:
        if c.old is not None:
            out[_seen([c.old])[0]] -= 1
        if c.new is not None:
            out[_seen([c.new])[0]] += 1
    return +out


@pytest.mark.filterwarnings("ignore::schedtrain.errors.ScheduleWarning")
@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(edits())
def test_applied_change_runs_as_simulated_and_diffed(
        tmp_path_factory: pytest.TempPathFactory,
        edit: tuple[dict[str, Trigger], dict[str, Trigger], int]) -> None:
    """A then B from a random step: the real firings are A's (simulated) up to the step,
    then exactly B's by the rules, and the diff from that step predicted them."""
    old, new, step = edit
    run_dir = tmp_path_factory.mktemp("run")
    first = _trainer(run_dir, old, step, keep_firings=None)
    first.fit()
    a = Schedule({"save": at(f"{step} steps"), **old})
    b = Schedule({"save": at(f"{step} steps"), **new})
    sim = continue_with(a, b, SHAPE, from_step=step)
    assert _seen(first.firings) == _seen([*sim.before, *sim.old])
    as_if_killed(run_dir)
    resumed = _trainer(run_dir, new, step, keep_firings=None, schedule_change="apply")
    ckpt = run_dir / "checkpoints" / f"step-{step:08d}.pt"
    if canonical(a) != canonical(b):
        with pytest.warns(ScheduleWarning, match="the schedule changed"):
            resumed.resume(ckpt)
    else:
        resumed.resume(ckpt)
    resumed.fit()
    assert _seen(resumed.firings) == _seen(sim.new)
    text_a, text_b = canonical(a), canonical(b)
    assert text_a is not None and text_b is not None
    diff = diff_texts(text_a, text_b, shape=SHAPE, from_step=step)
    assert _predicted(sim.old, diff) == Counter(_seen(resumed.firings))


def test_digits_resumed_with_validation_every_30_steps(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's example: the digits job run 2 epochs validating every epoch, resumed
    with a spec validating every 30 steps over 4 epochs: refused (exit 2) with the diff;
    with apply, the log has the schedule_change line and then the new firings."""
    import json

    from schedtrain.cli.main import main

    root = Path(__file__).resolve().parents[2]
    text = (root / "specs" / "digits.toml").read_text().replace(
        'trigger = { every = "5 epochs" }', 'trigger = { every = "1 epoch" }')
    old = tmp_path / "old.toml"
    old.write_text(text.replace("max_epochs = 30", "max_epochs = 2")
                   .replace("epochs = 30", "epochs = 2"))
    new = tmp_path / "new.toml"
    new.write_text(text.replace("max_epochs = 30", "max_epochs = 4")
                   .replace("epochs = 30", "epochs = 4")
                   .replace('trigger = { any = ["each_epoch", { on = "train_end" }] }',
                            'trigger = { every = "30 steps" }'))
    run_dir = str(tmp_path / "run")
    assert main(["train", str(old), "--run-dir", run_dir]) == 0
    capsys.readouterr()
    assert main(["train", str(new), "--run-dir", run_dir, "--resume", "auto"]) == 2
    err = capsys.readouterr().err
    assert "was saved with another schedule; resuming at step 90" in err
    assert "added   step_end step 120 (epoch 2)" in err
    assert "removed epoch_end step 135 (epoch 3)" in err
    assert main(["train", str(new), "--run-dir", run_dir, "--resume", "auto",
                 "--schedule-change", "apply"]) == 0
    assert "callbacks.validate: its trigger changed" in capsys.readouterr().err
    rows = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    (change,) = [r for r in rows if r["kind"] == "schedule_change"]
    assert change["step"] == 90
    validate = [(r["event"], r["step"]) for r in rows
                if r["kind"] == "firing" and r["callback"] == "validate"]
    assert validate == [("epoch_end", 45), ("epoch_end", 90), ("step_end", 120),
                        ("step_end", 150), ("step_end", 180)]
    assert rows.index(change) < next(i for i, r in enumerate(rows)
                                     if r["kind"] == "firing" and r["step"] > 90)
