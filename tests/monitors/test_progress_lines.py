"""ProgressBar's plain lines come exactly at its firings, and show values as of their
step (``train/loss`` included), as ``events.jsonl`` has them."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import UnevenData, tiny_model

from schedtrain import Schedule, every, on, simulate
from schedtrain.callbacks import ProgressBar
from schedtrain.training import Trainer

LINE = re.compile(r"epoch (\d+) step (\d+)/(\d+) \(\d+%\)  \[step (\d+)\](.*)")

_triggers = st.lists(st.sampled_from(
    [every("1 step"), every("2 steps"), every("3 steps"), every("5 steps"), every("1 epoch"),
     every("2 epochs"), on("train_end"), on("epoch_start")]), min_size=1, max_size=3)


def _expected_moments(schedule: Schedule, epochs: int, length: int) -> list[int]:
    """The step of each line: one per firing, a firing at an epoch's end (its last
    step_end, its epoch_end, the train_end after it) printed once for that end."""
    moments: list[tuple[str, int]] = []
    for f in simulate(schedule, epochs=epochs, steps_per_epoch=length).of("progress"):
        ends = f.event in ("epoch_end", "train_end") or (
            f.event == "step_end" and f.timestamp.step_in_epoch == length)
        moment = ("end", f.step) if ends else (f.event, f.step)
        if not moments or moments[-1] != moment:
            moments.append(moment)
    return [step for _, step in moments]


def _losses(events: Path) -> dict[int, float]:
    """The newest train/loss put at or before each step, from events.jsonl."""
    out: dict[int, float] = {}
    for line in events.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "scalar" and rec["name"] == "train/loss":
            out[rec["step"]] = rec["value"]
    return out


@settings(max_examples=25, deadline=None)
@given(_triggers, st.integers(2, 5), st.integers(1, 3))
def test_one_line_per_firing_with_fresh_values(tmp_path_factory: pytest.TempPathFactory,
                                               parts: list, length: int,
                                               epochs: int) -> None:
    """However it is triggered, one line per firing moment (no line at epoch ends it did
    not fire at), in order; each shows the train/loss put at its step."""
    trigger = parts[0]
    for p in parts[1:]:
        trigger = trigger | p
    schedule = Schedule({"progress": trigger})
    stream = io.StringIO()
    run_dir = tmp_path_factory.mktemp("run")
    model, opt = tiny_model()
    data = list(UnevenData([length]))  # a list: its length is known
    Trainer(model, opt, data, torch.nn.functional.mse_loss,
            schedule=schedule, bindings={"progress": ProgressBar(stream=stream)},
            max_epochs=epochs, run_dir=run_dir, handle_signals=False).fit()
    lines = [LINE.fullmatch(x) for x in stream.getvalue().splitlines()]
    assert all(lines), stream.getvalue()
    assert [int(m[4]) for m in lines if m] == _expected_moments(schedule, epochs, length)
    losses = _losses(run_dir / "events.jsonl")
    for m in lines:
        assert m is not None
        step = int(m[4])
        shown = re.search(r"train/loss=(\S+)", m[5])
        if step in losses:  # put at this very step (before the firing): shown fresh
            assert shown is not None and shown[1] == f"{losses[step]:.4g}", m[0]


def test_command_line_progress(tmp_path: Path) -> None:
    """``schedtrain train`` (a real process) with a ProgressBar every 3 steps over 3
    epochs of 4 steps: 4 lines on stderr, at steps 3, 6, 9, 12, each with the loss
    events.jsonl has at that step (the first one included)."""
    (tmp_path / "ptask.py").write_text(textwrap.dedent('''
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        from schedtrain.training import Task

        def make_task():
            x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
            model = torch.nn.Linear(4, 1)
            data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
            return Task(model, torch.optim.SGD(model.parameters(), lr=0.1), data, data,
                        loss_fn=torch.nn.functional.mse_loss)
        '''))
    spec = tmp_path / "p.toml"
    spec.write_text(textwrap.dedent('''
        [run]
        task = "ptask:make_task"
        max_epochs = 3
        device = "cpu"
        [callbacks.validate]
        type = "InferenceRunner"
        trigger = { every = "1 epoch" }
        [callbacks.progress]
        type = "ProgressBar"
        trigger = { every = "3 steps" }
        '''))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    got = subprocess.run([sys.executable, "-m", "schedtrain", "train", str(spec), "--run-dir",
                          str(tmp_path / "run")], cwd=tmp_path, env=env, text=True,
                         capture_output=True, check=False)
    assert got.returncode == 0, got.stderr
    lines = [m for x in got.stderr.splitlines() if (m := LINE.fullmatch(x))]
    assert [int(m[4]) for m in lines] == [3, 6, 9, 12]
    losses = _losses(tmp_path / "run" / "events.jsonl")
    for m in lines:
        assert f"train/loss={losses[int(m[4])]:.4g}" in m[5]
    assert "val/loss=" in lines[-1][5]  # the epoch's end computed it before the line
