"""`schedtrain status RUN_DIR`: run.json's status as one line and the exit code `train`
gives for that ending (75 preempted), whatever launcher ran the job; bad input is one line
and exit 2. tests/distributed/test_status_torchrun.py runs it after a real torchrun job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from schedtrain.cli import main
from schedtrain.cli.status import EXIT_CODES
from schedtrain.planning.run_status import STATUSES
from schedtrain.training.run_dir import RunDirectory


def _status(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["status", str(run_dir)])
    out, err = capsys.readouterr()
    return code, out, err


def _dead_pid() -> int:
    """The pid of a process that ran and is gone (a child forked and reaped)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_every_status_has_trains_exit_code() -> None:
    assert set(EXIT_CODES) == set(STATUSES)
    assert EXIT_CODES["preempted"] == 75
    assert EXIT_CODES["finished"] == EXIT_CODES["stopped"] == 0


@pytest.mark.parametrize(("status", "code", "said"), [
    ("finished", 0, "finished at step 40 (epoch 2)"),
    ("stopped", 0, "stopped at step 40 (epoch 2)"),
    ("preempted", 75, "preempted after step 40 (epoch 2): checkpoint CKPT; resume with: "
                      "schedtrain train SPEC --resume auto"),
    ("failed", 1, "failed after step 40 (epoch 2); traceback in RUN/traceback.txt"),
    ("running", 1, "running (process PID), at step 40 (epoch 2) or later"),
])
def test_a_recorded_ending_is_one_line_and_trains_exit_code(
        status: str, code: int, said: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    directory = RunDirectory(run)
    run.mkdir()
    checkpoint = str(directory.checkpoints / "step-00000040.pt")
    directory.record(status, step=40, epoch=2, checkpoint=checkpoint)
    if status == "failed":
        (run / "traceback.txt").write_text("Traceback ...\n")
    got, out, err = _status(run, capsys)
    assert (got, err) == (code, "")
    pid = json.loads((run / "run.json").read_text())["pid"]
    assert out == f"{run}: " + said.replace("CKPT", checkpoint).replace(
        "RUN", str(run)).replace("PID", str(pid)) + "\n"


def test_a_running_record_whose_process_is_gone_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A job killed with -9 (or out of memory) never recorded its end: exit 1, and the
    line says the process is gone and the run resumes."""
    RunDirectory(tmp_path).record("running", step=7, epoch=0)
    data = json.loads((tmp_path / "run.json").read_text())
    data["pid"] = _dead_pid()
    (tmp_path / "run.json").write_text(json.dumps(data))
    code, out, _ = _status(tmp_path, capsys)
    assert code == 1
    assert f"its process {data['pid']} is gone" in out and "--resume auto" in out


@pytest.mark.parametrize(("make", "said"), [
    ("nothing", "no such run directory"),
    ("empty", "not a run directory (no run.json)"),
    ("status", "run.json': status: expected one of running, finished"),
    ("step", "run.json': step: expected a value from 0"),
    ("garbage", "run.json"),
])
def test_bad_input_is_one_line_and_exit_2(make: str, said: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    if make != "nothing":
        run.mkdir()
    text = {"status": '{"status": "weird", "step": 1}', "step": '{"status": "finished", '
            '"step": -1}', "garbage": "{not json"}.get(make)
    if text is not None:
        (run / "run.json").write_text(text)
    code, out, err = _status(run, capsys)
    assert (code, out) == (2, "")
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], err
    assert "Traceback" not in err and len(lines[0]) <= 300


def test_the_command_line_process_exits_75(tmp_path: Path) -> None:
    """As a shell script sees it: `python -m schedtrain status RUN_DIR; echo $?`."""
    RunDirectory(tmp_path).record("preempted", step=3, epoch=0)
    done = subprocess.run([sys.executable, "-m", "schedtrain", "status", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 75, done.stderr
    assert done.stdout.startswith(f"{tmp_path}: preempted after step 3 (epoch 0)")
