"""Work done once: from ``schedtrain train`` to the first optimizer step, the seeding, the
schedule's binding and order check, the spec's readiness check and the checkpoint read
each run once (``prepare_run`` hands what it built to the ``Trainer``)."""

from __future__ import annotations

import functools
import sys
import textwrap
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from schedtrain.checkpoints import rng, store
from schedtrain.spec import load_spec, readiness
from schedtrain.training import binding, train_from_spec

TASK = '''
import torch
from torch.utils.data import DataLoader, TensorDataset

from schedtrain.training import Task


def make_task():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(32, 4, generator=g)
    y = x.sum(1, keepdim=True)
    model = torch.nn.Linear(4, 1)
    data = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    return Task(model, torch.optim.SGD(model.parameters(), lr=0.01), data,
                loss_fn=torch.nn.functional.mse_loss)
'''

SPEC = '''
[run]
task = "{module}:make_task"
max_steps = {steps}
device = "cpu"
seed = 5
checkpoint_mode = "sync"

[callbacks.save]
type = "ModelSaver"
keep = 5
trigger = {{ every = "2 steps" }}
'''

#: The functions counted: each must run once up to the first optimizer step.
COUNTED: dict[str, tuple[Any, str]] = {
    "seed_everything": (rng, "seed_everything"),
    "bind": (binding, "bind"),
    "order_problems": (binding, "order_problems"),
    "train_problems": (readiness, "train_problems"),
    "load_checked": (store, "load_checked"),
}


class _FirstStep(BaseException):
    """Raised at the first optimizer step, to stop the run there."""


def _count_everywhere(monkeypatch: pytest.MonkeyPatch, counts: Counter[str]) -> None:
    """Wrap each counted function under every name a schedtrain module holds it by
    (``from x import f`` copies the name), so no call goes around the counter."""
    for key, (module, attr) in COUNTED.items():
        real = getattr(module, attr)

        def counted(*args: Any, _real: Callable[..., Any] = real, _key: str = key,
                    **kwargs: Any) -> Any:
            counts[_key] += 1
            return _real(*args, **kwargs)

        wrapper = functools.wraps(real)(counted)
        for name, mod in list(sys.modules.items()):
            if name.startswith("schedtrain") and mod is not None:
                for held, value in list(vars(mod).items()):
                    if value is real:
                        monkeypatch.setattr(mod, held, wrapper)


def _write(folder: Path, module: str, steps: int) -> Path:
    (folder / f"{module}.py").write_text(textwrap.dedent(TASK))
    spec = folder / "spec.toml"
    spec.write_text(SPEC.format(module=module, steps=steps))
    return spec


def test_train_resume_auto_does_each_piece_of_work_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``train --resume auto`` from a checkpoint: up to the first optimizer step, seeding,
    binding, the order check, the readiness check and the checkpoint read run once each."""
    module = f"done_once_task_{tmp_path.name.replace('-', '_')}"
    run_dir = tmp_path / "run"
    first = train_from_spec(load_spec(_write(tmp_path, module, 4)), str(run_dir), None)
    assert first.clock.step == 4
    spec = load_spec(_write(tmp_path, module, 8))  # loading is not counted: `train` loads once

    counts: Counter[str] = Counter()
    _count_everywhere(monkeypatch, counts)
    at_first_step: list[Counter[str]] = []

    def first_step(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        at_first_step.append(Counter(counts))
        raise _FirstStep

    monkeypatch.setattr(torch.optim.SGD, "step", first_step)
    with pytest.raises(_FirstStep):
        train_from_spec(spec, str(run_dir), "auto")
    assert at_first_step, "the resumed run reached no optimizer step"
    assert dict(at_first_step[0]) == dict.fromkeys(COUNTED, 1)


@pytest.mark.parametrize("seeded", [None, 4, 5])
def test_trainer_seeds_unless_prepared_seeded_with_its_seed(
        monkeypatch: pytest.MonkeyPatch, seeded: int | None) -> None:
    """``Trainer(prepared=...)`` seeds only when the streams were not seeded with its own
    seed before the model was built; the schedule is not bound again."""
    import attrs

    from schedtrain import Schedule, every
    from schedtrain.callbacks import Callback
    from schedtrain.training import Trainer
    from schedtrain.training.binding import bind_checked

    prepared = attrs.evolve(bind_checked(Schedule({"noop": every(2, "steps")}),
                                         bindings={"noop": Callback()}), seeded=seeded)
    counts: Counter[str] = Counter()
    _count_everywhere(monkeypatch, counts)
    model = torch.nn.Linear(2, 1)
    args = (model, torch.optim.SGD(model.parameters(), lr=0.1),
            [(torch.zeros(2, 2), torch.zeros(2, 1))], torch.nn.functional.mse_loss)
    trainer = Trainer(*args, max_steps=2, seed=5, device="cpu", handle_signals=False,
                      prepared=prepared)
    assert counts["seed_everything"] == (0 if seeded == 5 else 1)
    assert counts["bind"] == counts["order_problems"] == 0
    assert trainer.schedule is prepared.schedule
    with pytest.raises(TypeError, match="not both"):
        Trainer(*args, max_steps=2, device="cpu", prepared=prepared,
                callbacks=[Callback()])
