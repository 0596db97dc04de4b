"""A checkpoint's run state, crafted (its checksum recomputed, so it loads as valid): an
epoch division, a ranks list or an ``every("auto")`` state out of bounds is damaged. A
resume from it (``resume(path)``, ``--resume PATH``) is refused in one line naming the
key path before anything is restored; ``--resume auto`` passes it over by name for the
previous one. The division's rule is property-tested: a division is accepted exactly
when its counts lie within its stretches, and then its rest covers the epoch once."""

from __future__ import annotations

import copy
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from training_helpers import UnevenData, tiny_model

from schedtrain import Schedule, every
from schedtrain.callbacks import ModelSaver
from schedtrain.callbacks.autosave import logged_decisions
from schedtrain.checkpoints import CheckpointError, read_checkpoint
from schedtrain.checkpoints.format import digest
from schedtrain.checkpoints.rng import rng_state, set_rng_state
from schedtrain.cli import main
from schedtrain.readback import DamagedFile
from schedtrain.training import Trainer
from schedtrain.training.data_position import DataPosition
from schedtrain.training.redivide import first_stretch
from schedtrain.training.run_records import check_run
from schedtrain.triggers.auto import MAX_INTERVAL, auto_every

SIZE, BATCH = 24, 4
mse = torch.nn.functional.mse_loss


def _recrafted(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with its checksum recomputed: a hostile file can carry a valid one."""
    state = {k: v for k, v in state.items() if k != "checksum"}
    state["checksum"] = {"algorithm": "blake2b-256", "digest": digest(state)}
    return state


def _craft(path: Path, change: Any) -> None:
    state = torch.load(path, weights_only=True)
    change(state["run"])
    torch.save(_recrafted(state), path)


# -- the epoch's division: the rule, on the data positions themselves ----------------------

def _counters(step: int) -> dict[str, int]:
    return {"step": step, "batch": step, "epoch": 0, "step_in_epoch": step, "sample": 0,
            "token": 0, "time_ns": 0}


def _run(split: dict[str, Any], step: int, ranks: int | None = None) -> dict[str, Any]:
    data = {"epoch_rng": rng_state(), "split": split}
    run: dict[str, Any] = {"clock": {"now": _counters(step), "previous_step_end": _counters(step)},
                           "epoch_open": True, "written": [], "events_offset": 0,
                           "table": {"triggers": {}}, "data": data, "rng": rng_state()}
    if ranks is not None:
        run["ranks"] = [{"rng": rng_state(), "data": copy.deepcopy(data)}
                        for _ in range(ranks)]
    return run


def _one_process() -> DataPosition:
    data = TensorDataset(torch.arange(SIZE))
    return DataPosition(DataLoader(data, batch_size=BATCH, shuffle=True), 1)


_ORDER = {"seed": 5, "shuffle": True, "drop_last": False}


@settings(max_examples=150, deadline=None)
@given(ranks=st.integers(-3, 7), count=st.integers(-4, 10), start=st.integers(-2, 12))
def test_a_division_is_used_exactly_when_its_counts_lie_within_its_stretch(
        ranks: int, count: int, start: int) -> None:
    """An epoch begun on ``ranks`` processes, each taking ``count`` batches, resumed on
    one: accepted iff 1 <= ranks <= the cap, 0 <= count <= that stretch's batches and
    ``start`` is the batches taken before; then the rest is the epoch's untaken samples,
    once each. Otherwise refused, naming the key."""
    position = _one_process()
    split = {"order": dict(_ORDER), "done": [[ranks, count]], "ranks": 1, "start": start}
    room = (len(first_stretch(_ORDER, ranks, size=SIZE, epoch=0, batch_size=BATCH,
                              drop_last=False)[1][0]) if ranks >= 1 else -1)
    fine = ranks >= 1 and 0 <= count <= room and start == count
    now = rng_state()
    try:
        check_run(_run(split, step=max(start, 0)), "ck.pt", position)
    except DamagedFile as exc:
        assert not fine, exc
        assert str(exc).startswith("'ck.pt': run.data.split.") and "\n" not in str(exc)
        return
    finally:
        set_rng_state(now)
    assert fine
    position.load_state_dict({"epoch_rng": now, "split": split})
    rest = [i for b in position.resume_epoch(start, 0) for i in b[0].tolist()]
    set_rng_state(now)
    _, per_rank = first_stretch(_ORDER, ranks, size=SIZE, epoch=0, batch_size=BATCH,
                                drop_last=False)
    taken = {i for rank in per_rank for b in rank[:count] for i in b}
    assert sorted(rest) == sorted(set(range(SIZE)) - taken)  # each untaken sample once


@pytest.mark.parametrize("ranks", [0, -1, 10**9])
def test_a_division_on_zero_negative_or_huge_ranks_is_refused(ranks: int) -> None:
    with pytest.raises(DamagedFile, match=r"run\.data\.split\.ranks: expected a value"):
        check_run(_run({"order": dict(_ORDER), "done": [], "ranks": ranks, "start": 0}, 2),
                  "ck.pt", _one_process())


def test_a_million_stretches_are_refused_at_once() -> None:
    """A crafted division of 10**6 stretches spun at full CPU; it is refused at once."""
    split = {"order": dict(_ORDER), "done": [[1, 0]] * 10**6, "ranks": 1, "start": 0}
    began = time.monotonic()
    with pytest.raises(DamagedFile, match=r"run\.data\.split\.done: expected at most"):
        check_run(_run(split, 0), "ck.pt", _one_process())
    assert time.monotonic() - began < 5


def _two_ranks() -> dict[str, Any]:
    data = TensorDataset(torch.arange(SIZE))
    loader = DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(
        data, num_replicas=2, rank=0, shuffle=True, seed=5))
    position = DataPosition(loader, 2)
    position.start_epoch(0)
    return _run(position.state_dict()["split"], 1, ranks=2)


@pytest.mark.parametrize("how", ["three parts for two ranks", "a rank's other division",
                                 "no parts"])
def test_a_ranks_list_that_disagrees_with_its_division_is_refused(how: str) -> None:
    """Two processes: each rank's part of the run, and its division, must agree with the
    ranks recorded (a part per rank, every division rank 0's)."""
    run = _two_ranks()
    check_run(run, "ck.pt", _one_process())  # as written: fine
    if how == "three parts for two ranks":
        run["ranks"].append(copy.deepcopy(run["ranks"][0]))
        key = r"run\.ranks\[0\]\.data\.split\.ranks"
    elif how == "a rank's other division":
        run["ranks"][1]["data"]["split"]["order"]["seed"] = 6
        key = r"run\.ranks\[1\]\.data\.split"
    else:
        run["ranks"] = []
        key = r"run\.ranks"
    with pytest.raises(DamagedFile, match=key):
        check_run(run, "ck.pt", _one_process())


@settings(max_examples=100, deadline=None)
@given(step=st.integers(0, 10**6), ahead=st.integers(-10**6, 2 * MAX_INTERVAL))
def test_an_auto_state_is_used_exactly_when_its_next_firing_is_ahead_within_the_cap(
        step: int, ahead: int) -> None:
    """``next`` a crafted 10**12 meant no checkpoint for the rest of the run: a state is
    accepted iff its next firing is 1 .. MAX_INTERVAL steps past the checkpoint's."""
    run = _run({"order": dict(_ORDER), "done": [], "ranks": 1, "start": 0}, step)
    run["table"]["triggers"] = {"save": {"0": {"next": step + ahead, "decider": {
        "interval": 5, "measured": [0, 0.0, 0.0], "decisions": []}}}}
    if 0 < ahead <= MAX_INTERVAL:
        check_run(run, "ck.pt", _one_process())
        return
    with pytest.raises(DamagedFile, match=r"'ck.pt': run\.table\.triggers\.save\.0\.next"):
        check_run(run, "ck.pt", _one_process())


def test_a_fifo_in_place_of_the_log_never_blocks_the_replay(tmp_path: Path) -> None:
    fifo = tmp_path / "events.jsonl"
    os.mkfifo(fifo)
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(logged_decisions(fifo, "save")),
                              daemon=True)
    reader.start()
    reader.join(5)
    assert not reader.is_alive() and got == [[]]


# -- whole runs: refused by name before anything is restored, or passed over ---------------

def _dataset_trainer(run_dir: Path) -> Trainer:
    model, opt = tiny_model()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SIZE, 3, generator=g)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=BATCH,
                        shuffle=True)
    return Trainer(model, opt, loader, mse, schedule=Schedule({"save": every("1 step")}),
                   bindings={"save": ModelSaver(keep=None)}, max_epochs=1,
                   run_dir=run_dir, handle_signals=False, device="cpu")


_DIVISIONS = {  # a crafted division, and the key a resume names
    "count past the end": ({"done": [[1, 9]], "start": 9}, "done[0][1]"),
    "negative count": ({"done": [[1, -1]], "start": 0}, "done[0][1]"),
    "start inside its stretches": ({"done": [[1, 3]], "start": 1}, "start"),
    "zero ranks": ({"ranks": 0}, "ranks"),
    "huge ranks": ({"ranks": 10**9}, "ranks"),
    "a million stretches": ({"done": [[1, 0]] * 10**6, "start": 0}, "done"),
}


def _assert_untouched(trainer: Trainer) -> None:
    model, _ = tiny_model()
    assert trainer.clock.step == 0
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(),
                                                 trainer.model.parameters(), strict=True))


@pytest.mark.parametrize("how", sorted(_DIVISIONS))
def test_a_crafted_division_is_refused_by_name_or_passed_over(tmp_path: Path,
                                                              how: str) -> None:
    changes, key = _DIVISIONS[how]
    _dataset_trainer(tmp_path).fit()
    newest = tmp_path / "checkpoints" / "step-00000005.pt"
    for later in ("step-00000006.pt",):
        (tmp_path / "checkpoints" / later).unlink()
    _craft(newest, lambda run: run["data"]["split"].update(changes))
    again = _dataset_trainer(tmp_path / "again")
    began = time.monotonic()
    with pytest.raises(CheckpointError, match=r"run\.data\.split\." + key.replace(
            "[", r"\[").replace("]", r"\]")) as caught:
        again.resume(newest)
    # Not a speed measure (benchmarks/ has those): a walk worse than linear over a
    # million stretches would take hours; the linear one takes seconds, more on a
    # loaded machine (its checksum walks every item before the bound refuses them).
    assert time.monotonic() - began < 60 and "\n" not in str(caught.value)
    _assert_untouched(again)
    resumed = _dataset_trainer(tmp_path)
    assert resumed.resume("auto") == tmp_path / "checkpoints" / "step-00000004.pt"
    assert resumed.clock.step == 4


# -- every("auto") --------------------------------------------------------------------------

def _auto_trainer(run_dir: Path, max_epochs: int = 1) -> Trainer:
    model, opt = tiny_model()
    return Trainer(model, opt, UnevenData([12]), mse,
                   schedule=Schedule({"save": auto_every(2)}),
                   bindings={"save": ModelSaver(keep=None)}, max_epochs=max_epochs,
                   device="cpu", run_dir=run_dir, handle_signals=False,
                   checkpoint_mode="sync", mtbf="40 s")


def _auto(run: dict[str, Any]) -> dict[str, Any]:
    state: dict[str, Any] = run["table"]["triggers"]["save"]
    return state


_AUTO = {  # a crafted every("auto") state, and the key a resume names
    "next 10**12": (lambda s: s.update(next=10**12), "save.next"),
    "next in the past": (lambda s: s.update(next=1), "save.next"),
    "interval a string": (lambda s: s["decider"].update(interval="3"), "decider.interval"),
    "interval past the cap": (lambda s: s["decider"].update(interval=MAX_INTERVAL + 1),
                              "decider.interval"),
    "interval missing": (lambda s: s["decider"].pop("interval"), "decider.interval"),
    "cost NaN": (lambda s: s["decider"].update(measured=[1, math.nan, 0.1]),
                 r"decider.measured\[1\]"),
    "cost 1e308": (lambda s: s["decider"].update(measured=[1, 1e308, 0.1]),
                   "decider.measured"),
    "a decision's cost a string": (
        lambda s: s["decider"].update(decisions=[{"step": 2, "interval": 3,
                                                  "cost_s": "x", "step_s": 0.1}]),
        r"decider.decisions\[0\].cost_s"),
    "decider missing": (lambda s: s.pop("decider"), "save.decider"),
}


@pytest.mark.parametrize("how", sorted(_AUTO))
def test_a_crafted_auto_state_is_refused_by_name_or_passed_over(tmp_path: Path,
                                                                how: str) -> None:
    change, key = _AUTO[how]
    _auto_trainer(tmp_path).fit()
    saved = sorted((tmp_path / "checkpoints").glob("step-*.pt"))
    assert len(saved) >= 2
    newest, previous = saved[-1], saved[-2]
    _craft(newest, lambda run: change(_auto(run)))
    again = _auto_trainer(tmp_path / "again")
    with pytest.raises(CheckpointError, match=r"run\.table\.triggers\..*" + key) as caught:
        again.resume(newest)
    assert "\n" not in str(caught.value)
    _assert_untouched(again)
    resumed = _auto_trainer(tmp_path)
    assert resumed.resume("auto") == previous


def test_a_string_interval_line_in_the_log_is_named(tmp_path: Path) -> None:
    """The decisions a resume replays from events.jsonl: a value of another type is
    named by file, line and key (exit 2), not a crash."""
    _auto_trainer(tmp_path).fit()
    events = tmp_path / "events.jsonl"
    lines = events.read_text().splitlines()
    number = next(i for i, line in enumerate(lines, 1) if '"save/save_cost"' in line)
    lines[number - 1] = lines[number - 1].replace('"value": ', '"value": "x", "was": ')
    events.write_text("\n".join(lines) + "\n")
    newest = sorted((tmp_path / "checkpoints").glob("step-*.pt"))[-1]
    resumed = _auto_trainer(tmp_path, max_epochs=2)  # a finished run goes on to a later end
    # The journal is replayed as the checkpoint is read: the resume is refused there,
    # before anything of the run changes.
    with pytest.raises(DamagedFile, match=rf"events.jsonl': line {number}\.value: ") as caught:
        resumed.resume(newest)
    assert "\n" not in str(caught.value)
    assert events.read_text().splitlines() == lines  # the log is not cut back


# -- the command line: exit 2 in one line, or the previous checkpoint -----------------------

def test_train_refuses_a_crafted_path_and_passes_it_over_on_resume_auto(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`train --resume PATH` on a checkpoint whose division is crafted: exit 2, one
    `error:` line naming the file and key path; `--resume auto` names it skipped and
    resumes the previous intact one (exit 0)."""
    spec = tmp_path / "job" / "specs" / "job.toml"
    spec.parent.mkdir(parents=True)
    spec.write_text('[run]\ntask = "jobs.crash:make_task"\nmax_epochs = 1\n'
                    '[callbacks.checkpoint]\ntype = "ModelSaver"\n'
                    'trigger = { every = "16 steps" }\n')
    monkeypatch.chdir(spec.parent.parent)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    monkeypatch.setenv("CRASH_JOB_WORKERS", "0")
    run = tmp_path / "run"
    assert main(["train", str(spec), "--run-dir", str(run)]) == 0
    newest = run / "checkpoints" / "step-00000064.pt"
    _craft(newest, lambda r: r["data"]["split"].update(done=[[1, 99]], start=99))
    spec.write_text(spec.read_text().replace("max_epochs = 1", "max_epochs = 2"))
    capsys.readouterr()
    assert main(["train", str(spec), "--run-dir", str(run), "--resume", str(newest)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "step-00000064.pt" in lines[0], err
    assert "run.data.split.done[0][1]" in lines[0] and "Traceback" not in err
    assert main(["train", str(spec), "--run-dir", str(run), "--resume", "auto"]) == 0
    err = capsys.readouterr().err
    skipped = [line for line in err.splitlines() if "step-00000064.pt" in line]
    assert skipped and "run.data.split.done[0][1]" in skipped[0], err
    assert read_checkpoint(run / "checkpoints" / "step-00000128.pt")["step"] == 128
