"""The checkpoint size plan --import estimates is the size a real checkpoint has."""

from __future__ import annotations

import io

import pytest
import torch

from schedtrain.checkpoints.size import estimate_checkpoint_bytes


def _saved_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    """Bytes of the model and optimizer states after one step (the state exists then)."""
    dtype = next(model.parameters()).dtype
    model(torch.randn(2, 512, dtype=dtype)).sum().backward()
    opt.step()
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buffer)
    return buffer.getbuffer().nbytes


@pytest.mark.parametrize(("make", "dtype"), [
    (torch.optim.Adam, torch.float32),
    (torch.optim.AdamW, torch.bfloat16),
    (lambda p: torch.optim.SGD(p, lr=0.1), torch.float32),
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), torch.float32),
    (lambda p: torch.optim.RMSprop(p, centered=True), torch.float32),
])
def test_estimate_is_within_2_percent(make: object, dtype: torch.dtype) -> None:
    """Parameters x bytes x (1 + the optimizer's state factor) is the saved size, +-2%."""
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.BatchNorm1d(512),
                                torch.nn.Linear(512, 256)).to(dtype)
    opt = make(model.parameters())  # type: ignore[operator]
    estimate = estimate_checkpoint_bytes(model, opt)
    assert estimate == pytest.approx(_saved_bytes(model, opt), rel=0.02)
