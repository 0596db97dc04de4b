"""Renamed public names keep working until their removal release: every row of CHANGELOG.md's
"old name | new spelling | removed in" tables resolves, warns naming the new spelling and
reads what the new spelling reads, and is gone from that release on.

The names come from CHANGELOG.md itself, so a rename added there is tested without
touching this file; a row whose root (``trainer``, ``table``, ``schedtrain``) is new here
fails until this file learns how to reach it."""

from __future__ import annotations

import importlib
import re
import warnings
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch

import schedtrain
from schedtrain import StopTraining, every
from schedtrain.schedule import FiringLog, Scheduled
from schedtrain.training import Trainer
from schedtrain.training.renamed import TRAINER

CHANGELOG = Path(__file__).resolve().parents[2] / "CHANGELOG.md"
HEADER = re.compile(r"^\|\s*old name\s*\|\s*new spelling\s*\|\s*removed in\s*\|\s*$")
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*`([^`]+)`\s*\|\s*([\d.]+)\s*\|\s*$")


def renamed() -> list[tuple[str, str, str]]:
    """(old, new, removed in) for every row of the CHANGELOG's renamed-name tables."""
    rows: list[tuple[str, str, str]] = []
    inside = False
    for line in CHANGELOG.read_text().splitlines():
        if HEADER.match(line):
            inside = True
        elif inside and line.startswith("|---"):
            continue
        elif inside and line.startswith("|"):
            match = ROW.match(line)
            assert match, f"CHANGELOG.md: a renamed-name row not as `old` | `new` | N.N: {line}"
            rows.append((match[1], match[2], match[3]))
        else:
            inside = False
    return rows


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


@cache
def _stopped_trainer() -> Trainer:
    """A small fit that a callback stopped at step 3: every old name has a value."""
    def stop(trainer: Any) -> None:
        if trainer.clock.step == 3:
            raise StopTraining("enough at 3")

    model = torch.nn.Linear(2, 1)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                      [(torch.zeros(4, 2), torch.zeros(4, 1))] * 4,
                      torch.nn.functional.mse_loss, max_epochs=3, grad_clip=1.0, seed=7,
                      handle_signals=False, device="cpu",
                      callbacks=[Scheduled(every(1, "steps"), stop, "stopper")])
    trainer.fit()
    return trainer


def _roots() -> dict[str, Any]:
    trainer = _stopped_trainer()
    return {"trainer": trainer, "table": trainer.table, "schedtrain": schedtrain,
            "FiringLog": FiringLog}


def _resolve(name: str) -> Any:
    """``name``'s value: a root of ``_roots``, then attributes; a dotted module path is
    imported as far as it is one."""
    root, *rest = name.split(".")
    roots = _roots()
    assert root in roots, f"CHANGELOG.md names {name!r}: teach this test its root {root!r}"
    value = roots[root]
    for i, part in enumerate(rest):
        if isinstance(value, type(schedtrain)) and part not in vars(value):
            with_module = ".".join([root, *rest[:i + 1]])
            try:
                value = importlib.import_module(with_module)
                continue
            except ModuleNotFoundError:
                pass
        value = getattr(value, part)
    return value


#: What a renamed method needs to say what it does: its use (``table.fire``'s warning
#: comes when it is called).
USE = {"table.fire": lambda fire: fire("step_end")}


@pytest.mark.parametrize(("old", "new", "removed_in"), renamed())
def test_renamed_name_resolves_until_its_release(old: str, new: str, removed_in: str
                                                 ) -> None:
    """Before ``removed_in``: the old name works, warns once naming the new spelling, and
    reads what the new spelling reads. From ``removed_in`` on: it is gone."""
    if _version(schedtrain.__version__) >= _version(removed_in):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            with pytest.raises(AttributeError):
                USE.get(old, lambda v: v)(_resolve(old))
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        expected = eval(new, _roots()) if "(" in new or " " in new else _resolve(new)
    with pytest.warns(DeprecationWarning) as seen:
        value = USE.get(old, lambda v: v)(_resolve(old))
    messages = [str(w.message) for w in seen if w.category is DeprecationWarning]
    assert len(messages) == 1, messages
    assert new.rsplit(".", 1)[-1] in messages[0] and removed_in in messages[0], messages
    if old not in USE:
        assert value == expected, (old, value, expected)


def test_the_table_has_every_renamed_trainer_attribute() -> None:
    """The ``Trainer``'s aliases (``training.renamed``) and the CHANGELOG agree."""
    listed = {old.removeprefix("trainer.") for old, _, _ in renamed()
              if old.startswith("trainer.")}
    assert listed == set(TRAINER)
    assert len(renamed()) >= len(TRAINER) + 4


def test_an_unknown_attribute_is_still_an_attribute_error() -> None:
    """The aliases answer only for their names: a typo fails as it always did, and
    ``hasattr`` of an unknown name is false without a warning."""
    trainer = _stopped_trainer()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not hasattr(trainer, "stop_reasons")
        with pytest.raises(AttributeError, match="'Trainer' object has no attribute 'stp'"):
            _ = trainer.stp  # type: ignore[attr-defined]


def test_the_old_names_are_values_of_the_fit() -> None:
    """The aliases read the fit's record, not constants: a stopped fit's reason and place."""
    trainer = _stopped_trainer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        got = (trainer.stopped_early, trainer.stop_reason,  # type: ignore[attr-defined]
               trainer.seed, trainer.grad_clip)  # type: ignore[attr-defined]
        place = trainer.stop_place  # type: ignore[attr-defined]
    assert got == (True, "enough at 3", 7, 1.0)
    assert "'stopper'" in place
