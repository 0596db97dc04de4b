"""No host-device sync on steps where nothing fires (needs CUDA; skipped without it)."""

from __future__ import annotations

import pytest
import torch

from schedtrain import Schedule, every
from schedtrain.callbacks import Callback
from schedtrain.training import Trainer

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


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


@cuda
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
