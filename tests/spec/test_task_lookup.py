"""Where a spec's task and class modules are found, and what a miss says: the spec's
folder, its parent, the current directory, from whichever folder the command runs.

One test runs a fresh ``python -m schedtrain``, as a shell does; the others run the
command in a forked child of the test process (torch and schedtrain imported once),
which starts from the installed command's module path, forgets every module imported
from elsewhere (fork_cli.as_installed_command) and so finds, or misses, a module as a
fresh ``schedtrain`` does. A stale ``mytask`` (it has no task) is planted in this
process to show a name cached here never reaches a command.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest
from fork_cli import as_installed_command, fork_main, fresh_env, wait, warm_up

TASK = """
import torch
from torch.utils.data import DataLoader, TensorDataset

from schedtrain.callbacks import Callback
from schedtrain.training import Task


def make_task():
    x = torch.randn(16, 2)
    model = torch.nn.Linear(2, 1)
    return Task(model, torch.optim.SGD(model.parameters(), lr=0.1),
                DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8),
                loss_fn=torch.nn.functional.mse_loss)


class Quiet(Callback):
    def _trigger(self):
        pass
"""

SPEC = """
[run]
task = "TASK"
max_epochs = 1
device = "cpu"

[callbacks.quiet]
type = "CLASS"
trigger = { every = "1 epoch" }
"""


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    warm_up()


@pytest.fixture(autouse=True)
def _stale_mytask(monkeypatch: pytest.MonkeyPatch,
                  tmp_path_factory: pytest.TempPathFactory) -> None:
    """A ``mytask`` module imported in the test process from another folder, with no
    ``make_task`` and no ``Quiet``: a command that used it would fail to find either."""
    stale = types.ModuleType("mytask")
    stale.__file__ = str(tmp_path_factory.mktemp("stale") / "mytask.py")
    monkeypatch.setitem(sys.modules, "mytask", stale)


def _cli(*args: str, cwd: Path, fresh: bool = False) -> subprocess.CompletedProcess[str]:
    """``schedtrain ARGS`` run from ``cwd``: in a fresh ``python -m schedtrain`` where
    ``fresh``, else in a forked child that starts as the installed command does."""
    if fresh:
        return subprocess.run([sys.executable, "-m", "schedtrain", *args], cwd=cwd,
                              env=fresh_env(cwd.parent), capture_output=True, text=True,
                              check=False)
    out, err = cwd.parent / "stdout.txt", cwd.parent / "stderr.txt"
    pid = fork_main(args, cwd, stdout=out, stderr=err, before=as_installed_command())
    codes = wait([pid], time.monotonic() + 240)
    assert codes is not None, "the command outlived 240 s"
    return subprocess.CompletedProcess(args, codes[0], out.read_text(), err.read_text())


def _project(tmp_path: Path, place: str, task: str = "mytask:make_task",
             cls: str = "mytask:Quiet") -> tuple[Path, Path]:
    """``project/specs/s.toml``, the module ``mytask`` at ``place``; returns the spec and
    the folder to run from."""
    specs = tmp_path / "project" / "specs"
    specs.mkdir(parents=True)
    run_from = tmp_path / "elsewhere"
    run_from.mkdir()
    folder = {"spec folder": specs, "its parent": specs.parent, "cwd": run_from}[place]
    (folder / "mytask.py").write_text(TASK)
    spec = specs / "s.toml"
    spec.write_text(textwrap.dedent(SPEC).replace("TASK", task).replace("CLASS", cls))
    return spec, run_from


@pytest.mark.parametrize("place", ["spec folder", "its parent", "cwd"])
def test_found_from_any_folder(place: str, tmp_path: Path) -> None:
    """``check --import`` finds the task and a class module in each place, run from a
    folder that is not the spec's."""
    spec, run_from = _project(tmp_path, place)
    got = _cli("check", "--import", str(spec), cwd=run_from)
    assert got.returncode == 0, got.stderr


def test_train_finds_the_module_next_to_the_spec(tmp_path: Path) -> None:
    """``train`` runs a spec whose task module sits next to it, from another folder."""
    spec, run_from = _project(tmp_path, "spec folder")
    got = _cli("train", str(spec), "--run-dir", str(tmp_path / "run"), cwd=run_from,
               fresh=True)
    assert got.returncode == 0, got.stderr
    assert got.stdout.startswith("finished: reached max_epochs = 1")


@pytest.mark.parametrize("case", [
    ("mytsk:make_task", "mytask:Quiet", "run.task", "mytsk", "mytask"),
    ("mytask:make_task", "mytaks:Quiet", "callbacks.quiet.type", "mytaks", "mytask"),
])
def test_a_miss_says_where_it_looked(tmp_path: Path, case: tuple[str, ...]) -> None:
    """A module not found: exit 2, no traceback; the key path, each folder looked in with
    what it is, and the closest module there."""
    task, cls, key, wrong, meant = case
    spec, run_from = _project(tmp_path, "spec folder", task=task, cls=cls)
    for command in (["check", "--import"], ["train"]):
        got = _cli(*command, str(spec), cwd=run_from)
        assert got.returncode == 2 and "Traceback" not in got.stderr, got.stderr
        line = next(x for x in got.stderr.splitlines() if key in x)
        assert f"no module named {wrong!r} (did you mean {meant!r}?)" in line
        # In lookup order; the spec's folder and its parent by what they are (the spec's
        # path heads the line), the current directory by its path where the line has room.
        # A line longer than 300 characters (long temporary paths) is cut in its middle.
        folders = ["the spec's folder", "its parent", f"{run_from} (the current directory)"]
        assert len(line) <= 300, line
        if " ... " not in line:
            assert line.index(folders[0]) < line.index(folders[1]) < line.index(
                folders[2]), line


def test_a_misspelt_function_or_submodule_is_suggested(tmp_path: Path) -> None:
    """In a module or package that exists, the closest function or submodule is named."""
    spec, run_from = _project(tmp_path, "its parent", task="mytask:make_tsk")
    got = _cli("check", "--import", str(spec), cwd=run_from)
    assert got.returncode == 2
    assert "'mytask' has no function 'make_tsk' (did you mean 'make_task'?)" in got.stderr
    pkg = spec.parent.parent / "tasks"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "vision.py").write_text(TASK)
    spec.write_text(spec.read_text().replace("mytask:make_tsk", "tasks.vison:make_task"))
    got = _cli("check", "--import", str(spec), cwd=run_from)
    assert got.returncode == 2
    assert "no module named 'tasks.vison' (did you mean 'tasks.vision'?)" in got.stderr


def test_a_module_that_fails_to_import_is_not_a_miss(tmp_path: Path) -> None:
    """A module found whose own import fails is named with its error, not looked for."""
    spec, run_from = _project(tmp_path, "spec folder")
    (spec.parent / "mytask.py").write_text("import no_such_dependency_xyz\n")
    got = _cli("check", "--import", str(spec), cwd=run_from)
    assert got.returncode == 2
    assert ("importing 'mytask' raised ModuleNotFoundError: No module named "
            "'no_such_dependency_xyz'") in got.stderr
    assert "looked in" not in got.stderr
