"""``schedtrain retime`` against a real job: it refuses what the job would refuse (one
rule), a request waits at most ``LOOK_STEPS`` steps on one process, the diff is told from
where the change applies, a job starting up is said to be starting (and waited for with
``--wait``), and the new spec gets ``check``'s warnings."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jobs.forked import Forked
from torch.utils.data import DataLoader, TensorDataset
from training_helpers import Noop

from schedtrain import Schedule, at, every, on
from schedtrain.callbacks import Callback
from schedtrain.cli.diff import NOT_COMPARED
from schedtrain.planning.changes import canonical, diff_texts
from schedtrain.planning.requests import LOOK_STEPS, read_answers, write_request
from schedtrain.simulation.simclock import RunShape
from schedtrain.triggers import Trigger


def _trainer(run_dir: Path, schedule: Schedule, asker: Callback, *, samples: int = 20,
             batch: int = 4, epochs: int = 3, pause: float = 0.0) -> Any:
    from schedtrain.training import Trainer

    torch.manual_seed(0)
    x = torch.randn(samples, 3)

    def loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if pause:  # paced: a command in another thread finds the job running
            time.sleep(pause)
        return torch.nn.functional.mse_loss(out, target)

    model = torch.nn.Linear(3, 1)
    names = [n for n in schedule.triggers() if n != "ask"]
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01),
                   DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=batch),
                   loss, schedule=schedule, handle_signals=False,
                   bindings={"ask": asker, **{n: Noop() for n in names}},
                   max_epochs=epochs, run_dir=run_dir, keep_firings=None)


# -- 1. the command refuses what the job refuses --------------------------------------------

TRIGGERS = st.sampled_from([
    every("3 steps"), every("2 steps"), every("1 epoch"), on("epoch_start"),
    every("2 batches"), on("batch_end"), on("batch_start"),
    every("4 steps") | on("batch_end"), every("3 batches") | on("epoch_end"),
])


class CommandAsker(Callback):
    """Runs ``schedtrain retime`` on its own run; where the command refuses, hands the
    job the same request directly, to learn what the job makes of it."""

    def __init__(self, spec: Path, text: str) -> None:
        super().__init__()
        self.spec, self.text, self.code = spec, text, -1

    def _trigger(self) -> None:
        from schedtrain.cli.main import main

        run_dir = self.trainer.run_dir
        assert run_dir is not None
        self.code = main(["retime", str(run_dir), str(self.spec)])
        if self.code == 2:
            write_request(run_dir, self.text)


@pytest.mark.filterwarnings("ignore::schedtrain.errors.ScheduleWarning")
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(old=st.dictionaries(st.sampled_from("ab"), TRIGGERS, min_size=1, max_size=2),
       data=st.data())
def test_the_command_refuses_exactly_what_the_job_refuses(
        tmp_path_factory: pytest.TempPathFactory, old: dict[str, Trigger],
        data: st.DataObject, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever the running and the new triggers (per-batch events newly named or not):
    the command exits 2 with one line naming the callback exactly when the job, handed
    the same request, refuses it; where it exits 0 the job applies it."""
    import schedtrain.training.control.retime as live

    monkeypatch.setattr(live, "POLL_NS", 0)
    new = {n: data.draw(TRIGGERS, label=f"new {n}") for n in old}
    a = Schedule({"ask": at("4 steps"), **old})
    b = Schedule({"ask": at("4 steps"), **new})
    text = canonical(b)
    assert text is not None
    folder = tmp_path_factory.mktemp("job")
    (folder / "new.toml").write_text(text)
    asker = CommandAsker(folder / "new.toml", text)
    _trainer(folder / "run", a, asker).fit()
    err = capsys.readouterr().err
    answers = read_answers(folder / "run")
    if text == canonical(a):
        assert asker.code == 0 and answers == ()
        return
    assert len(answers) == 1
    assert (asker.code, answers[0].status) in ((0, "applied"), (2, "refused")), err
    if asker.code == 2:
        line = next(x for x in err.splitlines() if x.startswith("error: refused: "))
        assert line.startswith("error: refused: callbacks.") and "not built to fire" in line


# -- 2. a request waits at most LOOK_STEPS steps ------------------------------------------

class FileAsker(Callback):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def _trigger(self) -> None:
        assert self.trainer.run_dir is not None
        write_request(self.trainer.run_dir, self.text)


@pytest.mark.parametrize("epoch", [900, 10])
@pytest.mark.parametrize("asked", [2, 100, 255, 300, 511])
def test_a_request_waits_at_most_look_steps_however_fast_the_steps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, asked: int, epoch: int) -> None:
    """Nothing due between the request and the end, and the wall-clock look never comes
    again (``POLL_NS`` huge: steps as fast as one likes): the job still takes the request
    within ``LOOK_STEPS`` steps of it, wherever it lands between the loop's folds, and
    with epochs too short for a fold (an epoch's end folds the losses). The run goes on
    20 steps or more past that bound, not to 900 steps each time: a request taken later,
    or only at the end, is past it. ``epoch`` 900: one epoch, longer than the run; 10:
    epochs of 10 steps."""
    import schedtrain.training.control.retime as live

    monkeypatch.setattr(live, "POLL_NS", 10**18)
    steps = -(-(asked + LOOK_STEPS + 20) // 10) * 10  # whole epochs of 10
    samples = min(epoch, steps)
    a = Schedule({"ask": at(f"{asked} steps"), "a": at("1 step")})
    b = Schedule({"ask": at(f"{asked} steps"), "a": at("2 steps")})
    text = canonical(b)
    assert text is not None
    trainer = _trainer(tmp_path / "run", a, FileAsker(text), samples=samples, batch=1,
                       epochs=steps // samples)
    trainer.fit()
    answers = read_answers(tmp_path / "run")
    assert [x.status for x in answers] == ["applied"]
    assert asked <= answers[0].step <= asked + LOOK_STEPS


# -- 3. the diff from where it applies ------------------------------------------------------

SPEC = """\
[clock]
epochs = 30
steps_per_epoch = 10

[callbacks.ask]
trigger = {{ at = "10000 steps" }}

[callbacks.validate]
trigger = {{ every = "{every}" }}
"""


def test_the_diff_is_told_from_the_step_the_answer_gives(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A job running in a thread, retimed by the command with --wait: the first diff is
    labelled with the earliest step (where the job was), the answer names the step it was
    applied at, and the diff after it is the one from that step, which the job's log
    bears out (the schedule_change line's step)."""
    from schedtrain.cli.main import main
    from schedtrain.spec import load_spec

    old, new = tmp_path / "old.toml", tmp_path / "new.toml"
    old.write_text(SPEC.format(every="5 epochs"))
    new.write_text(SPEC.format(every="2 epochs"))
    a = load_spec(old).schedule()
    run_dir = tmp_path / "run"
    trainer = _trainer(run_dir, a, Noop(), samples=40, batch=4, epochs=30, pause=0.01)
    job = threading.Thread(target=trainer.fit)
    job.start()
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "events.jsonl").exists() or not (
                run_dir / "events.jsonl").read_text():
            assert time.monotonic() < deadline and job.is_alive()
            time.sleep(0.01)
        code = main(["retime", str(run_dir), str(new), "--wait", "120"])
    finally:
        job.join(300)
    out = capsys.readouterr().out
    assert code == 0, out
    first = next(x for x in out.splitlines() if x.startswith("firings "))
    earliest = int(first.split("after step ")[1].split(" ")[0])
    assert first.startswith(f"firings if applied after step {earliest} (the earliest")
    answer = read_answers(run_dir)[0]
    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "schedule_change"] == [answer.step]
    assert earliest <= answer.step
    told = out.split(f"applied at step {answer.step} ")[1].splitlines()[1:]
    old_text, new_text = canonical(a), canonical(load_spec(new).schedule())
    assert old_text is not None and new_text is not None
    expected = diff_texts(old_text, new_text, shape=RunShape.build(
        epochs=30, steps_per_epoch=10), from_step=answer.step).firing_lines()
    if answer.step != earliest:
        assert told == expected
        assert told[0].startswith(f"firings after step {answer.step}: ")
    else:  # the first diff was the one: not told again
        assert not any(x.startswith("firings after") for x in told)


def _running_dir(tmp_path: Path, old: str) -> Path:
    """A run directory as a job running in this process keeps its run.json."""
    from schedtrain.spec import loads_spec

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps(
        {"status": "running", "pid": os.getpid(), "step": 4, "epoch": 0,
         "schedule": canonical(loads_spec(old, "old").schedule())}))
    return run_dir


def test_without_a_shape_the_command_says_firings_were_not_compared(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No [clock] (nor --epochs/--steps-per-epoch): the note `schedtrain diff` prints."""
    from schedtrain.cli.main import main

    old = '[callbacks.a]\ntrigger = { every = "3 steps" }\n'
    run_dir = _running_dir(tmp_path, old)
    (tmp_path / "new.toml").write_text(old.replace("3 steps", "4 steps"))
    assert main(["retime", str(run_dir), str(tmp_path / "new.toml")]) == 0
    captured = capsys.readouterr()
    assert NOT_COMPARED in captured.err.splitlines() and "firings" not in captured.out
    assert main(["diff", str(tmp_path / "new.toml"), str(tmp_path / "new.toml")]) == 0
    assert NOT_COMPARED in capsys.readouterr().err.splitlines()


# -- 5. check's warnings ------------------------------------------------------------------

CHECKED = """\
[clock]
epochs = 10
steps_per_epoch = 5

[callbacks.validate]
type = "InferenceRunner"
trigger = {{ every = "{validate}" }}

[callbacks.best]
type = "MinSaver"
trigger = {{ every = "{best}" }}
"""


@pytest.mark.parametrize(("validate", "best"), [
    ("2 epochs", "5 epochs"), ("5 epochs", "5 epochs"), ("3 epochs", "2 epochs")])
def test_the_command_warns_as_check_does(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         validate: str, best: str) -> None:
    """The new spec's warning lines are check's, whatever they are (a MinSaver judging a
    metric where validate put no new value, or none)."""
    from schedtrain.cli.main import main

    run_dir = _running_dir(tmp_path, CHECKED.format(validate="5 epochs", best="5 epochs"))
    new = tmp_path / "new.toml"
    new.write_text(CHECKED.format(validate=validate, best=best))
    assert main(["check", str(new)]) == 0
    checked = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning: ")]
    assert main(["retime", str(run_dir), str(new)]) == 0
    warned = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning: ")]
    assert warned == checked
    assert bool(warned) == (validate != best), warned


# -- 4. a job starting up -------------------------------------------------------------------

class Holder:
    """A process (a child forked from the test process) that locks ``run_dir`` as a
    starting job does and says so; at ``go()`` records the run as running with
    ``schedule``, answers the first request (applied after step 7) and waits."""

    def __init__(self, run_dir: Path, schedule: str) -> None:
        said_r, said_w = os.pipe()
        self._go_r, self._go = os.pipe()
        self.process = Forked(lambda: self._hold(run_dir, schedule, said_r, said_w),
                              cwd=run_dir)
        self.pid = self.process.pid
        os.close(said_w)
        os.close(self._go_r)
        self.said = os.fdopen(said_r)

    def _hold(self, run_dir: Path, schedule: str, said_r: int, said_w: int) -> int:
        from schedtrain.planning.requests import Answer, read_request, write_answer
        from schedtrain.training.run_dir import RunDirectory

        os.close(said_r)
        os.close(self._go)
        d = RunDirectory(run_dir)
        d.acquire()
        os.write(said_w, b"locked\n")
        os.read(self._go_r, 1)  # the test says when the job has started
        d.record("running", step=4, epoch=0, schedule=schedule, batch_events=[])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = read_request(run_dir)
            if found is not None:
                write_answer(run_dir, Answer(found.id, "applied", 7, 1, "applied after step 7"))
                break
            time.sleep(0.01)
        os.read(self._go_r, 1)
        return 0

    def go(self) -> None:
        os.write(self._go, b"\n")

    def kill(self) -> None:
        self.process.kill()
        self.process.communicate()
        self.said.close()
        os.close(self._go)


@pytest.mark.parametrize("ended", ["finished", "stopped", "preempted", "failed"])
def test_a_job_ending_is_said_to_be_ending(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], ended: str) -> None:
    """The process that recorded how the run ended still holds the lock (it is exiting):
    exit 2 saying it is ending, with the way on, nothing handed; not "starting"."""
    from schedtrain.cli.main import main

    old = '[callbacks.a]\ntrigger = { every = "3 steps" }\n'
    run_dir = _running_dir(tmp_path, old)
    schedule = json.loads((run_dir / "run.json").read_text())["schedule"]
    new = tmp_path / "new.toml"
    new.write_text(old.replace("3 steps", "4 steps"))
    holder = Holder(run_dir, schedule)
    try:
        assert holder.said.readline().strip() == "locked"
        (run_dir / "run.json").write_text(json.dumps(
            {"status": ended, "pid": holder.pid, "step": 4, "schedule": schedule}))
        assert main(["retime", str(run_dir), str(new), "--wait", "1"]) == 2
        err = capsys.readouterr().err
        assert f"process {holder.pid}) is ending" in err and "starting" not in err
        assert "--resume auto --schedule-change apply" in err
        assert not (run_dir / "retime.json").exists()
    finally:
        holder.kill()


@pytest.mark.parametrize("before", [None, "preempted", "finished", "running-gone"])
def test_a_job_starting_up_is_said_to_be_starting_and_waited_for(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], before: str | None) -> None:
    """The directory locked by a starting job, run.json absent or left by the run before
    (ended, or a process long gone): without --wait, exit 1 saying it is starting and to
    retry, nothing handed; with --wait the command waits until the job says it runs,
    hands the request and prints the answer."""
    from schedtrain.cli.main import main

    old = '[callbacks.a]\ntrigger = { every = "3 steps" }\n'
    run_dir = _running_dir(tmp_path, old)
    schedule = json.loads((run_dir / "run.json").read_text())["schedule"]
    if before is None:
        (run_dir / "run.json").unlink()
    else:
        (run_dir / "run.json").write_text(json.dumps(
            {"status": before.split("-")[0], "pid": 2**22 + 12345, "step": 4,
             "schedule": schedule}))
    new = tmp_path / "new.toml"
    new.write_text(old.replace("3 steps", "4 steps"))
    holder = Holder(run_dir, schedule)
    try:
        assert holder.said.readline().strip() == "locked"
        assert main(["retime", str(run_dir), str(new)]) == 1
        err = capsys.readouterr().err
        assert f"the job in {run_dir} is starting" in err and "retry" in err
        assert not (run_dir / "retime.json").exists()
        result: list[int] = []
        command = threading.Thread(target=lambda: result.append(
            main(["retime", str(run_dir), str(new), "--wait", "60"])))
        command.start()
        time.sleep(0.3)  # the command waits for the job to say it runs
        assert command.is_alive()
        holder.go()
        command.join(90)
        assert result == [0]
        assert "applied at step 7 (epoch 1)" in capsys.readouterr().out
    finally:
        holder.kill()
    assert main(["retime", str(run_dir), str(new)]) == 2  # released: its job is gone
    assert "is gone" in capsys.readouterr().err
