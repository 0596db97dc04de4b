"""The project a new user starts from (the first-day tests): a folder with a small task
module and a ``specs/`` folder, and ``spec()`` to write a spec into it.

A pytest plugin (tests/conftest.py loads it), so every test folder has the ``project``
fixture; the tests that use it are in cli/test_train_lines.py, training/test_seed.py,
spec/test_unproduced_metrics.py, spec/test_clock_from_run.py and
monitors/test_sink_cadence.py.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

TASK = '''
import torch
from torch.utils.data import DataLoader, TensorDataset

from schedtrain.callbacks import Callback
from schedtrain.training import Task


class Fragile(torch.nn.Linear):
    """Raises in its forward from the ``fail_at``-th call on."""

    fail_at = 0
    calls = 0

    def forward(self, x):
        type(self).calls += 1
        if self.fail_at and type(self).calls >= self.fail_at:
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")
        return super().forward(x)


def make_task(fail_at: int = 0):
    g = torch.Generator().manual_seed(0)  # the data does not depend on the run's seed
    x = torch.randn(32, 4, generator=g)
    y = x.sum(1, keepdim=True)
    Fragile.fail_at, Fragile.calls = fail_at, 0
    model = Fragile(4, 1)  # random init, from the generator the run's seed seeded
    return Task(model, torch.optim.SGD(model.parameters(), lr=0.1),
                DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True),
                DataLoader(TensorDataset(x, y), batch_size=16),
                loss_fn=torch.nn.functional.mse_loss)


def failing_task():
    return make_task(fail_at=3)


class Boom(Callback):
    def _trigger(self):
        raise ValueError("bad value\\nsecond line")
'''

VALIDATE = """
    [callbacks.validate]
    type = "InferenceRunner"
    trigger = { every = "1 epoch" }
"""



@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project directory with a task module (``firstday_task``) and a ``specs/`` folder."""
    name = f"firstday_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(TASK)
    (tmp_path / "specs").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "module_name").write_text(name)
    return tmp_path


def spec(project: Path, body: str, task: str = "make_task", name: str = "s.toml") -> str:
    """Write ``specs/NAME`` with a ``[run]`` table using the project's task."""
    module = (project / "module_name").read_text()
    path = project / "specs" / name
    text = textwrap.dedent(body).replace("MODULE", module)
    if "[run]" not in text:
        text = f'[run]\ntask = "{module}:{task}"\nmax_epochs = 3\ndevice = "cpu"\n' + text
    path.write_text(text)
    return str(path)
