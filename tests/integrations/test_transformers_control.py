"""Run control in the HF ``Trainer``: a live retime (the Python API, the folder's request as
``schedtrain retime`` writes it) fires as ``continue_with`` predicts and is kept in HF's
checkpoint; a SIGTERM or a cloud's notice from a local metadata server is saved HF's own
way, ends ``trainer.train()`` with exit 75, and ``resume_from_checkpoint`` goes on to the
uninterrupted run's firings and weights; ``before_deadline`` sees the notice's deadline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
import torch
from host_strategies import counters
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from notice_server import NoticeServer
from test_integrations_transformers import dataset, model
from transformers import Trainer, TrainerCallback, TrainingArguments

from schedtrain import Firing, Schedule, ScheduleWarning, every, on, simulate, when
from schedtrain.integrations.host_control import HostControl, HostPreempted
from schedtrain.integrations.transformers import ScheduleCallback
from schedtrain.planning.changes import canonical
from schedtrain.planning.requests import write_request
from schedtrain.training.control.notice import POLL_ENV
from schedtrain.triggers import Trigger, at, before_deadline

quiet = pytest.mark.filterwarnings("ignore")
# One thread for torch's ops, as tests/training_helpers sets for the suite: the model is
# tiny, and a second thread only spins on a loaded 2-core machine.
torch.set_num_threads(1)


STEPS, PER_EPOCH = 9, 3  # max_steps; rows of one micro-batch each in an epoch
Row = tuple[object, ...]


def callback(schedule: Schedule, seen: list[Row] | None = None,
             actions: dict[str, Any] | None = None, **options: Any
             ) -> ScheduleCallback:
    """The schedule's callback, each name bound to ``actions``' or to an action noting
    (name, event, step)."""
    seen = [] if seen is None else seen

    def action(name: str) -> Callable[..., None]:
        def act(args: Any, state: Any, control: Any, event: str, **kw: Any) -> None:
            seen.append((name, event, state.global_step))
        return act

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        return ScheduleCallback(schedule, {n: action(n) for n in schedule.names}
                                | (actions or {}), record=True, **options)


def train(out: Path, callbacks: list[Any], *, resume: str | bool | None = None,
          steps: int = STEPS, **extra: Any) -> Trainer:
    args = TrainingArguments(
        output_dir=str(out), use_cpu=True, report_to="none", disable_tqdm=True,
        per_device_train_batch_size=1, max_steps=steps, logging_strategy="no",
        eval_strategy="no", include_num_input_tokens_seen=True, seed=0,
        **({"save_strategy": "no"} | extra))
    trainer = Trainer(model=model(), args=args, train_dataset=dataset(PER_EPOCH),
                      callbacks=callbacks)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


@dataclass(frozen=True)
class Whole:
    """An uninterrupted run: what its actions saw, its firings, its final weights."""

    seen: list[Row]
    firings: list[Firing]
    weights: dict[str, torch.Tensor]


#: The uninterrupted runs by what they ran: the same for each parametrization of a test,
#: so trained once in a worker (deterministic: seed 0, one thread).
_WHOLE: dict[tuple[str, int], Whole] = {}


def uninterrupted(key: str, make: Callable[[list[Row]], ScheduleCallback], folder: Path,
                  steps: int = STEPS) -> Whole:
    """The run of ``make(seen)``'s callback over ``steps`` in ``folder``, once per key."""
    if (key, steps) not in _WHOLE:
        seen: list[Row] = []
        cb = make(seen)
        trainer = train(folder, [cb], steps=steps)
        _WHOLE[key, steps] = Whole(seen, list(cb.firings), weights(trainer))
    return _WHOLE[key, steps]


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class At(TrainerCallback):
    """Calls ``then`` at the start of step ``step`` (before its step end)."""

    def __init__(self, step: int, then: Callable[[], object], pause: float = 0.0) -> None:
        self.step, self.then, self.pause = step, then, pause

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step + 1 == self.step:
            self.then()
        time.sleep(self.pause)


def sigterm() -> None:
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        raise AssertionError("no SIGTERM handler while training: it would kill the run")
    os.kill(os.getpid(), signal.SIGTERM)


# -- a preemption, saved HF's way -----------------------------------------------------------
SCHEDULE = Schedule({"two": every("2 steps"), "epoch": every("1 epoch"),
                     "start": on("epoch_start"), "tokens": every("10 tokens")})


@quiet
@pytest.mark.parametrize("step", [1, 3, 5, STEPS])  # an epoch's last step, the run's last
def test_sigterm_saves_hf_checkpoint_exits_75_and_resumes_as_uninterrupted(
        step: int, tmp_path: Path) -> None:
    """SIGTERM during step k: step k ends (its firings made), HF writes checkpoint-k, the
    Trainer ends with ``SystemExit(75)``; resumed with ``resume_from_checkpoint=True``, the
    firings and actions over both parts and the final weights are the uninterrupted run's."""
    whole = uninterrupted("sigterm", lambda seen: callback(SCHEDULE, seen), tmp_path / "whole")
    seen: list[Row] = []
    first = callback(SCHEDULE, seen, control=HostControl())
    with pytest.raises(HostPreempted) as info:
        train(tmp_path / "run", [first, At(step, sigterm)])
    stop = info.value
    assert (stop.code, stop.signal, stop.step) == (75, "SIGTERM", step)
    assert stop.checkpoint == tmp_path / "run" / f"checkpoint-{step}"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [f"checkpoint-{step}"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back
    second = callback(SCHEDULE, seen, control=HostControl())
    resumed = train(tmp_path / "run", [second], resume=True)
    assert counters(first.firings + second.firings) == counters(whole.firings)
    assert seen == whole.seen
    assert same_weights(weights(resumed), whole.weights)


@quiet
@pytest.mark.parametrize("kind", ["aws", "gce"])
def test_a_notice_from_a_local_server_preempts_and_fires_before_deadline(
        kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A notice served during step 3 (AWS: 45 s left; GCE: its 30 s): a few steps later
    ``before_deadline("60 s")`` fires at that step and "20 s" does not, HF's checkpoint is
    written, exit 75; the resumed run (no notice now) ends as the uninterrupted one."""
    monkeypatch.setenv(POLL_ENV, "0.02")
    schedule = Schedule({"two": every("2 steps"), "soon": before_deadline("60 s"),
                         "late": before_deadline("20 s")})
    steps = 40
    whole = uninterrupted("notice", lambda seen: callback(schedule, seen), tmp_path / "whole",
                          steps)
    with NoticeServer() as server:
        first = callback(schedule, control=HostControl(preempt_notice=server.url(kind)))
        with pytest.raises(HostPreempted) as info:
            train(tmp_path / "run", [first, At(3, lambda: server.serve_notice(45.0),
                                               pause=0.05)], steps=steps)
        stop = info.value
        assert (stop.code, stop.signal) == (75, f"the {kind.upper()} preemption notice")
        assert 3 <= stop.step < steps
        fired = [(f.callback, f.timestamp.step) for f in first.firings
                 if f.callback in ("soon", "late")]
        assert fired == [("soon", stop.step)]
        server.deadline = None  # the next machine has no notice
        second = callback(schedule, control=HostControl(preempt_notice=server.url(kind)))
        resumed = train(tmp_path / "run", [second], resume=str(stop.checkpoint), steps=steps)
    rest = [f for f in whole.firings if f.callback == "two"]
    assert counters([f for f in first.firings + second.firings if f.callback == "two"]) \
        == counters(rest)
    assert same_weights(weights(resumed), whole.weights)


SCRIPT = """
import sys
sys.path[:0] = {paths!r}
from test_transformers_control import SCHEDULE, At, callback, sigterm, train
from schedtrain.integrations.host_control import HostControl
train({out!r}, [callback(SCHEDULE, control=HostControl()), At(4, sigterm)])
print("not reached")
"""


def test_exit_75_reaches_the_shell_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    """A user's script (no try/except) preempted by SIGTERM exits 75, says where its
    checkpoint is and how to resume in one line, and prints no traceback."""
    here = Path(__file__).parent
    script = tmp_path / "user.py"
    script.write_text(textwrap.dedent(SCRIPT.format(
        paths=[str(here), str(here.parent), str(here.parent.parent)],  # this checkout's
        out=str(tmp_path / "out"))))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, "PYTHONWARNINGS":
                                                         "ignore"})
    assert proc.returncode == 75, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "not reached" not in proc.stdout
    lines = [x for x in proc.stderr.splitlines() if x.startswith("schedtrain: preempted")]
    assert lines == [f"schedtrain: preempted by SIGTERM after step 4: checkpoint {tmp_path / 'out'}"
                     "/checkpoint-4; resume with trainer.train(resume_from_checkpoint=True)"]


# -- live retime -----------------------------------------------------------------------------
TRIGGERS = st.one_of(
    st.integers(1, 4).map(lambda n: every(f"{n} steps")),
    st.just(every("1 epoch")),
    st.integers(1, STEPS).map(lambda n: at(f"{n} steps")),
    st.sampled_from([on("train_end"), on("epoch_start"), on("epoch_end")]),
    st.integers(2, 5).map(lambda n: every(f"{n} steps") | on("epoch_end")),
)


@st.composite
def retimes(draw: st.DrawFn) -> tuple[dict[str, Trigger], dict[str, Trigger], int]:
    """A schedule, the same callbacks with some triggers changed, and a retime step."""
    old = draw(st.dictionaries(st.sampled_from("abc"), TRIGGERS, min_size=1, max_size=3))
    new = {n: (t if draw(st.booleans()) else draw(TRIGGERS)) for n, t in old.items()}
    return old, new, draw(st.integers(1, STEPS - 1))


def seen_as(firings: Any) -> list[tuple[object, ...]]:
    return [(f.callback, f.event, f.step, f.epoch) for f in firings]


def asking(schedule: Schedule, new: Schedule, folder: Path, by_file: bool,
           seen: list[Row] | None = None) -> ScheduleCallback:
    """The callback of ``schedule`` with a control on ``folder``, whose ``ask`` hands it
    ``new`` (in Python, or as the request ``schedtrain retime`` writes there)."""
    def ask(args: Any, state: Any, control: Any, **kw: Any) -> None:
        if by_file:
            text = canonical(new)
            assert text is not None
            write_request(folder, text)
        else:
            cb.retimer.retime(new)

    cb = callback(schedule, seen, {"ask": ask}, control=HostControl(folder))
    return cb


@quiet
@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(edit=retimes(), by_file=st.booleans())
@example(edit=({"a": every("2 steps"), "b": every("1 epoch")},
               {"a": every("3 steps"), "b": every("1 epoch")}, 4), by_file=True)
@example(edit=({"a": every("4 steps") | on("epoch_end")}, {"a": at("8 steps")}, 3),
         by_file=False)  # retimed at an epoch's last step
def test_a_retime_during_train_fires_as_continue_with(
        edit: tuple[dict[str, Trigger], dict[str, Trigger], int], by_file: bool,
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked at step k (``callback.retimer.retime``, or the folder's request): the firings
    are ``simulate(old).continue_with(new, at=k)``'s, and the folder's ``run.json`` and
    ``retimes.json`` say the new schedule (what ``schedtrain retime`` reads)."""
    import schedtrain.training.control.retime as live

    monkeypatch.setattr(live, "POLL_NS", 0)  # the file is looked for at k itself
    old, new, step = edit
    a = Schedule({"ask": at(f"{step} steps"), **old})
    b = Schedule({"ask": at(f"{step} steps"), **new})
    folder = tmp_path_factory.mktemp("job")
    cb = asking(a, b, folder, by_file)
    train(folder / "out", [cb])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        predicted = simulate(a, epochs=STEPS // PER_EPOCH, steps_per_epoch=PER_EPOCH
                             ).continue_with(b, at=step)
    assert seen_as(cb.firings) == seen_as(predicted)
    if canonical(a) == canonical(b):
        return
    history = json.loads((folder / "retimes.json").read_text())
    assert [x["step"] for x in history["applied"]] == [step]
    assert json.loads((folder / "run.json").read_text())["schedule"] == canonical(b)


@quiet
@pytest.mark.parametrize("saved", [2, 6])  # before the retime (step 4), after it
def test_hf_checkpoint_keeps_the_retime_and_resume_replays_it(
        saved: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run retimed at step 4 and killed after step 7, resumed with
    ``resume_from_checkpoint`` from HF's checkpoint at step 2 or 6 (built with the old
    schedule): it fires as the retimed run did, the retime replayed at its step or taken
    from the checkpoint."""
    import schedtrain.training.control.retime as live

    monkeypatch.setattr(live, "POLL_NS", 0)
    old = Schedule({"ask": at("4 steps"), "a": every("3 steps"), "e": every("1 epoch")})
    new = Schedule({"ask": at("4 steps"), "a": every("2 steps"), "e": every("1 epoch")})
    whole = uninterrupted("retimed", lambda seen: asking(old, new, tmp_path / "whole",
                                                         by_file=True, seen=seen),
                          tmp_path / "whole" / "out")

    def kill(args: Any, state: Any, control: Any, **kw: Any) -> None:
        raise KeyError("killed")

    folder = tmp_path / "job"
    first = asking(old, new, folder, by_file=True)
    with pytest.raises(KeyError):
        train(folder / "out", [first, At(8, lambda: kill(None, None, None))],
              save_strategy="steps", save_steps=2)
    first.close()
    assert (folder / "out" / f"checkpoint-{saved}").is_dir()
    again = callback(old, control=HostControl(folder))
    resumed = train(folder / "out", [again], resume=str(folder / "out" / f"checkpoint-{saved}"))
    assert seen_as(again.firings) == [f for f in seen_as(whole.firings)
                                      if f[2] > saved or (f[2] == saved and f[1] != "step_end")]
    assert same_weights(weights(resumed), whole.weights)


@quiet
def test_schedtrain_retime_on_the_folder_during_train(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The command, run while the Trainer trains (from an action at step 3, the job's
    process alive and its folder locked), hands the new spec; the run takes it at its
    next slow-path step and fires the new schedule from there."""
    import schedtrain.training.control.retime as live
    from schedtrain.cli.main import main

    monkeypatch.setattr(live, "POLL_NS", 0)
    old = Schedule({"ask": at("3 steps"), "a": every("4 steps")})
    new = Schedule({"ask": at("3 steps"), "a": every("1 step")})
    spec = tmp_path / "new.toml"
    text = canonical(new)
    assert text is not None
    spec.write_text(text)
    folder = tmp_path / "job"
    codes: list[int] = []
    cb = callback(old, actions={"ask": lambda *a, **k: codes.append(
        main(["retime", str(folder), str(spec)]))}, control=HostControl(folder))
    train(folder / "out", [cb])
    assert codes == [0]
    fired = [f.step for f in cb.firings if f.callback == "a"]
    assert fired[0] == 4 and fired == list(range(4, STEPS + 1))  # looked for at step 4


@quiet
def test_a_retime_waiting_when_hf_evaluates_after_the_step_applies_after_its_firings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trigger reading the logged loss makes the step end wait for HF's log and
    evaluation: a retime asked during step 3 still applies after step 3's firings
    (``continue_with(at=3)``), and ``retimes.json`` says step 3."""
    import schedtrain.training.control.retime as live

    monkeypatch.setattr(live, "POLL_NS", 0)
    old = Schedule({"log": every("1 step"), "c": every("3 steps") & when("loss > 0")})
    new = Schedule({"log": every("1 step"), "c": every("2 steps") & when("loss > 0")})
    folder = tmp_path / "job"
    cb = callback(old, actions={"log": "log"}, control=HostControl(folder))
    train(folder / "out", [cb, At(3, lambda: cb.retimer.retime(new))])
    assert [f.step for f in cb.firings if f.callback == "c"] == [3, 4, 6, 8]
    history = json.loads((folder / "retimes.json").read_text())
    assert [x["step"] for x in history["applied"]] == [3]


@quiet
def test_schedtrain_callbacks_in_the_trainer_are_preempted_and_resumed(tmp_path: Path) -> None:
    """schedtrain ``Callback`` objects in the Trainer (the hosted driver): a SIGTERM at
    step 4 is seen there too, their ``after_train`` is told "preempted", their state rides
    in HF's checkpoint, and the resumed run's firings make up the uninterrupted run's."""
    from hosted_helpers import Recorder, fired, recorded

    from schedtrain import Scheduled
    from schedtrain.callbacks import Callback

    class Outcome(Callback):
        def __init__(self) -> None:
            self.ended: list[str | None] = []

        def _after_train(self) -> None:
            self.ended.append(self.trainer.outcome)

    def run(folder: Path, control: HostControl | None, *extra: Any, resume: bool = False
            ) -> tuple[dict[str, Recorder], Outcome]:
        bound, recorders = recorded(SCHEDULE)
        outcome = Outcome()
        schedule = Schedule([*bound.entries, Scheduled(on("train_end"), outcome, "outcome")])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ScheduleWarning)
            cb = ScheduleCallback(schedule, control=control)
        try:
            train(folder, [cb, *extra], resume=True if resume else None)
        except HostPreempted as stop:
            assert (stop.code, stop.step) == (75, 4)
        return recorders, outcome

    whole, _ = run(tmp_path / "whole", None)
    first, cut = run(tmp_path / "run", HostControl(), At(4, sigterm))
    rest, outcome = run(tmp_path / "run", HostControl(), resume=True)
    assert (cut.ended, outcome.ended) == (["preempted"], ["finished"])
    assert fired(first) + fired(rest) == fired(whole)
    assert [r.count for r in rest.values()] == [r.count for r in whole.values()]
