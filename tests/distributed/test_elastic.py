"""Elastic restarts: ``torchrun --max-restarts 1`` with a worker lost once mid-run.

Each trial runs the one documented command (the same line starts a fresh run) with one
of two gloo workers killed (SIGKILL, from inside at a step's end or from outside at any
moment) or raising, at a step drawn at random, and asserts: the job ends well after
exactly one restart, and its log, both ranks' firings and its checkpoints' weights equal
the uninterrupted run's. Every trial has a deadline: a hang fails with every process's
stack (faulthandler, on SIGABRT), not with CI's limit.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from jobs.elastic import FAULT_ENV
from torchrun_helpers import ForkedLauncher, forked_ranks

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

pytestmark = [
    pytest.mark.skipif(not torch.distributed.is_available(),
                       reason="torch.distributed is not available"),
    pytest.mark.skipif(not sys.platform.startswith("linux"),
                       reason="finds a worker by its environment in /proc"),
]

SPEC = """\
[run]
task = "jobs.ddp:make_momentum_task"
max_epochs = 4
seed = 3

[callbacks.validate]
type = "InferenceRunner"
trigger = { every = "1 epoch" }

[callbacks.rank]
type = "jobs.ddp:RankMetric"
trigger = { every = "3 steps" }

[callbacks.high]
type = "jobs.ddp:RankMetric"
trigger = { all = [{ every = "1 step" }, { if = "rank/value > 0.4" }] }

[callbacks.save]
type = "ModelSaver"
keep = 2
trigger = { any = [{ every = "3 steps" }, { on = "train_end" }] }

[callbacks.best]
type = "MinSaver"
trigger = { all = [{ every = "1 epoch" }, { improved = "val/loss" }] }

[callbacks.samples]
type = "jobs.ddp:DumpFirings"
trigger = { any = [{ every = "100 samples" }, { on = "train_end" }] }

[callbacks.fault]
type = "jobs.elastic:Fault"
trigger = { every = "1 step" }

[callbacks.stamp]
type = "jobs.elastic:Stamp"
trigger = { any = [{ every = "1 step" }, { on = "train_end" }] }
"""
STEPS = 32  # 4 epochs of 256 samples in batches of 16 on 2 ranks
# A trial takes seconds on a quiet machine (minutes on a loaded one); a hang fails at this
# deadline with every process's stack, before pytest-timeout's limit (raised for the
# trials, whose first also runs the uninterrupted reference).
DEADLINE_S = 240.0


def elastic_run(folder: Path, fault: str | None = None,
                kill_rank_at_line: tuple[int, int] | None = None, fresh: bool = False
                ) -> subprocess.CompletedProcess[str]:
    """The documented command, ``torchrun --standalone --max-restarts 1
    --nproc-per-node 2 -m schedtrain train SPEC --resume auto``, in ``folder``: its
    launcher torchrun's ``main`` forked from this process and its workers forked by
    torchrun's agent (``ForkedLauncher(fork_workers=True)``: its own rendezvous,
    restart and signals, four workers a trial without four fresh interpreters
    importing torch), or with ``fresh`` the command line in a fresh interpreter, its
    workers fresh ``python -m schedtrain`` processes.

    Args:
        fault: ``SCHEDTRAIN_TEST_FAULT`` ("RANK:STEP:HOW", see jobs/elastic.py).
        kill_rank_at_line: (rank, n): SIGKILL that rank's first-attempt worker from here
            once ``events.jsonl`` has n lines, noting the time in ``died.txt``.
    """
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "elastic.toml"
    spec.write_text(SPEC)
    run_dir = folder / "run"
    args = ["--standalone", "--max-restarts", "1", "--nproc-per-node", "2", "-m",
            "schedtrain", "train", str(spec), "--run-dir", str(run_dir), "--resume", "auto"]
    cmd = [sys.executable, "-m", "torch.distributed.run", *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]),
           "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    env.pop(FAULT_ENV, None)
    if fault is not None:
        env[FAULT_ENV] = fault
    proc: subprocess.Popen[str] | ForkedLauncher
    if fresh:
        proc = subprocess.Popen(cmd, cwd=folder, env=env, text=True, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    else:
        proc = ForkedLauncher(args, folder, env, fork_workers=True)
    deadline = time.monotonic() + DEADLINE_S
    if kill_rank_at_line is not None:
        _kill_worker_at_line(proc, run_dir / "events.jsonl", *kill_rank_at_line,
                             note=folder / "died.txt", deadline=deadline)
    try:
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        # faulthandler prints every thread's stack; the launcher ends too, so it restarts
        # nothing before the SIGKILL.
        workers = _workers(proc.pid)
        _signal_all(proc.pid, signal.SIGABRT, workers)
        time.sleep(2)
        _signal_all(proc.pid, signal.SIGKILL, workers)
        out, err = proc.communicate()
        pytest.fail(f"no end after {DEADLINE_S:.0f} s; stacks:\n{err[-20000:]}")
    return subprocess.CompletedProcess(cmd, proc.wait(), out, err)


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_text().split("\0")
    return dict(item.split("=", 1) for item in raw if "=" in item)


def _workers(agent: int) -> list[int]:
    """The pids of ``torchrun``'s workers (each in its own session: a signal to the
    launcher's process group does not reach them)."""
    out = []
    for entry in Path("/proc").iterdir():
        try:
            # The parent pid is the field after the command's closing parenthesis.
            if entry.name.isdigit() and int(
                    (entry / "stat").read_text().rpartition(")")[2].split()[1]) == agent:
                out.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _worker(agent: int, rank: int, folder: Path) -> int | None:
    """The pid of the first attempt's worker of ``rank``: the one a forked worker noted
    in ``folder`` (``ForkedLauncher``), else the one ``/proc`` shows with its
    environment."""
    noted = folder / f"worker-rank{rank}-attempt0.pid"
    if noted.exists() and noted.read_text():
        pid = int(noted.read_text())
        return pid if pid in _workers(agent) else None
    for pid in _workers(agent):
        try:
            env = _environ(pid)
        except OSError:
            continue
        if env.get("RANK") == str(rank) and env.get("TORCHELASTIC_RESTART_COUNT") == "0":
            return pid
    return None


def _signal_all(agent: int, sig: int, pids: list[int]) -> None:
    for pid in [agent, *pids]:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def _kill_worker_at_line(proc: subprocess.Popen[str] | ForkedLauncher, log: Path, rank: int,
                         line: int, *, note: Path, deadline: float) -> None:
    while proc.poll() is None and time.monotonic() < deadline:
        if log.exists() and log.read_text().count("\n") >= line:
            pid = _worker(proc.pid, rank, note.parent)
            assert pid is not None, f"no worker of rank {rank} found"
            note.write_text(repr(time.time()))
            os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.005)


def _rows(run_dir: Path) -> list[dict[str, object]]:
    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("time", "seconds", "duration")}
            for r in rows]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run no worker is lost in: its two ranks forked from this process (what
    torchrun's launcher adds, a restart, never happens in it)."""
    folder = tmp_path_factory.mktemp("elastic-reference")
    (folder / "elastic.toml").write_text(SPEC)
    result = forked_ranks(folder / "elastic.toml", folder / "run", "--resume", "auto",
                          timeout=DEADLINE_S)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (folder / "attempt.txt").read_text() == "0"
    return folder


def _trials(seed: int = 37) -> list[tuple[str, int, int]]:
    """(how, rank, step or log line): each way of dying on each rank, at random steps,
    and one kill of the chief at a step where a background save is in flight."""
    draw = random.Random(seed)
    out = [("kill", 0, 3 * draw.randint(1, 9)), ("kill", 1, draw.randint(1, STEPS - 1)),
           ("raise", 0, draw.randint(1, STEPS - 1)), ("raise", 1, draw.randint(1, STEPS - 1))]
    out += [("external", rank, draw.randint(20, 200)) for rank in (0, 1)]
    return out


@pytest.mark.timeout(2 * DEADLINE_S + 60)
@pytest.mark.parametrize(("how", "rank", "at"), _trials())
def test_a_lost_worker_costs_one_restart_and_the_run_equals_the_uninterrupted_one(
        uninterrupted: Path, tmp_path: Path, how: str, rank: int, at: int) -> None:
    fresh = how == "kill" and rank == 0  # one trial launched by the command line itself
    if how == "external":
        result = elastic_run(tmp_path, kill_rank_at_line=(rank, at))
    else:
        result = elastic_run(tmp_path, fault=f"{rank}:{at}:{how}", fresh=fresh)
    assert result.returncode == 0, result.stderr[-5000:]
    assert (tmp_path / "died.txt").exists(), "the worker was not lost"
    # --max-restarts 1 ends the job at a second loss: ending well after exactly one
    # restart is the finished group's attempt 1.
    assert (tmp_path / "attempt.txt").read_text() == "1", result.stderr[-5000:]
    assert float((tmp_path / "first-step-1.txt").read_text()) > \
        float((tmp_path / "died.txt").read_text())
    ref = uninterrupted
    assert _rows(tmp_path / "run") == _rows(ref / "run")
    # Each rank's firings in the attempt that finished: the uninterrupted run's, from the
    # checkpoint it resumed from on (events.jsonl above holds the chief's whole run).
    firings = [json.loads((folder / f"firings-rank{r}.json").read_text())
               for folder in (ref, tmp_path) for r in (0, 1)]
    whole, whole_1, tail, tail_1 = firings
    assert whole == whole_1 and tail == tail_1
    assert 0 < len(tail) <= len(whole) and tail == whole[-len(tail):]
    kept = sorted(p.relative_to(ref / "run") for p in (ref / "run").rglob("*.pt"))
    assert kept == sorted(p.relative_to(tmp_path / "run")
                          for p in (tmp_path / "run").rglob("*.pt"))
    for path in kept:
        a = torch.load(ref / "run" / path, weights_only=True)
        b = torch.load(tmp_path / "run" / path, weights_only=True)
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]), path


def test_a_restarted_group_reads_none_of_the_previous_attempts_keys(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The elastic agent keeps one store for every attempt (``TORCHELASTIC_USE_AGENT_STORE``):
    what the previous group left in it (here a posted preemption; for gloo, the ranks'
    addresses) is not read by the next group as its own. Deterministic, where the
    trials above hit it by chance."""
    import datetime

    import torch.distributed as dist

    from schedtrain.distributed.comm import Comm, World, init_group

    agent = dist.TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True)  # type: ignore[attr-defined]
    for name, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(agent.port)),
                        ("TORCHELASTIC_USE_AGENT_STORE", "True"), ("RANK", "0"),
                        ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(name, value)
    seen = []
    for attempt in range(3):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(attempt))
        init_group("gloo", datetime.timedelta(seconds=30))
        comm = Comm(World.from_env(), owns_group=True)
        seen.append(comm.preempt_target())
        comm.post_preempt(7 + attempt, "SIGTERM")
        assert comm.preempt_target() == (7 + attempt, "SIGTERM")
        comm.close()
    assert seen == [None, None, None]
