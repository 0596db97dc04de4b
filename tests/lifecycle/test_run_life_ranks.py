"""A run's life across process counts (issue 42, the torchrun tier of
tests/lifecycle/test_run_life.py): preempted on one process inside an epoch and resumed
on two (the epoch's rest re-divided), killed -9 on two at an epoch's end and resumed on
one, each then requeued; after each command ``schedtrain status`` agrees, and the
finished run's firings and checkpoint files are those of its epochs' lengths
(docs/distributed.md, "Resuming inside an epoch on another number of processes")."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import life_oracle as oracle
import life_runfiles as runfiles
import pytest
import torch
from life_faults import Fault, run_cli, warm_up
from life_specs import Keep, RunOptions, Schedule, render
from torchrun_helpers import ROOT, TESTS, forked_ranks

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not torch.distributed.is_available(),
                                 reason="torch.distributed is not available"),
              pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="finds torchrun's workers in /proc")]

SCHEDULE = Schedule(validate="1 epoch", ckpt="1 epoch", ckpt_end=False, best=False)
PACE = '\n[callbacks.pace]\ntype = "jobs.lifecycle:Pace"\ntrigger = { every = "1 step" }\n'


def _spec(case: Path, epochs: int, pace: bool = False) -> Path:
    run = RunOptions(epochs=epochs, seed=1, mode="sync")
    spec = case / "s.toml"
    spec.write_text(render(run, SCHEDULE, Keep(latest=2)) + (PACE if pace else ""))
    return spec


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (torchrun's workers: each in a process
    group of its own, which a kill of the launcher's group does not reach)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
    return out


def _status(case: Path) -> int | None:
    code: int | None = run_cli(["status", "run"], case, log=".status.stderr").code
    return code


def _epoch_ends(lengths: list[int]) -> list[int]:
    out, step = [], 0
    for n in lengths:
        step += n
        out.append(step)
    return out


def _finished_as(run_dir: Path, ends: list[int]) -> None:
    """The firings of a run whose epochs ended at ``ends``; the saver's files those
    ``keep = 2`` leaves (no preemption file: a save came after it)."""
    rows = oracle.read_log(run_dir)
    got = [f for f in oracle.logged_firings(rows) if f[0] != "pace"]
    want = [(cb, "epoch_end", s) for s in ends for cb in ("validate", "ckpt")]
    want.append(("digest", "train_end", ends[-1]))
    assert sorted(got) == sorted(want)
    kept = {f"step-{s:08d}.pt" for s in ends[-2:]}
    assert runfiles.Place(run_dir).names() == kept
    assert runfiles.run_json(run_dir).get("step") == ends[-1]


def _requeue_on_two(spec: Path, run_dir: Path) -> None:
    """``--resume auto`` on two processes after the end: nothing left to do, no file
    changed; ``schedtrain status`` says finished (exit 0). The two ranks are forked from
    this process (torchrun's workers' environment, no launcher: what is tested is the
    ranks' resume; a torchrun job's kill is the next test's)."""
    before = runfiles.snapshot(runfiles.Place(run_dir))
    again = forked_ranks(spec, run_dir, "--resume", "auto", nproc=2)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "nothing left to do" in again.stderr
    assert runfiles.snapshot(runfiles.Place(run_dir)) == before
    assert _status(spec.parent) == 0


def test_preempted_on_one_resumed_on_two(tmp_path: Path) -> None:
    warm_up()
    spec, run_dir = _spec(tmp_path, epochs=3), tmp_path / "run"
    got = run_cli(["train", "s.toml", "--run-dir", "run"], tmp_path, fault=Fault("term", 11),
                  run_dir=run_dir)
    assert got.code == 75, got.stderr[-2000:]  # the signal lands in step 12
    assert runfiles.preempted_at(got.lines()) == 12
    assert _status(tmp_path) == 75
    resumed = forked_ranks(spec, run_dir, "--resume", "auto", nproc=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumes on 2" in resumed.stderr and "re-divided" in resumed.stderr
    assert _status(tmp_path) == 0
    # 8 steps an epoch on one process; at step 12 half of the second epoch's 64 samples
    # are left: ceil(ceil(32 / 2) / 8) = 2 more steps on two, then 4 an epoch.
    _finished_as(run_dir, _epoch_ends([8, 6, 4]))
    _requeue_on_two(spec, run_dir)


def test_killed_on_two_resumed_on_one(tmp_path: Path) -> None:
    warm_up()
    spec, run_dir = _spec(tmp_path, epochs=4, pace=True), tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "-m", "schedtrain", "train", str(spec), "--run-dir", str(run_dir)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]),
           "OMP_NUM_THREADS": "1"}
    job = subprocess.Popen(cmd, cwd=tmp_path, env=env, start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    landed, until = run_dir / "checkpoints" / "step-00000004.pt", time.monotonic() + 240
    while job.poll() is None and not landed.exists() and time.monotonic() < until:
        time.sleep(0.01)
    for pid in [*_children(job.pid), job.pid]:  # a scheduler's kill -9 of the whole job
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _, err = job.communicate(timeout=60)
    assert landed.exists(), err[-2000:]
    assert _status(tmp_path) == 1  # "running" by run.json, its processes gone
    got = run_cli(["train", "s.toml", "--run-dir", "run", "--resume", "auto"], tmp_path)
    assert got.code == 0, got.stderr[-2000:]
    at = next(int(x.rsplit(" ", 1)[1]) for x in got.lines() if x.startswith("resumed from"))
    assert at % 4 == 0 and at < 16  # an epoch's end on two: 4 steps an epoch
    assert _status(tmp_path) == 0
    _finished_as(run_dir, _epoch_ends([4] * (at // 4) + [8] * (4 - at // 4)))
    _requeue_on_two(spec, run_dir)
