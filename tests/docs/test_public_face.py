"""The top level shows the library: the three classes every user types, one base class for
the library's errors, and no internals."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import schedtrain
from schedtrain.errors import Error


def test_trainer_callback_task_and_error_are_top_level() -> None:
    """``schedtrain.Trainer``, ``.Callback``, ``.Task`` are the classes of their packages."""
    from schedtrain.callbacks import Callback
    from schedtrain.training import Task, Trainer

    assert (schedtrain.Trainer, schedtrain.Callback, schedtrain.Task, schedtrain.Error) == (
        Trainer, Callback, Task, Error)
    assert {"Trainer", "Callback", "Task", "Error"} <= set(schedtrain.__all__)


def test_import_schedtrain_needs_no_torch_for_the_torch_side_names() -> None:
    """``import schedtrain`` and ``schedtrain.Error`` work with torch unimportable; naming
    ``schedtrain.Trainer`` then says it needs torch (an ImportError, not a crash at import)."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "import schedtrain\n"
            "assert issubclass(schedtrain.SpecError, schedtrain.Error)\n"
            "try:\n    schedtrain.Trainer\nexcept ImportError:\n    print('needs torch')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "needs torch"


@pytest.mark.parametrize(("name", "home"), [("LoopClock", "schedtrain.clock"),
                                            ("SimClock", "schedtrain.simulation"),
                                            ("TriggerTable", "schedtrain.schedule")])
def test_internals_left_the_top_level_with_a_warning(name: str, home: str) -> None:
    """An internal still found at the top level is the same object, with a warning that
    names where it lives now; it is no longer in ``__all__``."""
    with pytest.warns(DeprecationWarning, match=f"{home}.{name}"):
        value = getattr(schedtrain, name)
    assert value is getattr(importlib.import_module(home), name)
    assert name not in schedtrain.__all__


def test_unknown_top_level_name_is_an_attribute_error() -> None:
    """A name the package never had is an AttributeError naming it."""
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = schedtrain.no_such_name  # type: ignore[attr-defined]


def _exception_classes() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for info in pkgutil.walk_packages(schedtrain.__path__, "schedtrain."):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for _, value in inspect.getmembers(module, inspect.isclass):
                if (issubclass(value, BaseException) and value.__module__ == info.name
                        and not issubclass(value, Warning)):
                    found[f"{info.name}.{value.__qualname__}"] = value
    return list(found.values())


def test_every_exception_the_library_defines_is_a_schedtrain_error() -> None:
    """``except schedtrain.Error`` catches every exception class the library defines
    (private helpers aside), in every module."""
    classes = _exception_classes()
    assert len(classes) >= 15  # the walk found the library's errors, not nothing
    outside = [f"{c.__module__}.{c.__qualname__}" for c in classes
               if not issubclass(c, Error) and not c.__name__.startswith("_")]
    assert outside == []


def test_errors_keep_their_builtin_bases() -> None:
    """Code that caught ``ValueError`` before still catches the value errors."""
    from schedtrain.errors import ArgumentError, ScheduleError, SpecError

    for cls in (ArgumentError, ScheduleError, SpecError):
        assert issubclass(cls, ValueError) and issubclass(cls, Error)


def test_a_bad_spec_and_a_bad_checkpoint_are_caught_by_the_base_class(tmp_path: Path) -> None:
    """A malformed spec and a damaged checkpoint both raise what ``except schedtrain.Error``
    catches."""
    from schedtrain.checkpoints import read_checkpoint
    from schedtrain.spec import loads_spec

    with pytest.raises(schedtrain.Error, match="every"):
        loads_spec('[callbacks.a]\ntrigger = { every = "three steps" }\n')
    damaged = tmp_path / "step-00000001.pt"
    damaged.write_bytes(b"not a checkpoint")
    with pytest.raises(schedtrain.Error):
        read_checkpoint(damaged)


def test_trainer_has_at_most_25_methods_and_properties() -> None:
    """The ``Trainer`` is what callbacks see (``TrainingContext``) plus the run's few verbs;
    the rest is ``trainer.config`` and its parts. Dunders are not counted."""
    from schedtrain.callbacks.context import TrainingContext
    from schedtrain.training import Trainer

    members = [n for n, v in vars(Trainer).items()
               if not (n.startswith("__") and n.endswith("__"))
               and (callable(v) or isinstance(v, property))]
    assert len(members) <= 25, sorted(members)
    seen = {n for n in vars(TrainingContext) if not n.startswith("_")}
    held = {"model", "optimizer", "metrics", "clock", "device", "val_data", "loss_fn",
            "steps_in_epoch", "config", "schedule", "comm"}  # instance attributes
    assert seen - held <= set(members), sorted(seen - held - set(members))


def test_how_a_fit_stopped_is_one_record() -> None:
    """``trainer.stopped``: ``None`` after a fit that ran to its end; the reason and the
    place after a stop, the same as ``outcome`` says."""
    import torch

    from schedtrain import StopTraining, every
    from schedtrain.schedule import Scheduled
    from schedtrain.training import Trainer

    def stop_at(step: int) -> Any:
        def stop(trainer: Any) -> None:
            if trainer.clock.step == step:
                raise StopTraining(f"at {step}")
        return stop

    for step in (None, 2, 4):
        model = torch.nn.Linear(2, 1)
        trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                          [(torch.zeros(4, 2), torch.zeros(4, 1))] * 3,
                          torch.nn.functional.mse_loss, max_epochs=2, handle_signals=False,
                          device="cpu", callbacks=[
                              Scheduled(every(1, "steps"), stop_at(step or 0), "stopper")])
        trainer.fit()
        if step is None:
            assert (trainer.outcome, trainer.stopped) == ("finished", None)
        else:
            assert trainer.outcome == "stopped" and trainer.stopped is not None
            assert trainer.stopped.reason == f"at {step}" and trainer.clock.step == step
            assert trainer.stopped.place is not None and "'stopper'" in trainer.stopped.place
