"""Lightning: ``ScheduleCallback(keep=...)`` keeps the ``"checkpoint"`` verb's files by the
savers' retention policies (latest, every, best, any), pruning only that callback's own
files, as ``planned_files`` predicts on ``simulate()``'s firings; the records ride in
Lightning's checkpoint."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("lightning")
import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from schedtrain import Schedule, every, simulate
from schedtrain.integrations.lightning import ScheduleCallback
from schedtrain.retention import parse_keep
from schedtrain.simulation.files import SaverFiles, planned_files

for _name in ("lightning", "lightning.pytorch", "lightning.fabric"):
    logging.getLogger(_name).setLevel(logging.ERROR)


def logged_at(global_step: int) -> float:
    """What the module logs as ``m`` in the training step taken at ``global_step``."""
    return float((global_step * 7) % 5)


class Module(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.log("m", logged_at(self.global_step), on_step=True)
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(root: Path, cb: ScheduleCallback, batches: int, epochs: int) -> None:
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         accelerator="cpu", max_epochs=epochs, default_root_dir=str(root),
                         callbacks=[cb])
    trainer.fit(Module(), DataLoader(torch.zeros(batches, 3), batch_size=1))


def step_of(name: str) -> int:
    found = re.search(r"step[-=](\d+)", name)
    assert found is not None
    return int(found.group(1))


@pytest.mark.filterwarnings("ignore")
class TestKeep:
    @settings(max_examples=6, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(batches=st.integers(2, 6), epochs=st.integers(1, 3), k=st.integers(1, 3),
           latest=st.integers(1, 3), grid=st.integers(2, 6), best=st.integers(0, 2))
    def test_kept_files_are_the_policys(self, tmp_path_factory: pytest.TempPathFactory, *,
                                        batches: int, epochs: int, k: int, latest: int,
                                        grid: int, best: int) -> None:
        """After each save the folder holds what the policy keeps of that callback's saves
        (planned_files on simulate()'s firings, ranked by the value of ``m`` at each save);
        another callback's file and a file nobody recorded stay."""
        rules: list[dict[str, Any]] = [{"latest": latest}, {"every": f"{grid} steps"}]
        if best:
            rules.append({"best": best, "monitor": "m"})
        keep = {"any": rules}
        schedule = Schedule({"ckpt": every(f"{k} steps"), "other": every("1 epoch")})
        root = tmp_path_factory.mktemp("pl")
        folder = root / "checkpoints"
        folder.mkdir()
        (folder / "ckpt-epoch=0-step=999.ckpt").write_text("not recorded")
        cb = ScheduleCallback(schedule, {"ckpt": "checkpoint", "other": "checkpoint"},
                              keep={"ckpt": keep}, record=True)
        fit(root, cb, batches, epochs)
        ckpt_steps = [f.step for f in cb.firings if f.callback == "ckpt"]
        log = simulate(schedule, epochs=epochs, steps_per_epoch=batches)
        assert ckpt_steps == log.steps("ckpt")
        plan = planned_files(log, {"ckpt": SaverFiles(keep=parse_keep(keep))},
                             lambda f: {"m": logged_at(f.step - 1)})
        final = sorted(step_of(n) for n in plan[-1].files) if plan else []
        assert sorted(step_of(p.name) for p in folder.iterdir()
                      if p.name.startswith("ckpt-") and "999" not in p.name) == final
        assert (folder / "ckpt-epoch=0-step=999.ckpt").exists()
        others = [p for p in folder.iterdir() if p.name.startswith("other-")]
        assert len(others) == len(log.steps("other"))

    def test_keep_names_a_checkpoint_callback(self) -> None:
        """``keep`` for a callback not bound to "checkpoint" is refused, naming it."""
        with pytest.raises(ValueError, match=r"keep\['s'\]: only a callback bound to "
                                             r"'checkpoint'"):
            ScheduleCallback(Schedule({"s": every("1 step")}), {"s": "stop"}, keep={"s": 2})

    def test_a_bad_policy_is_named(self) -> None:
        with pytest.raises(ValueError, match=r"keep\['s'\]: keep.latest"):
            ScheduleCallback(Schedule({"s": every("1 step")}), {"s": "checkpoint"},
                             keep={"s": {"latest": 0}})


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(("batches", "epochs"), [(4, 2), (3, 1)])
def test_a_function_is_told_its_event(tmp_path: Path, batches: int, epochs: int) -> None:
    """``fn(trainer, pl_module, event)`` gets the event that fired it, and
    ``trainer.global_step`` there is the clock's step (one ahead at a batch_end)."""
    schedule = Schedule({"f": every("2 steps") | every("1 epoch"), "b": every("3 batches")})
    told: list[tuple[str, str, int]] = []

    def tell(name: str) -> Any:
        return lambda trainer, module, event: told.append((name, event, trainer.global_step))

    cb = ScheduleCallback(schedule, {"f": tell("f"), "b": tell("b")}, record=True)
    fit(tmp_path, cb, batches, epochs)
    log = simulate(schedule, epochs=epochs, steps_per_epoch=batches)
    assert told == [(f.callback, f.event, f.step + (f.event == "batch_end")) for f in log]


@pytest.mark.filterwarnings("ignore")
@settings(max_examples=3, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(k=st.integers(1, 2), cut=st.integers(1, 4), latest=st.integers(1, 2))
def test_resumed_fit_keeps_what_the_unbroken_one_keeps(
        tmp_path_factory: pytest.TempPathFactory, k: int, cut: int, latest: int) -> None:
    """Stopped at a save (``max_steps``) and resumed from the checkpoint written there, the
    fit ends with the files the uninterrupted fit kept: the records ride in the checkpoint."""
    keep = {"ckpt": {"any": [{"latest": latest}, {"every": "3 steps"}]}}
    schedule = Schedule({"ckpt": every(f"{k} steps")})
    batches, epochs = 3, 3
    full = tmp_path_factory.mktemp("full")
    fit(full, ScheduleCallback(schedule, {"ckpt": "checkpoint"}, keep=keep), batches, epochs)
    cut = cut * k
    part = tmp_path_factory.mktemp("part")

    def trainer(**kw: Any) -> pl.Trainer:
        return pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False, num_sanity_val_steps=0,
                          accelerator="cpu", max_epochs=epochs, default_root_dir=str(part),
                          callbacks=[ScheduleCallback(schedule, {"ckpt": "checkpoint"},
                                                      keep=keep)], **kw)

    data = DataLoader(torch.zeros(batches, 3), batch_size=1)
    trainer(max_steps=cut).fit(Module(), data)
    (saved,) = [p for p in (part / "checkpoints").iterdir() if step_of(p.name) == cut]
    trainer().fit(Module(), data, ckpt_path=str(saved))
    assert sorted(p.name for p in (part / "checkpoints").iterdir()) == \
        sorted(p.name for p in (full / "checkpoints").iterdir())


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("keep", [None, {"latest": 1}])
def test_saves_add_no_lightning_log_line(tmp_path: Path, keep: Any) -> None:
    """The ``"checkpoint"`` verb's saves (with and without ``keep``) make Lightning log
    nothing: a fit that saves at every step logs what one that never saves logs (it
    used to add "`weights_only` was not set" per save)."""
    logger = logging.getLogger("lightning.pytorch")
    handler, level = _Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)  # what a user sees (the default is INFO)
    try:
        seen = []
        for when in ("1 step", "100 epochs"):
            handler.messages.clear()
            cb = ScheduleCallback(Schedule({"ckpt": every(when)}), {"ckpt": "checkpoint"},
                                  keep=None if keep is None else {"ckpt": keep})
            fit(tmp_path / when, cb, batches=3, epochs=2)
            seen.append(list(handler.messages))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert len(list((tmp_path / "1 step" / "checkpoints").iterdir())) == (6 if keep is None
                                                                          else 1)
    assert seen[0] == seen[1]
