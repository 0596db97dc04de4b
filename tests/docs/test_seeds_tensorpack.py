"""The tensorpack ResNet seed (examples/seeds/tensorpack_resnet.py) runs and each callback
in its list does its job."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest
import structlog.testing
import torch

from schedtrain.callbacks import Callback
from schedtrain.spec import load_spec
from schedtrain.training.from_spec import build_callbacks

pytest.importorskip("sklearn")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from examples.seeds import tensorpack_resnet as seed  # noqa: E402

torch.set_num_threads(1)


class Terminal(io.StringIO):
    """A stdin that is a terminal (so InjectShell may open its shell)."""

    def isatty(self) -> bool:
        return True


class Person(Callback):
    """Acts as a person would mid-run: writes hyper.txt after epoch 4, touches shell."""

    def __init__(self) -> None:
        self.lrs: list[float] = []

    def _after_epoch(self) -> None:
        self.lrs.append(self.optimizer.param_groups[0]["lr"])
        run_dir = self.trainer.run_dir
        assert run_dir is not None
        if self.now.epoch == 4:
            (run_dir / "hyper.txt").write_text("# by hand\nlr = 0.0005\n")
        if self.now.epoch == 2:
            (run_dir / "shell").touch()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Person, list[Any], Path]:
    """One run of the seed, with a person acting on it; shared by the checks below."""
    run_dir = tmp_path_factory.mktemp("resnet")
    shells: list[Any] = []
    person = Person()
    mp = pytest.MonkeyPatch()
    mp.setattr(sys, "stdin", Terminal())
    try:
        with structlog.testing.capture_logs():
            trainer = seed.build(run_dir, extra=[person],
                                 shell_hook=lambda ns, banner: shells.append((ns, banner)))
            trainer.fit()
    finally:
        mp.undo()
    return trainer, person, shells, run_dir


def test_inference_errors_and_best_checkpoint(run: tuple) -> None:
    """Top-1 and top-5 errors each epoch (top-5 never above top-1, the model learns);
    MinSaver keeps the best top-1 checkpoint; ModelSaver keeps the last two."""
    trainer, _, _, run_dir = run
    top1 = [v for _, v in trainer.metrics.history("val-error-top1")]
    top5 = [v for _, v in trainer.metrics.history("val-error-top5")]
    assert len(top1) == len(top5) == seed.EPOCHS
    assert all(b <= a for a, b in zip(top1, top5, strict=True))
    assert min(top1) < 0.5  # far below chance (0.9)
    assert (run_dir / "best" / "min-val-error-top1.pt").exists()
    assert len(list((run_dir / "checkpoints").glob("step-*.pt"))) == 2


def test_schedule_then_hand_set_lr(run: tuple) -> None:
    """The schedule sets the lr per epoch until hyper.txt names one, which then wins."""
    _, person, _, _ = run
    scheduled = [seed.LR_SCHEDULE[0][1]] * 3 + [seed.LR_SCHEDULE[1][1]]
    assert person.lrs[:4] == scheduled  # epoch 4's lr, written after epoch 4 ends
    assert person.lrs[4:] == [0.0005, 0.0005]


def test_send_stat_sent_the_last_error(run: tuple) -> None:
    """SendStat's command received the newest top-1 error and the epoch."""
    trainer, _, _, run_dir = run
    sent = (run_dir / "sent.txt").read_text().split()
    assert sent == [f"epoch={seed.EPOCHS}",
                    f"val-error-top1={trainer.metrics.value('val-error-top1'):.6g}"]


def test_device_stats_and_moving_average(run: tuple) -> None:
    """Host figures were recorded; train/loss_ema has a value per step."""
    trainer, _, _, _ = run
    assert trainer.metrics.history("host/ram_used_gb")
    steps = trainer.clock.step
    assert len(trainer.metrics.history("train/loss_ema")) == steps


def test_shell_opened_once_with_the_loop(run: tuple) -> None:
    """Touching RUN_DIR/shell opened one shell with the loop's objects in scope."""
    trainer, _, shells, run_dir = run
    assert len(shells) == 1
    ns, banner = shells[0]
    assert set(ns) == {"trainer", "model", "optimizer", "metrics"}
    assert ns["model"] is trainer.model
    assert "epoch 2" in banner
    assert not (run_dir / "shell").exists()


def test_every_callback_fired(run: tuple) -> None:
    """Each callback of the list ran at least once."""
    trainer, _, _, _ = run
    fired = {f.callback for f in trainer.firings}
    assert {type(cb).__name__ for cb in seed.callbacks()} <= fired


def test_toml_spec_is_the_same_list() -> None:
    """specs/seeds/tensorpack_resnet.toml builds the same callback types, in order."""
    spec = load_spec(ROOT / "specs" / "seeds" / "tensorpack_resnet.toml", imports=True)
    built = build_callbacks(spec)
    assert [type(cb).__name__ for cb in built.values()] == [
        type(cb).__name__ for cb in seed.callbacks()]
    runner = built["InferenceRunner"]
    assert runner.produces == ("val/loss", "val-error-top1", "val-error-top5")
