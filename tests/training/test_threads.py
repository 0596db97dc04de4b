"""``schedtrain train`` on the CPU picks torch's thread count unless the user chose one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedtrain.training.threads import cpu_threads

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
    base = {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "LOCAL_WORLD_SIZE")}
    seen = tmp_path / "threads"
    got = subprocess.run([sys.executable, "-m", "schedtrain", "train", str(spec), "--run-dir",
                          str(tmp_path / "run")], cwd=tmp_path, text=True, capture_output=True,
                         env={**base, **env, "THREADS_SEEN": str(seen)}, check=False)
    assert got.returncode == 0, got.stderr
    if expected == "chosen":
        wanted = cpu_threads(int(env.get("LOCAL_WORLD_SIZE", "1")))
    else:
        own = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                             env={**base, **env}, text=True, capture_output=True, check=True)
        wanted = int(own.stdout)
    assert int(seen.read_text()) == wanted
