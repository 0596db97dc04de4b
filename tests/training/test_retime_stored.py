"""A live retime in the job parses each schedule at most once and simulates nothing on
the training thread; its ``schedule_change`` line says what changed (the spec's changes
and the rules), not what that moves (``schedtrain diff RUN_DIR`` computes the firings)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import tomllib
import torch
from torch.utils.data import DataLoader, TensorDataset
from training_helpers import Noop

from schedtrain import Schedule, at, every, on
from schedtrain.callbacks import Callback
from schedtrain.planning.changes import canonical, carry, spec_changes
from schedtrain.planning.requests import write_request
from schedtrain.simulation.simulate import Simulation
from schedtrain.training.control import retime as live
from schedtrain.training.control.retime import Retimer
from schedtrain.triggers import Trigger

STEPS, EPOCHS = 5, 3  # 15 steps
LINE_KEYS = {"kind", "step", "epoch", "rule", "equal", "spec", "rules"}


class Asker(Callback):
    """Hands the job the next schedule of ``news`` at each firing: through the request
    file as ``schedtrain retime`` does, or with ``trainer.retimer.retime``."""

    def __init__(self, news: list[Schedule], by_file: bool) -> None:
        super().__init__()
        self.news, self.by_file = list(news), by_file

    def _trigger(self) -> None:
        if not self.news:
            return
        new = self.news.pop(0)
        if self.by_file:
            text = canonical(new)
            assert text is not None and self.trainer.run_dir is not None
            write_request(self.trainer.run_dir, text)
        else:
            self.trainer.retimer.retime(new)


def _schedules(triggers: list[dict[str, Trigger]]) -> list[Schedule]:
    """Each set of triggers with the asker (at steps 3 and 8: a retime each)."""
    ask = at("3 steps") | at("8 steps")
    return [Schedule({"ask": ask, **t}) for t in triggers]


class _Watch:
    """While the job applies a retime (``Retimer._apply``): the TOML texts parsed (by
    text) and the simulations made."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.inside = False
        self.parsed: Counter[str] = Counter()
        self.simulations = 0
        self.applied = 0
        loads, apply = tomllib.loads, Retimer._apply
        init = Simulation.__init__

        def counted_loads(text: str, **kwargs: Any) -> dict[str, Any]:
            if self.inside:
                self.parsed[text] += 1
            return loads(text, **kwargs)

        def counted_apply(retimer: Retimer, *args: Any, **kwargs: Any) -> None:
            self.inside = True
            try:
                apply(retimer, *args, **kwargs)
            finally:
                self.inside = False
                self.applied += 1

        def counted_init(sim: Any, *args: Any, **kwargs: Any) -> None:
            if self.inside:
                self.simulations += 1
            init(sim, *args, **kwargs)

        monkeypatch.setattr(live, "POLL_NS", 0)  # the file is looked for at once
        monkeypatch.setattr(tomllib, "loads", counted_loads)
        monkeypatch.setattr(Retimer, "_apply", counted_apply)
        monkeypatch.setattr(Simulation, "__init__", counted_init)


def _fit(tmp_path: Path, schedules: list[Schedule], by_file: bool) -> Path:
    from schedtrain.training import Trainer

    torch.manual_seed(0)
    x = torch.randn(4 * STEPS, 3)
    model = torch.nn.Linear(3, 1)
    run_dir = tmp_path / "run"
    names = [n for n in schedules[0].triggers() if n != "ask"]
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01),
                      DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4),
                      torch.nn.functional.mse_loss, schedule=schedules[0],
                      bindings={"ask": Asker(schedules[1:], by_file),
                                **{n: Noop() for n in names}},
                      max_epochs=EPOCHS, run_dir=run_dir)
    trainer.fit()
    return run_dir


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


CASES = [
    [{"a": every("2 steps")}, {"a": every("3 steps")}, {"a": every("4 steps")}],
    [{"a": every("2 steps"), "b": on("epoch_end")},
     {"a": every("2 steps"), "b": every("4 steps")},
     {"a": every("5 steps") | on("epoch_end"), "b": every("4 steps")}],
    [{"a": every("1 epochs"), "b": every("3 steps"), "c": at("12 steps")},
     {"a": every("2 steps"), "b": every("3 steps"), "c": at("13 steps")},
     {"a": every("2 steps"), "b": every("6 steps"), "c": at("13 steps")}],
]


@pytest.mark.parametrize("by_file", [True, False])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_a_retime_parses_each_schedule_once_and_simulates_nothing_in_the_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: int, by_file: bool) -> None:
    """Two retimes in one job (A -> B -> C): while the job applies them, each text is
    parsed at most once over both (B, the new one of the first, is the running one of
    the second: kept parsed), and no simulation is made (the run's shape is known, so
    a diff of the firings would simulate)."""
    schedules = _schedules(CASES[case])
    watch = _Watch(monkeypatch)
    run_dir = _fit(tmp_path, schedules, by_file)
    assert watch.applied == 2
    texts = [canonical(s) for s in schedules]
    assert [c["step"] for c in _rows(run_dir) if c["kind"] == "schedule_change"] == [3, 8]
    assert set(watch.parsed) <= set(texts)
    assert max(watch.parsed.values()) == 1, watch.parsed
    assert watch.simulations == 0


@pytest.mark.parametrize("by_file", [True, False])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_schedule_change_line_says_what_changed_and_the_rules(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: int, by_file: bool) -> None:
    """Each retime's line: its step and epoch, ``"rule": "retime"``, the spec's changes
    between the running and the new schedule (key path, old and new values) and the
    rules (kept, reset, added, removed); no firings: the job does not simulate."""
    schedules = _schedules(CASES[case])
    monkeypatch.setattr(live, "POLL_NS", 0)
    run_dir = _fit(tmp_path, schedules, by_file)
    lines = [r for r in _rows(run_dir) if r["kind"] == "schedule_change"]
    docs = [tomllib.loads(str(canonical(s))) for s in schedules]
    assert len(lines) == 2
    for line, (i, step) in zip(lines, [(1, 3), (2, 8)], strict=True):
        assert set(line) - {"time"} == LINE_KEYS
        assert (line["step"], line["epoch"], line["rule"]) == (step, step // STEPS, "retime")
        assert line["spec"] == [c.to_dict() for c in spec_changes(docs[i - 1], docs[i])]
        assert line["spec"] and not line["equal"]
        rules = carry(str(canonical(schedules[i - 1])), str(canonical(schedules[i])))
        assert line["rules"] == rules.to_dict()
        changed = {c["path"].split(".")[1] for c in line["spec"]}
        assert set(line["rules"]["reset"]) == changed
