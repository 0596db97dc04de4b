"""``torchrun`` of ``schedtrain train`` on the CPU (gloo), for the tests that run two real
processes (tests/distributed/, and callbacks that must agree across ranks)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fork_cli import fork_main, wait

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def torchrun(spec: Path, run_dir: Path, *args: str, kill_at_line: int | None = None,
             sig: int = signal.SIGKILL, timeout: float = 120,
             nproc: int = 2) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node NPROC -m schedtrain train SPEC``; with
    ``kill_at_line``, ``sig`` goes to the launcher and both ranks once ``events.jsonl``
    has that many lines (as a scheduler would stop the job)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(nproc), "-m", "schedtrain", "train", str(spec),
           "--run-dir", str(run_dir), *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]),
           "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}  # a crash shows its stacks
    proc = subprocess.Popen(cmd, cwd=spec.parent, env=env, text=True, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if kill_at_line is not None:
        log = run_dir / "events.jsonl"
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if log.exists() and log.read_text().count("\n") >= kill_at_line:
                os.killpg(proc.pid, sig)
                break
            time.sleep(0.01)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def forked_ranks(spec: Path, run_dir: Path, *args: str, nproc: int = 2,
                 timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``schedtrain train SPEC`` as ``nproc`` ranks forked from this process, with the
    environment ``torchrun --standalone`` gives its workers (``RANK``, ``WORLD_SIZE``, a
    free ``MASTER_PORT``, ...): the same run as :func:`torchrun`'s, without three fresh
    interpreters importing torch (several seconds each on a loaded 2-core machine).

    For the tests of what the ranks agree on. What only the launcher does (its signal
    forwarding, a failed rank ending the others, elastic restarts) is tested through
    :func:`torchrun`. ``returncode``: the first failed rank's code, else 0; ``stdout`` and
    ``stderr``: the ranks' own, rank 0's first. Past ``timeout`` every rank is killed and
    ``subprocess.TimeoutExpired`` raised, as :func:`torchrun` raises it."""
    import torch

    _warm_up()
    argv = ["train", str(spec), "--run-dir", str(run_dir), *args]
    with socket.socket() as probe:  # a free port for rank 0's store
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as scratch:
        outs = [(Path(scratch) / f"{rank}.out", Path(scratch) / f"{rank}.err")
                for rank in range(nproc)]

        def one_thread() -> None:  # OMP_NUM_THREADS, which torchrun sets, read too late
            torch.set_num_threads(1)

        pids = [fork_main(argv, spec.parent, stdout=out, stderr=err, before=one_thread, env={
            "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0",
            "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})
            for rank, (out, err) in enumerate(outs)]
        codes = wait(pids, time.monotonic() + timeout)
        out, err = ("".join(p[i].read_text(errors="replace") for p in outs if p[i].exists())
                    for i in (0, 1))
    if codes is None:
        raise subprocess.TimeoutExpired(argv, timeout, out, err)
    return subprocess.CompletedProcess(argv, next((c for c in codes if c), 0), out, err)


def _warm_up() -> None:
    """Import, once in this process, what every rank imports, so forked ranks start at
    once instead of each importing it again."""
    import torch.distributed.checkpoint
    import torch.distributed.fsdp

    import schedtrain.callbacks
    import schedtrain.cli.main
    import schedtrain.distributed
    import schedtrain.training  # noqa: F401

    torch.optim.Adam(torch.nn.Linear(1, 1).parameters(), lr=0.1)  # imports torch._dynamo
