"""The job removes the request it answered, and only that one.

The job reads ``retime.json`` once; its answer removes the file it read (known by its
identity then), never one written in its place since, which waits for the next look.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from schedtrain import Schedule, at, every
from schedtrain.callbacks import Callback
from schedtrain.planning.changes import canonical
from schedtrain.planning.requests import REQUEST_FILE, write_request

BASE = {"ask": at("4 steps"), "a": every("3 steps"), "b": every("2 steps")}
#: asked first: "b" changes (reset: its load_state_dict runs while the job applies it)
FIRST = Schedule({**BASE, "b": every("4 steps")})
#: written in the first's place while the job applies the first
SECOND = Schedule({**BASE, "b": every("4 steps"), "a": every("5 steps")})


def _text(schedule: Schedule) -> str:
    text = canonical(schedule)
    assert text is not None
    return text


class Asker(Callback):
    """Writes the first request, as ``schedtrain retime`` does."""

    def _trigger(self) -> None:
        assert self.trainer.run_dir is not None
        self.ids = [write_request(self.trainer.run_dir, _text(FIRST))]


class Replacer(Callback):
    """Reset by the first retime: while the job applies it, the request file is removed
    and another request written in its place (by hand, then by a command)."""

    def __init__(self, asker: Asker) -> None:
        super().__init__()
        self.asker = asker

    def _trigger(self) -> None:
        pass

    def load_state_dict(self, state: dict[str, Any]) -> None:
        run_dir = self.trainer.run_dir
        if run_dir is not None and len(self.asker.ids) == 1:
            (Path(run_dir) / REQUEST_FILE).unlink()
            self.asker.ids.append(write_request(Path(run_dir), _text(SECOND)))


def test_a_request_written_in_place_of_the_one_answered_is_answered_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both requests are applied and answered; none is left, none removed unanswered."""
    import schedtrain.training.control.retime as live
    from schedtrain.training import Trainer

    monkeypatch.setattr(live, "POLL_NS", 0)
    torch.manual_seed(0)
    x = torch.randn(60, 3)
    model = torch.nn.Linear(3, 1)
    asker = Asker()
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01),
                      DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4),
                      torch.nn.functional.mse_loss, schedule=Schedule(BASE),
                      bindings={"ask": asker, "a": Callback(), "b": Replacer(asker)},
                      max_epochs=1, run_dir=tmp_path / "run")
    trainer.fit()
    run = tmp_path / "run"
    found = json.loads((run / "retime.answer.json").read_text())
    answers = {a["id"]: a for a in [found, *found["earlier"]]}
    assert [answers[i]["status"] for i in asker.ids] == ["applied", "applied"]
    assert answers[asker.ids[0]]["step"] < answers[asker.ids[1]]["step"]
    assert not (run / REQUEST_FILE).exists()
    assert trainer.retimer.change.text == _text(SECOND)
