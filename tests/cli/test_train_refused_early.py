"""``train`` refuses a run directory that holds a run before it imports the task (its
module may take seconds: sklearn, a model, an optimizer), after checking the spec."""

from __future__ import annotations

from pathlib import Path

import pytest
from first_day_project import VALIDATE, spec

from schedtrain.cli import main

#: A task module that leaves a mark, then fails, each time it is imported.
MARKED = '''
from pathlib import Path

Path("imported").write_text("the task module was imported")
raise ImportError("this task is not meant to be built")
'''
REFUSAL = ("error: run directory 'out' holds a run (finished at step 12); resume it "
           "(--resume auto) or start over (--overwrite)")


@pytest.fixture
def held(project: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """The project with ``out`` holding a finished run, and a spec ``marked.toml`` whose
    task module marks every import of it."""
    assert main(["train", spec(project, VALIDATE), "--run-dir", "out"]) == 0
    (project / "marked_task.py").write_text(MARKED)
    spec(project, VALIDATE, name="marked.toml")
    text = (project / "specs" / "marked.toml").read_text()
    module = (project / "module_name").read_text()
    (project / "specs" / "marked.toml").write_text(text.replace(module, "marked_task"))
    capsys.readouterr()
    return project


def test_a_held_directory_is_refused_before_the_task_is_imported(
        held: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 2, the one line the trainer would print, and the task module never imported."""
    assert main(["train", "specs/marked.toml", "--run-dir", "out"]) == 2
    assert capsys.readouterr().err.strip() == REFUSAL
    assert not (held / "imported").exists()


@pytest.mark.parametrize("way_out", [["--overwrite"], ["--resume", "auto"]],
                         ids=["overwrite", "resume"])
def test_overwrite_and_resume_are_not_refused(held: Path, way_out: list[str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """With either way out the task is built: its import fails, reported as the task's."""
    assert main(["train", "specs/marked.toml", "--run-dir", "out", *way_out]) == 2
    err = capsys.readouterr().err
    assert "cannot import 'marked_task'" in err and "holds a run" not in err
    assert (held / "imported").exists()


BAD = {  # found loading the spec, binding its schedule, building its callbacks
    "unproduced metric": ('[callbacks.stop]\ntype = "EarlyStopping"\n'
                          'monitor = "val/nothing"\ntrigger = { every = "1 epoch" }\n'
                          + VALIDATE, "callbacks.stop"),
    "wrong order": ('[callbacks.best]\ntype = "MinSaver"\ntrigger = { every = "1 epoch" }\n'
                    + VALIDATE, "callbacks.best: callback 'best' needs metric 'val/loss'"),
    "misspelt scheduler args": ('[callbacks.lr]\ntype = "LRScheduler"\n'
                                'scheduler = "CosineAnnealingLR"\nargs = { tmax = 10 }\n'
                                'trigger = { every = "1 epoch" }\n',
                                "CosineAnnealingLR takes no argument 'tmax'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_spec_is_reported_before_the_held_directory(
        held: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The spec's own problems come first: they need fixing whichever way out is taken.
    (What needs the task, such as a setter's key missing from its optimizer, comes after.)"""
    body, expected = BAD[case]
    assert main(["train", spec(held, body, name="bad.toml"), "--run-dir", "out"]) == 2
    err = capsys.readouterr().err
    assert expected in err and "holds a run" not in err, err
