"""``every("auto")`` on two ranks (gloo): every rank decides on the chief's
measurements, so both save at the same steps; a "sync" run killed and resumed saves where
the uninterrupted one did, and "async" saves are decided on at the next firing.

The ranks are forked from the test process (``forked_ranks``), the killed ones too: the
kill -9 lands on the ranks themselves at a line of the log, as it did under torchrun,
whose launcher has no part in what is checked (a kill leaves it nothing to forward), and
whose three fresh interpreters took seconds to reach the first step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_distributed import events, rank_firings
from torchrun_helpers import forked_ranks

from schedtrain.triggers.auto import auto_interval

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed is not available")

SPEC = """\
[run]
task = "jobs.ddp:make_task"
max_epochs = 6
seed = 1
mtbf = "40 s"
checkpoint_mode = "{mode}"

[callbacks.save]
type = "jobs.ddp:StepClockSaver"
keep = 2
trigger = {{ every = "auto", offset = "3 steps" }}

[callbacks.samples]
type = "jobs.ddp:DumpFirings"
trigger = {{ on = "train_end" }}
"""


def _spec(folder: Path, mode: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "auto.toml"
    spec.write_text(SPEC.format(mode=mode))
    return spec


def _decisions(run_dir: Path) -> list[tuple[int, float, float]]:
    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    got: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r.get("kind") == "scalar" and str(r.get("name", "")).startswith("save/"):
            got.setdefault(str(r["name"]), []).append((int(r["step"]), float(r["value"])))
    return [(s, v, c) for (s, v), (_, c) in zip(got.get("save/interval", []),
                                                got.get("save/save_cost", []), strict=True)]


def _saves(run_dir: Path) -> list[int]:
    return [int(str(r["step"])) for r in events(run_dir)
            if r["kind"] == "firing" and r["callback"] == "save"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("auto")
    result = forked_ranks(_spec(folder, "sync"), folder / "run")
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / "run"


def test_both_ranks_save_at_the_steps_the_chiefs_measurements_decide(
        uninterrupted: Path) -> None:
    """Rank 1 measures each save twice as dear as the chief: deciding on its own, it
    would fire elsewhere (and the save's collectives would hang)."""
    zero, one = rank_firings(uninterrupted.parent, 0), rank_firings(uninterrupted.parent, 1)
    assert zero == one
    saves = _saves(uninterrupted)
    decided = _decisions(uninterrupted)
    assert saves[0] == 3 and len(decided) >= 3
    assert len({interval for _, interval, _ in decided}) > 1  # it adapts
    # Each decision is the chief's measurement of the save that just landed (one-second
    # steps, a cost times 1 on rank 0), by Young/Daly over the mean cost so far.
    costs: list[float] = []
    for step, interval, cost in decided:
        assert step in saves and cost == 1 + step * 7 % 5 / 4
        costs.append(cost)
        assert interval == auto_interval(sum(costs) / len(costs), 40.0, 1.0)
    # A save places the next one by the interval decided when the save before it landed.
    by_step = {step: interval for step, interval, _ in decided}
    for a, b, c in zip(saves, saves[1:], saves[2:], strict=False):
        assert c - b == by_step[a]


@pytest.mark.parametrize("line", [12, 30])
def test_killed_and_resumed_it_saves_where_the_uninterrupted_run_did(
        uninterrupted: Path, tmp_path: Path, line: int) -> None:
    spec = _spec(tmp_path, "sync")
    run_dir = tmp_path / "run"
    killed = forked_ranks(spec, run_dir, kill_at_line=line)
    assert killed.returncode != 0
    result = forked_ranks(spec, run_dir, "--resume", "auto")
    assert result.returncode == 0, result.stderr[-3000:]
    assert _saves(run_dir) == _saves(uninterrupted)
    assert _decisions(run_dir) == _decisions(uninterrupted)


@pytest.mark.parametrize("kill_at", [None, 20])
def test_background_saves_decide_at_the_next_firing_on_every_rank(
        tmp_path: Path, kill_at: int | None) -> None:
    """An "async" save lands on the chief alone, at a step of its own: its measurement is
    shared at the saver's next firing (every rank's), so the ranks still save alike, killed
    and resumed too (the resumed ranks replay what the chief's log holds)."""
    spec, run_dir = _spec(tmp_path, "async"), tmp_path / "run"
    if kill_at is not None:
        assert forked_ranks(spec, run_dir, kill_at_line=kill_at).returncode != 0
    args = ("--resume", "auto") if kill_at is not None else ()
    result = forked_ranks(spec, run_dir, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert rank_firings(tmp_path, 0) == rank_firings(tmp_path, 1)
    saves, decided = _saves(run_dir), _decisions(run_dir)
    assert decided
    costs: list[float] = []
    for step, interval, cost in decided:
        assert step in saves  # made at a firing
        assert cost in (1.0, 1.25, 1.5, 1.75, 2.0)  # rank 0's (rank 1's are doubled)
        costs.append(cost)
        assert interval == auto_interval(sum(costs) / len(costs), 40.0, 1.0)
