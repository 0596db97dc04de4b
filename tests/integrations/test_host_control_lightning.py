"""Run control inside Lightning (``ScheduleCallback(..., control=HostControl(RUN_DIR))``):
random live retimes fire as ``continue_with`` (asked in Python or by the request file,
and kept across a preemption and Lightning's resume); a SIGTERM or a cloud notice from a
local metadata server saves Lightning's checkpoint, exits 75, and Lightning's resume
from it fires and trains as the uninterrupted fit."""

from __future__ import annotations

import pytest

pytest.importorskip("lightning")
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from fork_cli import fork_script
from host_agreement import Shape
from host_control_cases import (
    LIGHTNING,
    NoticeCase,
    RetimeCase,
    check_notice,
    check_retime,
    fast_polling,  # noqa: F401 (an autouse fixture)
    notice_cases,
    predicted,
    retime_case,
    retime_cases,
)
from host_control_cases import few as host_settings
from host_strategies import counters
from hypothesis import example, given
from notice_server import NoticeServer
from test_integrations_lightning import Module, loader, trainer

from schedtrain import Schedule, at, every, on
from schedtrain.integrations.host_control import HostControl
from schedtrain.integrations.lightning import ScheduleCallback
from schedtrain.planning.changes import canonical
from schedtrain.triggers import before_deadline
from schedtrain.triggers.auto import auto_every

# Each fit saves and records its run state several times (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("no_fsync")

few = host_settings(6)
OLD = {"a": every("2 steps"), "b": every("1 epoch") | on("train_end")}
NEW = {"a": every("3 batches"), "b": every("1 epoch") | on("train_end")}



@pytest.mark.filterwarnings("ignore")
@few
@given(case=retime_cases("lightning"))
@example(case=retime_case(OLD, NEW, Shape(2, 4, 1, 2, 1), 3, by_file=True, preempt=5))
@example(case=retime_case(OLD, NEW, Shape(2, 4, 1, 2, 1), 3, by_file=False, preempt=2))
def test_a_retimed_fit_fires_as_continue_with(case: RetimeCase,
                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    """Asked at a step's end, applied there; preempted before or after it, Lightning's
    resume with the original schedule goes on as the retimed fit (the schedule in the
    checkpoint, the retimes after it replayed from retimes.json)."""
    check_retime(case, LIGHTNING, tmp_path_factory.mktemp("pl"))


@pytest.mark.filterwarnings("ignore")
@few
@given(case=notice_cases("lightning"))
@example(case=NoticeCase(Schedule({"cue": at("3 steps"), "e": every("1 epoch")}),
                         Shape(2, 3, 2, 2, 1), 3, "aws"))
def test_a_preempted_fit_resumes_as_the_uninterrupted_one(
        case: NoticeCase, tmp_path_factory: pytest.TempPathFactory) -> None:
    """SIGTERM, or an AWS or GCE notice: Lightning's checkpoint, exit 75, and
    ``fit(ckpt_path=callback.resume_path)`` fires and trains as the whole fit."""
    check_notice(case, LIGHTNING, tmp_path_factory.mktemp("pl"))


# -- the parts a user sees -----------------------------------------------------------------
SCRIPT = '''
import sys
import lightning.pytorch as pl
import torch
from torchdata.stateful_dataloader import StatefulDataLoader
from test_integrations_lightning import Module, trainer
from schedtrain import Schedule, at, every
from schedtrain.integrations.host_control import HostControl
from schedtrain.integrations.lightning import ScheduleCallback

def kill(trainer, module):
    import os, signal
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGTERM)

callback = ScheduleCallback(Schedule({"kill": at("3 steps"), "e": every("2 steps")}),
                            {"kill": kill, "e": lambda t, m: None}, record=True,
                            control=HostControl(sys.argv[1]))
torch.manual_seed(0)
module = Module()
data = torch.randn(12, 3, generator=torch.Generator().manual_seed(0))
trainer([callback], max_epochs=2).fit(module, StatefulDataLoader(data, batch_size=2),
                                      ckpt_path=callback.resume_path)
torch.save({"firings": [(f.callback, f.timestamp.step) for f in callback.firings],
            "weights": [p.detach() for p in module.parameters()]}, sys.argv[1] + "/out.pt")
'''


def test_a_script_preempted_by_sigterm_exits_75_in_one_line_and_resumes(
        tmp_path: Path) -> None:
    """A Lightning script as a user writes it: SIGTERM at step 3 -> Lightning's checkpoint
    and exit 75 with one line, no traceback; started again, it resumes from the file and
    ends as the uninterrupted fit (firings and weights); the file is then gone."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    run_dir = tmp_path / "run"
    tests = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tests.parents[1]), str(tests), str(tests.parent)])}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(script), *args], env=env, text=True,
                              capture_output=True, timeout=300, check=False)

    first = run(str(run_dir), "kill")
    assert first.returncode == 75, first.stderr[-2000:]
    assert "Traceback" not in first.stderr
    line = f"schedtrain: preempted by SIGTERM after step 3: checkpoint {run_dir}/preempted.ckpt"
    assert line in first.stderr.splitlines()
    assert json.loads((run_dir / "run.json").read_text())["status"] == "preempted"
    # started again: a process of its own, forked with the imports made, that has only
    # the file to resume from (what a fresh start adds was seen in the first run)
    second = tmp_path / "second.err"
    assert fork_script(script, [str(run_dir), "go"], stderr=second) == 0, \
        second.read_text()[-2000:]
    assert not (run_dir / "preempted.ckpt").exists()
    resumed = torch.load(run_dir / "out.pt")
    whole = tmp_path / "whole"  # the reference: forked, its imports made already
    assert fork_script(script, [str(whole), "go"], stderr=tmp_path / "whole.err") == 0, \
        (tmp_path / "whole.err").read_text()[-2000:]
    expected = torch.load(whole / "out.pt")
    assert resumed["firings"] == [f for f in expected["firings"] if f[1] > 3]
    for a, b in zip(resumed["weights"], expected["weights"], strict=True):
        assert torch.equal(a, b)


@pytest.mark.filterwarnings("ignore")
def test_the_retime_command_retimes_a_running_fit(tmp_path: Path) -> None:
    """``schedtrain retime RUN_DIR NEW`` run from inside the fit at step 2's end: the
    command finds the folder (run.json: running, this process), the fit applies it at
    that step, and fires as ``continue_with`` says; the answer says so."""
    old = Schedule({"ask": at("2 steps"), "a": every("2 steps")})
    new = Schedule({"ask": at("2 steps"), "a": every("3 steps")})
    spec = tmp_path / "new.toml"
    spec.write_text(canonical(new) or "")
    run_dir = tmp_path / "run"
    root = Path(__file__).resolve().parents[2]

    def ask() -> None:
        done = subprocess.run(
            [sys.executable, "-m", "schedtrain", "retime", str(run_dir), str(spec)],
            env={**os.environ, "PYTHONPATH": str(root)}, text=True, capture_output=True,
            timeout=120, check=False)
        assert done.returncode == 0, done.stderr

    ran = LIGHTNING.run(old, Shape(2, 4, 1, 2, 1), run_dir, control=HostControl(run_dir),
                        actions={"ask": ask})
    want = predicted("lightning", old, Shape(2, 4, 1, 2, 1)).continue_with(new, at=2)
    assert counters(ran.firings) == counters(want)
    answer = json.loads((run_dir / "retime.answer.json").read_text())
    assert (answer["status"], answer["step"]) == ("applied", 2)


@pytest.mark.filterwarnings("ignore")
def test_a_notice_gives_before_deadline_its_deadline_in_lightning(tmp_path: Path) -> None:
    """An AWS notice seen during step 3: ``before_deadline("10 min")`` fires at its end
    (120 s are left), before the preemption's checkpoint and exit 75."""
    schedule = Schedule({"late": before_deadline("10 min"), "e": every("1 epoch")})
    with NoticeServer() as server:
        control = HostControl(tmp_path, preempt_notice=server.url("aws"))

        class Notice(pl.Callback):
            def on_train_batch_start(self, trainer: pl.Trainer, *_: Any) -> None:
                if trainer.global_step == 2:  # the batch of step 3
                    server.serve_notice(seconds_left=120)
                    until = time.monotonic() + 20
                    while control.inbox.requested is None and time.monotonic() < until:
                        time.sleep(0.005)

        cb = ScheduleCallback(schedule, {"late": lambda t, m: None, "e": lambda t, m: None},
                              record=True, control=control)
        with pytest.raises(SystemExit) as stop:
            trainer([cb, Notice()], max_epochs=2).fit(Module(), loader(6, 2))
    assert stop.value.code == 75 and "AWS preemption notice after step 3" in str(stop.value)
    assert [(f.callback, f.timestamp.step) for f in cb.firings] == [("late", 3)]


def test_lightning_refuses_every_auto_and_a_control_without_a_folder() -> None:
    with pytest.raises(ValueError, match=r"in no Lightning checkpoint .* every\(500, 'steps'\)"):
        ScheduleCallback(Schedule({"save": auto_every()}), {"save": "checkpoint"})
    with pytest.raises(ValueError, match=r"^control=HostControl\(None\): inside Lightning"):
        ScheduleCallback(Schedule({"a": every("2 steps")}), {"a": "stop"},
                         control=HostControl(None))
    with pytest.raises(ValueError, match=r"^live retime needs run control"):
        ScheduleCallback(Schedule({"a": every("2 steps")}), {"a": "stop"}).retimer.retime("")


@pytest.mark.filterwarnings("ignore")
def test_schedtrain_callbacks_in_lightning_are_preempted_and_resumed(tmp_path: Path) -> None:
    """A schedtrain ``Callback`` in the schedule: SIGTERM at step 3 -> exit 75 with its
    ``after_train`` told "preempted"; the resume goes on from step 3."""
    from schedtrain.callbacks import Callback

    class Seen(Callback):
        def __init__(self) -> None:
            super().__init__()
            self.steps: list[int] = []
            self.outcome: str | None = None

        def _trigger(self) -> None:
            self.steps.append(self.trainer.clock.step)
            if self.trainer.clock.step == 3:
                os.kill(os.getpid(), signal.SIGTERM)

        def _after_train(self) -> None:
            self.outcome = self.trainer.outcome

    def fit(seen: Seen) -> int:
        cb = ScheduleCallback(Schedule({"seen": every("1 step")}), {"seen": seen},
                              control=HostControl(tmp_path))
        try:
            trainer([cb], max_epochs=1).fit(Module(), loader(6, 2), ckpt_path=cb.resume_path)
        except SystemExit as stop:
            return int(stop.code or 0)
        return 0

    first, second = Seen(), Seen()
    assert fit(first) == 75 and (first.steps, first.outcome) == ([1, 2, 3], "preempted")
    assert fit(second) == 0 and (second.steps, second.outcome) == ([4, 5, 6], "finished")
