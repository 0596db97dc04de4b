"""``check --import`` finds everything ``train`` refuses (they share ``prepare_run``), and
``train`` refuses it before training, with exit 2; ``train`` imports custom triggers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from schedtrain.cli import main

ROOT = Path(__file__).resolve().parents[2]

TASK = '''
import torch
from torch.utils.data import DataLoader, TensorDataset

from schedtrain.callbacks import Callback
from schedtrain.training import Task


def make_task():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    model = torch.nn.Linear(4, 1)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    return Task(model, torch.optim.SGD(model.parameters(), lr=0.1), data, data,
                loss_fn=torch.nn.functional.mse_loss)


class Norm(Callback):
    """Puts weights/norm, and says so."""

    produces = ("weights/norm",)

    def _trigger(self):
        self.metrics.put("weights/norm", sum(p.norm() for p in self.model.parameters()))


class Silent(Callback):
    """Puts weights/norm without declaring it."""

    def _trigger(self):
        self.metrics.put("weights/norm", 1.0)
'''

RUN = """
[run]
task = "MODULE:make_task"
max_epochs = 2
device = "cpu"
"""

VALIDATE = """
[callbacks.validate]
type = "InferenceRunner"
trigger = { every = "1 epoch" }
"""

#: Specs ``train`` refuses, each with the key path of the problem it must report.
REFUSED = {
    "no task": ("[run]\nmax_epochs = 2\n" + VALIDATE, "run.task: missing key 'task'"),
    "no end": ('[run]\ntask = "MODULE:make_task"\n' + VALIDATE,
               "run: missing key 'max_epochs' or 'max_steps'"),
    "untyped callback": (RUN + '[callbacks.mine]\ntrigger = { every = "1 epoch" }\n',
                         "callbacks.mine: no `type`"),
    "wrong order": (RUN + """
[callbacks.best]
type = "MinSaver"
trigger = { every = "1 epoch" }
""" + VALIDATE, "callbacks.best: callback 'best' needs metric 'val/loss', which 'validate' "
                "produces, but 'validate' is declared after it"),
    "misspelt scheduler args": (RUN + """
[callbacks.lr]
type = "LRScheduler"
scheduler = "CosineAnnealingLR"
args = { tmax = 10 }
trigger = { every = "1 epoch" }
""", "callbacks.lr: LRScheduler: `args.tmax`: CosineAnnealingLR takes no argument 'tmax'"),
    "unknown class argument": (RUN + """
[callbacks.norm]
type = "MODULE:Norm"
evry = 3
trigger = { every = "1 epoch" }
""", "callbacks.norm.evry: unknown argument 'evry'"),
    "a setter of the params list": (RUN + """
[callbacks.human]
type = "HumanHyperParamSetter"
param = "params"
trigger = { every = "1 epoch" }
""", "callbacks.human.param: 'params' of optimizer param group 0 is not a number (it holds "
     "list); a setter sets one of ['dampening', 'lr', 'momentum', 'weight_decay']"),
    "a setter of a key the optimizer lacks": (RUN + """
[callbacks.lr]
type = "ScheduledHyperParamSetter"
param = "betas"
schedule = [[0, 0.1]]
trigger = { every = "1 epoch" }
""", "callbacks.lr.param: optimizer param group 0 has no 'betas'; its numeric "
     "hyper-parameters are ['dampening', 'lr', 'momentum', 'weight_decay']"),
    "undeclared producer": (RUN + """
[callbacks.norm]
type = "MODULE:Silent"
trigger = { every = "1 epoch" }
[callbacks.best]
type = "MaxSaver"
monitor = "weights/norm"
trigger = { every = "1 epoch" }
""", "callbacks.best.monitor: metric 'weights/norm' is never produced"),
}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with a task module of its own name, as the working directory."""
    name = f"cl_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(TASK)
    (tmp_path / "module_name").write_text(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _spec(project: Path, text: str) -> str:
    path = project / "s.toml"
    path.write_text(text.replace("MODULE", (project / "module_name").read_text()))
    return str(path)


def _errors(err: str) -> list[str]:
    return [x for x in err.splitlines() if x.startswith("error: ")]


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_check_import_finds_what_train_refuses(case: str, project: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """``train`` exits 2 before writing anything; ``check --import`` exits 2 with every
    error line ``train`` printed."""
    text, expected = REFUSED[case]
    path = _spec(project, text)
    assert main(["train", path, "--run-dir", "out"]) == 2
    refused = _errors(capsys.readouterr().err)
    assert any(expected in x for x in refused), refused
    assert not (project / "out").exists()
    assert main(["check", "--import", path]) == 2
    assert set(refused) <= set(_errors(capsys.readouterr().err))


@pytest.mark.parametrize("case", ["no task", "no end", "untyped callback"])
def test_plain_check_finds_the_run_table_problems(case: str, project: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """What needs no import (the [run] table, types) is found by plain ``check`` too."""
    text, expected = REFUSED[case]
    assert main(["check", _spec(project, text)]) == 2
    assert expected in capsys.readouterr().err


def test_spec_without_run_is_for_planning(project: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A spec without [run] checks (with and without --import: an untyped callback is
    bound from Python); ``train`` refuses it with exit 2."""
    path = _spec(project, VALIDATE + '[callbacks.mine]\ntrigger = { every = "1 epoch" }\n')
    assert main(["check", path]) == 0
    assert main(["check", "--import", path]) == 0
    capsys.readouterr()
    assert main(["train", path]) == 2
    assert "run: `schedtrain train` needs a [run] table" in capsys.readouterr().err


def test_declared_produces_count_with_import(project: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A user callback's declared ``produces``: without --import a warning (not known);
    with --import known, no warning; ``train`` trains and the saver saves."""
    path = _spec(project, RUN + """
[callbacks.norm]
type = "MODULE:Norm"
trigger = { every = "1 epoch" }
[callbacks.best]
type = "MaxSaver"
monitor = "weights/norm"
trigger = { every = "1 epoch" }
""")
    assert main(["check", path]) == 0
    assert "'weights/norm' is never produced" in capsys.readouterr().err
    assert main(["check", "--import", path]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["train", path, "--run-dir", "out"]) == 0
    assert (project / "out" / "best" / "max-weights-norm.pt").exists()


def test_train_imports_custom_triggers(tmp_path: Path) -> None:
    """``schedtrain train`` (a real process) runs a spec with a ``custom`` trigger: the
    class is imported and fires where it says (steps 1, 2, 4, 8)."""
    (tmp_path / "mytask.py").write_text(TASK)
    shutil.copy(ROOT / "examples" / "custom_trigger.py", tmp_path / "mytrigger.py")
    spec = tmp_path / "s.toml"
    spec.write_text(textwrap.dedent(RUN.replace("MODULE", "mytask")) + """
[callbacks.log]
type = "TerminateOnNaN"
trigger = { custom = "mytrigger:LogSpaced", args = { first = "1 step" } }
""")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    got = subprocess.run([sys.executable, "-m", "schedtrain", "train", str(spec), "--run-dir",
                          str(tmp_path / "run")], cwd=tmp_path.parent, env=env, text=True,
                         capture_output=True, check=False)
    assert got.returncode == 0, got.stderr
    lines = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines
            if x.get("kind") == "firing" and x.get("callback") == "log"] == [1, 2, 4, 8]
