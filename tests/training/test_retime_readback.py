"""The run control files read back (``run.json``, ``retime.json``, its answer, the journal
``retimes.json``): whatever sits there, a running job answers a bad request "refused" in
one line and runs on; a command says what is wrong in one line, exit 2; a damaged journal
refuses the resume that would replay it. Nothing blocks on a FIFO."""

from __future__ import annotations

import json
import os
import signal
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset
from training_helpers import Noop

from schedtrain import Schedule, at, every, simulate
from schedtrain.callbacks import Callback
from schedtrain.planning.changes import canonical
from schedtrain.planning.requests import (
    Answer,
    RequestWaiting,
    read_answer,
    read_answers,
    read_history,
    read_request,
    write_answer,
    write_request,
)
from schedtrain.planning.run_status import read_status
from schedtrain.readback import DamagedFile
from schedtrain.simulation.simclock import RunShape

STEPS, EPOCHS = 5, 3
SHAPE = RunShape.build(epochs=EPOCHS, steps_per_epoch=STEPS)
DEEP = "[" * 100_000 + "]" * 100_000
SPEC = """\
[clock]
epochs = 3
steps_per_epoch = 5

[callbacks.a]
trigger = {{ every = "{a}" }}

[callbacks.b]
trigger = {{ every = "1 epoch" }}
"""
CUSTOM = '[callbacks.a]\ntrigger = { custom = "mod:Cls" }\n\n[callbacks.b]\n' \
         'trigger = { every = "1 epoch" }\n'


@pytest.fixture(autouse=True)
def deadline() -> Iterator[None]:
    """Every case has a deadline: a blocking open (a FIFO) fails the test, not hangs it."""
    def expired(_sig: int, _frame: Any) -> None:
        raise TimeoutError("blocked past the test's deadline")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(60)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _trainer(run_dir: Path, schedule: Schedule, asker: Callback) -> Any:
    from schedtrain.training import Trainer

    torch.manual_seed(0)
    x = torch.randn(4 * STEPS, 3)
    model = torch.nn.Linear(3, 1)
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01),
                   DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4),
                   torch.nn.functional.mse_loss, schedule=schedule,
                   bindings={"ask": asker, "a": Noop(), "b": Noop()},
                   max_epochs=EPOCHS, run_dir=run_dir, keep_firings=None)


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _text(text: str) -> Callable[[Path], None]:
    return lambda path: path.write_text(text)


PLANTED: dict[str, Callable[[Path], None]] = {
    "fifo": _fifo,
    "directory": lambda path: path.mkdir(),
    "100,000 deep": _text(DEEP),
    "not JSON": _text("{not json"),
    "an id of another type": _text(json.dumps({"id": 7, "schedule": "x"})),
    "a schedule of another type": _text(json.dumps({"id": "abc", "schedule": [1]})),
    "a custom trigger": _text(json.dumps({"id": "abc", "schedule": CUSTOM})),
    "a schedule that is not TOML": _text(json.dumps({"id": "abc", "schedule": "[[["})),
    "too long": _text(json.dumps({"id": "abc", "schedule": "#" * (2 << 20)})),
}


class Plant(Callback):
    """Puts ``make(path)`` at ``RUN_DIR/retime.json`` when it fires."""

    def __init__(self, make: Callable[[Path], None]) -> None:
        super().__init__()
        self.make = make

    def _trigger(self) -> None:
        assert self.trainer.run_dir is not None
        self.make(self.trainer.run_dir / "retime.json")


@pytest.mark.parametrize("kind", list(PLANTED))
def test_whatever_sits_at_retime_json_is_refused_once_and_the_run_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """A FIFO (no blocking), a directory, a 100,000-deep file, fields of another type, a
    custom trigger the job cannot import, a schedule that is not TOML: one "refused" line
    naming the file, the answer file says so where the request has an id, the run fires
    exactly as it would have."""
    import schedtrain.training.control.retime as live

    monkeypatch.setattr(live, "POLL_NS", 0)
    schedule = Schedule({"ask": at("2 steps"), "a": every("3 steps"), "b": every("1 epoch")})
    run_dir = tmp_path / "run"
    trainer = _trainer(run_dir, schedule, Plant(PLANTED[kind]))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer.fit()
    lines = [str(w.message) for w in seen if "retime refused" in str(w.message)]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert lines[0].startswith("retime refused at step 2: ")
    assert _firings(trainer) == _firings(simulate(schedule, shape=SHAPE))
    if kind in ("a custom trigger", "a schedule of another type",
                "a schedule that is not TOML"):  # an id read: its answer names it
        answer = read_answer(run_dir, "abc")
        assert answer is not None and answer.status == "refused"
    # refused once: removed, or (a directory) left alone and not refused again
    assert (run_dir / "retime.json").exists() == (kind == "directory")


def _firings(firings: Any) -> list[tuple[str, str, int]]:
    seq = firings.firings if hasattr(firings, "firings") else firings
    return [(f.callback, f.event, f.step) for f in seq if f.callback != "ask"]


def _running_dir(tmp_path: Path) -> Path:
    from schedtrain.spec import load_spec

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (tmp_path / "old.toml").write_text(SPEC.format(a="3 steps"))
    text = canonical(load_spec(tmp_path / "old.toml").schedule())
    (run_dir / "run.json").write_text(json.dumps(
        {"status": "running", "pid": os.getpid(), "step": 4, "epoch": 0, "schedule": text}))
    return run_dir


@pytest.mark.parametrize("command", ["retime", "diff"])
@pytest.mark.parametrize("kind", ["fifo", "directory", "100,000 deep", "step -1"])
def test_a_damaged_run_json_is_one_line_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, kind: str) -> None:
    """`schedtrain retime` and `diff` on a run directory whose run.json is a FIFO (no
    hang), a directory, too deep, or a field out of bounds: exit 2, one line naming it."""
    from schedtrain.cli.main import main

    run_dir = _running_dir(tmp_path)
    status = run_dir / "run.json"
    status.unlink()
    if kind == "step -1":
        status.write_text(json.dumps({"status": "running", "step": -1}))
    else:
        PLANTED[kind](status)
    new = tmp_path / "new.toml"
    new.write_text(SPEC.format(a="4 steps"))
    assert main([command, str(run_dir), str(new)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run.json" in err and "Traceback" not in err
    if kind == "step -1":
        assert "step: expected a value from 0" in err
    assert not (run_dir / "retime.json").exists()


def test_the_command_refuses_a_custom_trigger_the_job_would_refuse(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A retime naming `{ custom = "mod:Cls" }`: exit 2, one line, nothing handed (a
    running job imports no code a request names)."""
    from schedtrain.cli.main import main

    run_dir = _running_dir(tmp_path)
    new = tmp_path / "new.toml"
    new.write_text("[clock]\nepochs = 3\nsteps_per_epoch = 5\n\n" + CUSTOM)
    assert main(["retime", str(run_dir), str(new)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "custom = 'mod:Cls'" in err
    assert not (run_dir / "retime.json").exists()


def test_racing_requests_never_overwrite_each_other(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A second `retime` while a request waits is refused (exit 2, nothing overwritten);
    each waiter finds its own answer even after a later one; a waiter whose request is
    gone unanswered is not told it "stays"."""
    from schedtrain.cli.main import main

    run_dir = _running_dir(tmp_path)
    new = tmp_path / "new.toml"
    new.write_text(SPEC.format(a="4 steps"))
    assert main(["retime", str(run_dir), str(new)]) == 0
    first = read_request(run_dir)
    with pytest.raises(RequestWaiting):
        write_request(run_dir, "x")
    assert main(["retime", str(run_dir), str(new), "--wait", "0.05"]) == 2
    assert "already holds a request" in capsys.readouterr().err
    assert read_request(run_dir) == first and first is not None
    write_answer(run_dir, Answer(first.id, "applied", 5, 1, "applied after step 5"))
    write_answer(run_dir, Answer("later", "refused", 9, 1, "no"))
    found = read_answer(run_dir, first.id)
    assert found is not None and found.status == "applied"
    (run_dir / "retime.json").unlink()
    new.write_text(SPEC.format(a="5 steps"))
    assert main(["retime", str(run_dir), str(new), "--wait", "0.05"]) == 1
    assert "the request stays in" in capsys.readouterr().err  # it does
    ident = read_request(run_dir)
    assert ident is not None
    (run_dir / "retime.json").unlink()  # taken, its answer lost
    from schedtrain.cli.retime import _wait
    assert _wait(run_dir, ident.id, 0.0, 0.0) is None  # type: ignore[union-attr]
    err = capsys.readouterr().err
    assert "no longer in" in err and "stays" not in err


@pytest.mark.parametrize(("content", "key"), [
    (DEEP, ""),
    ('{"base": "x", "applied": [{"step": "3", "epoch": 0, "schedule": "y"}]}',
     "applied[0].step"),
    ('{"base": "x", "applied": [{"step": 4, "epoch": 0, "schedule": "y"}, '
     '{"step": 2, "epoch": 0, "schedule": "z"}]}', "applied"),
    ('{"base": 1}', "base"),
], ids=["100,000 deep", "a string step", "steps out of order", "a number for base"])
def test_a_damaged_journal_refuses_the_resume(tmp_path: Path, content: str, key: str) -> None:
    """A retimes.json a resume would replay, damaged: the resume is refused with one
    line naming the file and key path (the retimes to replay are unknown)."""
    from schedtrain.training import RunDirError

    schedule = Schedule({"ask": at("2 steps"), "a": every("3 steps"), "b": every("1 epoch")})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "retimes.json").write_text(content)
    trainer = _trainer(run_dir, schedule, Noop())
    with pytest.raises(RunDirError) as info:
        trainer.resume("auto")
    assert isinstance(info.value, DamagedFile) and info.value.key == key
    assert str(info.value.path).endswith("retimes.json") and "\n" not in str(info.value)


# -- the rule, over every field: typed and bounded, or refused naming the key ------------------
SAMPLES: dict[str, Any] = {
    "run.json": {"status": "running", "pid": 12, "step": 4, "epoch": 0, "updated": 1.5,
                 "schedule": "x", "checkpoint": "c/step-00000004.pt", "phase": "step_end",
                 "format": "schedtrain-run-1"},
    "retime.json": {"id": "abc", "schedule": "x"},
    "retime.answer.json": {"id": "abc", "status": "applied", "step": 4, "epoch": 0,
                           "reason": "r", "earlier": [{"id": "d", "status": "refused",
                                                       "step": 1, "epoch": 0, "reason": ""}]},
    "retimes.json": {"base": "x", "applied": [{"step": 4, "epoch": 0, "schedule": "y"}]},
}
BAD = [None, "x", "a\nb", -1, 10**30, 1e308, True, [], {}, [[[[]]]], 0.5]


def _read(name: str, run_dir: Path) -> Any:
    if name == "run.json":
        return read_status(run_dir)
    if name == "retime.json":
        found = read_request(run_dir)
        if hasattr(found, "reason"):
            raise DamagedFile(name, "", found.reason)  # type: ignore[union-attr]
        return found
    if name == "retime.answer.json":
        return read_answers(run_dir)
    return read_history(run_dir)


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _leaves(v, (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _leaves(v, (*path, i))]
    return [path]


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(sorted(SAMPLES)), data=st.data())
def test_every_field_is_typed_and_bounded_or_refused_by_key(
        tmp_path_factory: pytest.TempPathFactory, name: str, data: st.DataObject) -> None:
    """Any leaf of any control file swapped for another type, a huge or negative number,
    a line break, or deleted: read back as a record of the same shape, or refused with
    one line naming the file; never another exception."""
    run_dir = tmp_path_factory.mktemp("ctl")
    doc = json.loads(json.dumps(SAMPLES[name]))
    where = data.draw(st.sampled_from(_leaves(doc)), label="leaf")
    parent = doc
    for part in where[:-1]:
        parent = parent[part]
    if data.draw(st.booleans(), label="delete"):
        del parent[where[-1]]
    else:
        parent[where[-1]] = data.draw(st.sampled_from(BAD), label="value")
    (run_dir / name).write_text(json.dumps(doc))
    try:
        found = _read(name, run_dir)
    except DamagedFile as exc:
        assert "\n" not in str(exc) and str(exc.path).endswith(name)
        return
    assert found is not None
    for value in (found if isinstance(found, tuple) else (found,)):  # bounds held
        for field in value.__attrs_attrs__:
            got = getattr(value, field.name)
            if isinstance(got, int | float) and not isinstance(got, bool):
                assert 0 <= got <= 2**63
            if isinstance(got, str) and field.name in ("id", "status", "phase", "format"):
                assert "\n" not in got
