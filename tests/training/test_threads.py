"""``schedtrain train`` on the CPU picks torch's thread count unless the user chose one.

torch reads ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` when it is imported. One case runs
a fresh ``schedtrain train`` and compares with a fresh torch's own count, as a shell
sees them; the others run the command in a forked child of the test process (torch
imported once), which first sets a count of its own that the rule would never choose:
where a variable is set, the task must see that count untouched, else ``cpu_threads()``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from fork_cli import as_installed_command, fork_main, fresh_env, wait, warm_up
from hypothesis import given
from hypothesis import strategies as st

from schedtrain.training.threads import cpu_threads

#: The case run in fresh interpreters, as a shell would: the user's variable read by torch.
FRESH = {"OMP_NUM_THREADS": "2"}
#: What the rule reads; each case starts without them, then sets its own.
READ = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LOCAL_WORLD_SIZE")

TASK = '''
import os
import torch
from torch.utils.data import DataLoader, TensorDataset
from schedtrain.training import Task

def make_task():
    with open(os.environ["THREADS_SEEN"], "w") as f:
        f.write(str(torch.get_num_threads()))
    x = torch.randn(8, 2)
    model = torch.nn.Linear(2, 1)
    return Task(model, torch.optim.SGD(model.parameters(), lr=0.1),
                DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4),
                loss_fn=torch.nn.functional.mse_loss)
'''


@given(st.integers(1, 64))
def test_cpu_threads(local: int) -> None:
    """At least one thread; half the usable CPUs shared among the node's processes."""
    cpus = len(os.sched_getaffinity(0))
    n = cpu_threads(local)
    assert n == max(1, cpus // (2 * local))
    assert 1 <= n <= max(1, cpus // 2) and cpu_threads(local + 1) <= n


@pytest.mark.parametrize(("env", "device", "expected"), [
    ({}, "cpu", "chosen"), ({"OMP_NUM_THREADS": "1"}, "cpu", "torch's"),
    ({"OMP_NUM_THREADS": "2"}, "cpu", "torch's"), ({"MKL_NUM_THREADS": "2"}, "cpu", "torch's"),
    ({"LOCAL_WORLD_SIZE": "64"}, "cpu", "chosen")])
def test_train_sets_threads_unless_told(tmp_path: Path, env: dict[str, str], device: str,
                                        expected: str) -> None:
    """A real ``schedtrain train``: the task sees ``cpu_threads()`` threads (shared among
    ``LOCAL_WORLD_SIZE`` processes), or torch's own choice when ``OMP_NUM_THREADS`` or
    ``MKL_NUM_THREADS`` is set."""
    (tmp_path / "ttask.py").write_text(TASK)
    spec = tmp_path / "s.toml"
    spec.write_text(textwrap.dedent(f'''
        [run]
        task = "ttask:make_task"
        max_epochs = 1
        device = "{device}"
        [callbacks.nan]
        type = "TerminateOnNaN"
        trigger = {{ every = "1 epoch" }}
        '''))
    seen = tmp_path / "threads"
    argv = ["train", str(spec), "--run-dir", str(tmp_path / "run")]
    chosen = cpu_threads(int(env.get("LOCAL_WORLD_SIZE", "1")))
    if env == FRESH:
        base = {k: v for k, v in fresh_env(tmp_path / "fresh").items() if k not in READ}
        got = subprocess.run([sys.executable, "-m", "schedtrain", *argv], cwd=tmp_path,
                             text=True, capture_output=True,
                             env={**base, **env, "THREADS_SEEN": str(seen)}, check=False)
        code, stderr = got.returncode, got.stderr
        own = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                             env={**base, **env}, text=True, capture_output=True, check=True)
        torchs = int(own.stdout)
    else:
        torchs = chosen + 1  # set in the child before the command: never the rule's count
        code, stderr = _forked_train(argv, tmp_path, env, torchs, seen)
    assert code == 0, stderr
    wanted = chosen if expected == "chosen" else torchs
    assert int(seen.read_text()) == wanted


def _forked_train(argv: list[str], cwd: Path, env: dict[str, str], threads: int,
                  seen: Path) -> tuple[int, str]:
    """``schedtrain ARGV`` in a forked child with ``env`` in place of the variables the
    rule reads and torch set to ``threads``: its exit code and stderr."""
    warm_up()
    start = as_installed_command()

    def before() -> None:
        start()
        for name in READ:
            os.environ.pop(name, None)
        os.environ.update({**env, "THREADS_SEEN": str(seen)})
        torch.set_num_threads(threads)

    err = cwd / "stderr.txt"
    pid = fork_main(argv, cwd, stderr=err, before=before)
    codes = wait([pid], time.monotonic() + 240)
    assert codes is not None, "the command outlived 240 s"
    return codes[0], err.read_text()
