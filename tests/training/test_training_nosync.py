"""No host-device sync on steps where nothing fires (marked gpu: skipped without CUDA)."""

from __future__ import annotations

import math

import pytest
import torch

from schedtrain import Schedule, every
from schedtrain.callbacks import Callback, TerminateOnNaN
from schedtrain.training import Trainer

pytestmark = pytest.mark.gpu


class _SyncErrorsBetweenFirings(Callback):
    """Turns sync debugging to "error" after each firing, back to default while firing."""

    def _before_train(self) -> None:
        torch.cuda.set_sync_debug_mode("error")

    def _trigger(self) -> None:
        torch.cuda.set_sync_debug_mode("default")
        _ = self.metrics.value("train/loss")  # firing callbacks may sync
        torch.cuda.set_sync_debug_mode("error")

    def _after_train(self) -> None:
        torch.cuda.set_sync_debug_mode("default")


def test_steps_without_firings_never_sync() -> None:
    """100 steps, a callback every 50: any sync outside a firing raises."""
    torch.manual_seed(0)
    x = torch.randn(100 * 8, 16, device="cuda")
    y = torch.randn(100 * 8, 1, device="cuda")
    data = [(x[i * 8:(i + 1) * 8], y[i * 8:(i + 1) * 8]) for i in range(100)]
    model = torch.nn.Linear(16, 1)
    # foreach=False: the fused/foreach paths may check for infs on the host
    opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=False)
    trainer = Trainer(model, opt, data, torch.nn.functional.mse_loss, device="cuda",
                      schedule=Schedule({"check": every("50 steps")}),
                      bindings={"check": _SyncErrorsBetweenFirings()}, max_epochs=1)
    trainer.fit()
    assert trainer.clock.step == 100


class _NaNWatchSyncingOnlyWhenFired(TerminateOnNaN):
    """TerminateOnNaN with sync errors on everywhere but inside its own firings."""

    def _before_train(self) -> None:
        torch.cuda.set_sync_debug_mode("error")

    def _trigger(self) -> None:
        torch.cuda.set_sync_debug_mode("default")
        super()._trigger()
        torch.cuda.set_sync_debug_mode("error")

    def _after_train(self) -> None:
        torch.cuda.set_sync_debug_mode("default")


def test_watching_every_step_for_a_nan_never_syncs_between_firings() -> None:
    """200 steps with TerminateOnNaN every 100 and a NaN loss at step 70: the folds (every
    64 steps) note it on the device without a sync; the firing at 100 names step 70."""
    torch.manual_seed(0)
    x = torch.randn(200 * 8, 16, device="cuda")
    y = torch.randn(200 * 8, 1, device="cuda")
    x[69 * 8] = math.nan  # step 70's batch
    data = [(x[i * 8:(i + 1) * 8], y[i * 8:(i + 1) * 8]) for i in range(200)]
    model = torch.nn.Linear(16, 1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=False)
    nan = _NaNWatchSyncingOnlyWhenFired()
    trainer = Trainer(model, opt, data, torch.nn.functional.mse_loss, device="cuda",
                      schedule=Schedule({"nan": every("100 steps")}), bindings={"nan": nan},
                      max_epochs=1)
    trainer.fit()
    assert trainer.stopped and trainer.clock.step == 100
    assert nan.first_bad_step == 70
