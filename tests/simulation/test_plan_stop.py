"""After a stop, ``plan`` lists nothing more, as the run does: with a run's own
``events.jsonl`` as ``--metrics``, the plan's firings are the run's."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedtrain import simulate
from schedtrain.cli import main
from schedtrain.planning.plan import plan_spec
from schedtrain.spec import loads_spec

TASK = '''
import torch
from torch.utils.data import DataLoader, TensorDataset
from schedtrain.training import Task

def make_task():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    model = torch.nn.Linear(4, 1)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    return Task(model, torch.optim.SGD(model.parameters(), lr=0.05), data, data,
                loss_fn=torch.nn.functional.mse_loss)
'''

COMMON = """
[clock]
epochs = 12
steps_per_epoch = 4

[callbacks.validate]
type = "InferenceRunner"
trigger = { every = "1 epoch" }
"""

STOPPERS = {
    "plateau": """
[callbacks.stop]
type = "EarlyStopping"
trigger = { all = [{ every = "1 epoch" }, { plateau = "val/loss", patience = 2, min_delta = 0.5 }] }
""",
    "patience": """
[callbacks.stop]
type = "EarlyStopping"
patience = 3
min_delta = 0.5
trigger = { every = "1 epoch" }
""",
    "condition mid-epoch": """
[callbacks.stop]
type = "EarlyStopping"
trigger = { every = "3 steps", if = "val/loss < 1000" }
""",
}

AFTER = """
[callbacks.save]
type = "ModelSaver"
trigger = { every = "2 steps" }

[callbacks.last]
type = "TerminateOnNaN"
trigger = { any = [{ on = "train_end" }, { every = "1 epoch" }] }
"""


def _firings(events: Path) -> list[tuple[str, str, int]]:
    lines = [json.loads(x) for x in events.read_text().splitlines()]
    return [(x["callback"], x["event"], x["step"]) for x in lines if x.get("kind") == "firing"]


@pytest.mark.parametrize("stopper", sorted(STOPPERS))
def test_plan_of_a_run_is_the_run(stopper: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A run that stops early, planned with its own events.jsonl: the same firings, the
    stop's event finished and train_end there, nothing after; the table says where."""
    name = f"stop_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(TASK)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "s.toml"
    path.write_text(f'[run]\ntask = "{name}:make_task"\nmax_epochs = 12\ndevice = "cpu"\n'
                    + textwrap.dedent(COMMON + STOPPERS[stopper] + AFTER))
    assert main(["train", str(path), "--run-dir", "out"]) == 0
    assert capsys.readouterr().out.startswith("stopped by stop")
    ran = _firings(tmp_path / "out" / "events.jsonl")
    assert ran[-1][1] == "train_end" and ran[-1][2] < 48  # it did stop early
    assert main(["plan", str(path), "--format", "json", "--metrics",
                 str(tmp_path / "out" / "events.jsonl")]) == 0
    planned = [(f["callback"], f["event"], f["step"])
               for f in json.loads(capsys.readouterr().out)["firings"]]
    assert planned == ran
    assert main(["plan", str(path), "--metrics", str(tmp_path / "out" / "events.jsonl")]) == 0
    assert "the run stops at " in capsys.readouterr().out


@given(st.integers(1, 6), st.sampled_from(["1 epoch", "2 steps", "3 steps"]),
       st.sampled_from(["epoch_end", "step_end"]))
def test_nothing_after_the_stop(stop_epoch: int, other: str, kind: str) -> None:
    """The plan is the plan without a stop up to the stopping event (all of its firings),
    then train_end's firings at that point, and nothing else."""
    spec = loads_spec(textwrap.dedent(f"""
        [clock]
        epochs = 8
        steps_per_epoch = 5
        [callbacks.other]
        type = "ModelSaver"
        trigger = {{ every = "{other}" }}
        [callbacks.stop]
        type = "EarlyStopping"
        trigger = {{ every = "1 {'epoch' if kind == 'epoch_end' else 'step'}", if = "x > 0" }}
        [callbacks.after]
        type = "ModelSaver"
        trigger = {{ any = [{{ every = "1 epoch" }}, {{ on = "train_end" }}] }}
        """))
    stops_at = (stop_epoch * 5 if kind == "epoch_end" else stop_epoch * 5 - 2)
    at = f"{stop_epoch} epochs" if kind == "epoch_end" else f"{stops_at} steps"
    plan = plan_spec(spec, [(at, "x", 1.0)])
    full = simulate(spec.schedule(), epochs=8, steps_per_epoch=5, metrics=[(at, "x", 1.0)])
    point = next(i for i, f in enumerate(full) if f.callback == "stop" and not f.conditional)
    stop = full[point]
    head = list(full[:point + 1]) + [
        f for f in full[point + 1:] if (f.step, f.event) == (stop.step, stop.event)]
    got = list(plan.log)
    assert [(f.callback, f.event, f.step) for f in got[:len(head)]] == [
        (f.callback, f.event, f.step) for f in head]
    tail = got[len(head):]
    assert [(f.callback, f.event) for f in tail] == [("after", "train_end")]
    assert tail[0].timestamp == stop.timestamp
    assert plan.stopped is not None and f"(step {stop.step})" in plan.stopped


def test_undecided_stop_stops_nothing() -> None:
    """Without metrics the stop is conditional: the plan goes on to the end."""
    spec = loads_spec(COMMON + STOPPERS["plateau"])
    plan = plan_spec(spec)
    assert plan.stopped is None and plan.log[-1].step == 48
