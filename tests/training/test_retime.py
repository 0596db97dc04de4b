"""Live retime: ``simulate(...).continue_with(new, at=step)`` predicts a run retimed after
a step, and a real run retimed there (``trainer.retimer.retime``, or the request file
``schedtrain retime`` writes) fires exactly that, logs it and keeps it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import schedules, shapes
from torch.utils.data import DataLoader, TensorDataset
from training_helpers import Noop

from schedtrain import Schedule, at, every, on, plateau, simulate
from schedtrain.callbacks import Callback
from schedtrain.errors import ScheduleError, ScheduleWarning
from schedtrain.planning.changes import canonical, continue_with
from schedtrain.planning.requests import ScheduleChangeRefused, live_refusal, write_request
from schedtrain.simulation.simclock import RunShape
from schedtrain.triggers import Trigger

STEPS, EPOCHS = 5, 3  # 20 samples in batches of 4, 3 epochs: 15 steps
SHAPE = RunShape.build(epochs=EPOCHS, steps_per_epoch=STEPS)


def _after(f: Any, step: int) -> bool:
    """Whether firing ``f`` comes after the ``step_end`` of ``step`` (a step's
    micro-batch events count the steps completed before it)."""
    return f.step > step or (f.step == step and f.event != "step_end")


def _log(run_dir: Path) -> list[dict[str, Any]]:
    """``events.jsonl`` without its wall-clock fields."""
    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("time", "seconds", "duration")}
            for r in rows]


def _seen(firings: Any) -> list[tuple[str, str, int, int]]:
    return [(f.callback, f.event, f.step, f.epoch) for f in firings]


@pytest.mark.filterwarnings("ignore::schedtrain.errors.ScheduleWarning")
@settings(max_examples=60, deadline=None)
@given(old=schedules(), new=schedules(), shape=shapes(), data=st.data())
def test_continue_with_is_old_up_to_the_step_then_new(old: Schedule, new: Schedule,
                                                       shape: Any, data: st.DataObject) -> None:
    """Clock-only triggers hold no state: a run retimed after step k fires the old
    schedule's firings up to k's ``step_end`` and then exactly the new one's, whatever
    the triggers, units, shape and k; and it is what ``planning.changes.continue_with``
    (the resume rules) simulates."""
    total = sum(shape.epoch_lengths)
    step = data.draw(st.integers(1, total), label="retime step")
    try:
        run = simulate(old, **shape.kwargs())
        fresh = simulate(new, **shape.kwargs())
    except ScheduleError:  # a trigger that can never fire: refused before any run
        return
    retimed = run.continue_with(new, at=step)
    expected = ([f for f in run if not _after(f, step)]
                + [f for f in fresh if _after(f, step)])
    assert list(retimed) == expected
    sim = continue_with(old, new, RunShape.build(epoch_lengths=list(shape.epoch_lengths),
                                                 **{k: v for k, v in shape.kwargs().items()
                                                    if k != "epoch_lengths"}),
                        from_step=step)
    assert list(retimed) == [*sim.before, *sim.new]


def test_continue_with_keeps_an_unchanged_metric_triggers_state() -> None:
    """A callback whose trigger is unchanged keeps its state (a plateau's wait); a
    changed one starts afresh: a patience counted across the retime, or from it."""
    values = {"val/loss": [(f"{s} steps", 1.0) for s in range(1, 16)]}
    stop = every("1 step") & plateau("val/loss", patience=4)
    old = Schedule({"stop": stop, "tick": every("2 steps")})
    same = Schedule({"stop": stop, "tick": every("3 steps")})
    changed = Schedule({"stop": every("1 step") & plateau("val/loss", patience=5),
                        "tick": every("2 steps")})
    run = simulate(old, epochs=EPOCHS, steps_per_epoch=STEPS, metrics=values)
    kept = [f.step for f in run.continue_with(same, at=3) if f.callback == "stop"]
    reset = [f.step for f in run.continue_with(changed, at=3) if f.callback == "stop"]
    assert kept == [f.step for f in run if f.callback == "stop"]
    assert reset[0] == 3 + 5 + 1  # counted afresh from the retime


def test_continue_with_refuses_a_bad_step_or_phase() -> None:
    run = simulate(Schedule({"a": every("2 steps")}), epochs=1, steps_per_epoch=4)
    with pytest.raises(ValueError, match="at must be a step"):
        run.continue_with(Schedule({"a": every("3 steps")}), at=-1)
    with pytest.raises(ValueError, match="phase must be one of"):
        run.continue_with(Schedule({"a": every("3 steps")}), at=2, phase="batch_end")


# -- real runs -----------------------------------------------------------------------------

TRIGGERS = st.one_of(
    st.integers(1, 6).map(lambda n: every(f"{n} steps")),
    st.integers(1, 2).map(lambda n: every(f"{n} epochs")),
    st.integers(1, 15).map(lambda n: at(f"{n} steps")),
    st.sampled_from([on("train_end"), on("epoch_start"), on("epoch_end")]),
    st.tuples(st.integers(2, 5), st.sampled_from(["epoch_start", "epoch_end"])).map(
        lambda t: every(f"{t[0]} steps") | on(t[1])),
)


class Asker(Callback):
    """Hands the trainer a new schedule when it fires (through the request file with
    ``by_file``, as ``schedtrain retime`` does)."""

    def __init__(self, new: Schedule, by_file: bool = False) -> None:
        super().__init__()
        self.new, self.by_file = new, by_file

    def _trigger(self) -> None:
        if self.by_file:
            text = canonical(self.new)
            assert text is not None and self.trainer.run_dir is not None
            write_request(self.trainer.run_dir, text)
        else:
            self.trainer.retimer.retime(self.new)


def _trainer(run_dir: Path | None, schedule: Schedule, asker: Callback | None = None,
             **kwargs: Any) -> Any:
    from schedtrain.training import Trainer

    torch.manual_seed(0)
    x = torch.randn(4 * STEPS, 3)
    model = torch.nn.Linear(3, 1)
    names = [n for n in schedule.triggers() if n != "ask"]
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01),
                   DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4),
                   torch.nn.functional.mse_loss, schedule=schedule,
                   bindings={**({"ask": asker} if asker is not None else {}),
                             **{n: Noop() for n in names}},
                   max_epochs=EPOCHS, run_dir=run_dir, keep_firings=None, **kwargs)


@st.composite
def retimes(draw: st.DrawFn) -> tuple[dict[str, Trigger], dict[str, Trigger], int]:
    """A schedule, the same callbacks with some triggers changed, and a retime step."""
    old = draw(st.dictionaries(st.sampled_from("abcd"), TRIGGERS, min_size=1, max_size=3))
    new = {n: (t if draw(st.booleans()) else draw(TRIGGERS)) for n, t in old.items()}
    return old, new, draw(st.integers(1, STEPS * EPOCHS - 1))


@pytest.mark.filterwarnings("ignore::schedtrain.errors.ScheduleWarning")
@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(edit=retimes(), by_file=st.booleans())
def test_a_run_retimed_at_a_step_fires_as_continue_with(
        tmp_path_factory: pytest.TempPathFactory,
        edit: tuple[dict[str, Trigger], dict[str, Trigger], int], by_file: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A real run asked at step k (in Python, or by the request file) fires the old
    schedule up to k and the new one on, as ``simulate(old).continue_with(new, at=k)``
    says; the log has one ``schedule_change`` line at k, and ``retimes.json`` keeps it."""
    import schedtrain.training.control.retime as live

    monkeypatch.setattr(live, "POLL_NS", 0)  # the file is looked for at k itself
    old, new, step = edit
    a = Schedule({"ask": at(f"{step} steps"), **old})
    b = Schedule({"ask": at(f"{step} steps"), **new})
    run_dir = tmp_path_factory.mktemp("run")
    trainer = _trainer(run_dir, a, Asker(b, by_file))
    trainer.fit()
    predicted = simulate(a, shape=SHAPE).continue_with(b, at=step)
    assert _seen(trainer.firings) == _seen(predicted)
    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    changes = [r for r in rows if r["kind"] == "schedule_change"]
    if canonical(a) == canonical(b):
        assert changes == [] and not (run_dir / "retimes.json").exists()
        return
    history = json.loads((run_dir / "retimes.json").read_text())
    assert [(c["step"], c["rule"]) for c in changes] == [(step, "retime")]
    assert [x["step"] for x in history["applied"]] == [step]
    assert history["applied"][0]["schedule"] == canonical(b)
    assert json.loads((run_dir / "run.json").read_text())["schedule"] == canonical(b)
    if by_file:
        answer = json.loads((run_dir / "retime.answer.json").read_text())
        assert (answer["status"], answer["step"]) == ("applied", step)
        assert not (run_dir / "retime.json").exists()


def test_a_checkpoint_after_a_retime_stores_the_new_schedule_and_resumes_it(
        tmp_path: Path) -> None:
    """Saved after the retime: the checkpoint holds the new schedule; a resume with the
    original spec's schedule takes it (from the run's retimes) and fires as the retimed
    run did; saved before it: the resume applies the retime again at its step."""
    from schedtrain.callbacks.saver import ModelSaver

    old = {"a": every("3 steps"), "b": every("1 epoch")}
    new = {"a": every("4 steps"), "b": every("1 epoch")}

    def schedule(triggers: dict[str, Trigger]) -> Schedule:
        return Schedule({"ask": at("6 steps"), "save": every("4 steps") | at("5 steps"),
                         **triggers})

    def trainer(run_dir: Path) -> Any:
        from schedtrain.training import Trainer

        torch.manual_seed(0)
        x = torch.randn(4 * STEPS, 3)
        model = torch.nn.Linear(3, 1)
        return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01),
                       DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4),
                       torch.nn.functional.mse_loss, schedule=schedule(old),
                       bindings={"ask": Asker(schedule(new)), "save": ModelSaver(keep=None),
                                 "a": Noop(), "b": Noop()},
                       max_epochs=EPOCHS, run_dir=run_dir, keep_firings=None)

    run_dir = tmp_path / "run"
    whole = trainer(run_dir)
    whole.fit()
    reference = _log(run_dir)
    assert _seen(whole.firings) == _seen(
        simulate(schedule(old), shape=SHAPE).continue_with(schedule(new), at=6))
    for ckpt in (8, 5):  # after the retime (step 6), then before it
        resumed = trainer(run_dir)
        resumed.resume(run_dir / "checkpoints" / f"step-{ckpt:08d}.pt")
        resumed.fit()
        assert _seen(resumed.firings) == [
            f for f in _seen(whole.firings) if f[2] > ckpt or (f[2] == ckpt and f[1] !=
                                                                "step_end")]
        assert _log(run_dir) == reference


def test_a_change_a_running_job_cannot_make_is_refused_and_the_run_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new callback (by the file: one line, the run goes on unchanged; in Python: the
    refusal raised at once), and the rules' reasons."""
    import schedtrain.training.control.retime as live

    monkeypatch.setattr(live, "POLL_NS", 0)
    a = Schedule({"ask": at("4 steps"), "a": every("3 steps")})
    b = Schedule({"ask": at("4 steps"), "a": every("3 steps"), "e": every("2 steps")})
    trainer = _trainer(tmp_path / "run", a, Asker(b, by_file=True))
    with pytest.warns(ScheduleWarning, match=r"retime refused at step 4: the new schedule "
                                             r"adds 'e': a running job cannot build"):
        trainer.fit()
    assert _seen(trainer.firings) == _seen(simulate(a, shape=SHAPE))
    answer = json.loads((tmp_path / "run" / "retime.answer.json").read_text())
    assert answer["status"] == "refused" and "adds 'e'" in answer["reason"]
    assert not (tmp_path / "run" / "retimes.json").exists()
    with pytest.raises(ScheduleChangeRefused, match="adds 'e'"):
        _trainer(None, a, Asker(b)).fit()
    ta, tb = canonical(a), canonical(b)
    assert ta is not None and tb is not None
    assert live_refusal(tb, ta) is not None and "removes 'e'" in str(live_refusal(tb, ta))
    reordered = canonical(Schedule({"a": every("3 steps"), "ask": at("4 steps")}))
    assert reordered is not None and "reorders" in str(live_refusal(ta, reordered))
    assert live_refusal(ta, ta) is None


# -- the command ---------------------------------------------------------------------------

SPEC = """\
[clock]
epochs = 3
steps_per_epoch = 5

[callbacks.a]
trigger = {{ every = "{a}" }}

[callbacks.b]
trigger = {{ every = "1 epoch" }}
"""


def _running_dir(tmp_path: Path, status: str = "running", pid: int | None = None) -> Path:
    """A run directory as a running job keeps it (its run.json)."""
    import os

    from schedtrain.spec import load_spec

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (tmp_path / "old.toml").write_text(SPEC.format(a="3 steps"))
    text = canonical(load_spec(tmp_path / "old.toml").schedule())
    (run_dir / "run.json").write_text(json.dumps(
        {"status": status, "pid": os.getpid() if pid is None else pid, "step": 4,
         "epoch": 0, "schedule": text}))
    return run_dir


def test_retime_command_prints_the_diff_and_hands_the_request(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 0: the diff of the next firings from the job's step, and retime.json holds
    the new schedule; the same schedule: nothing handed."""
    from schedtrain.cli.main import main
    from schedtrain.planning.requests import Request, read_request
    from schedtrain.spec import load_spec

    run_dir = _running_dir(tmp_path)
    new = tmp_path / "new.toml"
    new.write_text(SPEC.format(a="4 steps"))
    assert main(["retime", str(run_dir), str(new)]) == 0
    out = capsys.readouterr().out
    assert "changed callbacks.a.trigger" in out and "firings if applied after step 4" in out
    assert "moved   step_end step 9 (epoch 1) -> step_end step 8 (epoch 1)" in out
    request = read_request(run_dir)
    assert isinstance(request, Request)
    assert request.schedule == canonical(load_spec(new).schedule())
    assert main(["retime", str(run_dir), str(tmp_path / "old.toml")]) == 0
    assert "already runs this schedule" in capsys.readouterr().out


@pytest.mark.parametrize(("case", "message"), [
    ("ended", "no job runs there (its run.json says 'finished')"),
    ("gone", "is gone; to change its schedule, resume it"),
    ("adds", "refused: the new schedule adds 'c'"),
    ("bad", "callbacks.a.trigger"),
    ("no run", "not a run directory"),
    ("wait", "no answer in 0.05 s"),
])
def test_retime_command_says_why_it_cannot(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           case: str, message: str) -> None:
    """A finished or killed job, a change a running job cannot make, a bad spec, no run
    directory: exit 2 with one line, no traceback, nothing handed; no answer within
    --wait: exit 1, the request stays."""
    from schedtrain.cli.main import main

    run_dir = _running_dir(tmp_path, status="finished" if case == "ended" else "running",
                           pid=2**22 + 12345 if case == "gone" else None)
    new = tmp_path / "new.toml"
    new.write_text(SPEC.format(a="4 steps")
                   + ('\n[callbacks.c]\ntrigger = { every = "2 steps" }\n' if case == "adds"
                      else "") + ('\n[callbacks.a]\n' if case == "bad" else ""))
    if case == "bad":
        new.write_text(SPEC.format(a="four steps"))
    where = str(tmp_path / "nothing") if case == "no run" else str(run_dir)
    args = ["retime", where, str(new)] + (["--wait", "0.05"] if case == "wait" else [])
    code = main(args)
    err = capsys.readouterr().err
    assert code == (1 if case == "wait" else 2)
    assert message in err and "Traceback" not in err
    assert (run_dir / "retime.json").exists() == (case == "wait")


def test_an_unreadable_request_is_refused_once_and_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request file that is not the command's JSON: one line, removed (not refused again
    at each look), the run unchanged."""
    import warnings

    import schedtrain.training.control.retime as live

    monkeypatch.setattr(live, "POLL_NS", 0)
    class Garbage(Callback):
        def _trigger(self) -> None:
            assert self.trainer.run_dir is not None
            (self.trainer.run_dir / "retime.json").write_text("{not json")

    a = Schedule({"ask": at("2 steps"), "a": every("3 steps")})
    trainer = _trainer(tmp_path / "run", a, Garbage())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer.fit()
    lines = [str(w.message) for w in seen if "retime refused" in str(w.message)]
    assert len(lines) == 1 and lines[0].startswith("retime refused at step 2: ")
    assert "retime.json': is not JSON" in lines[0]
    assert not (tmp_path / "run" / "retime.json").exists()
    assert _seen(trainer.firings) == _seen(simulate(a, shape=SHAPE))
