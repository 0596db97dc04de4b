"""``InferenceRunner``: a validation pass writing ``val/loss``, ``val/accuracy``, ``val/error``."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch

from schedtrain.callbacks.base import Callback
from schedtrain.triggers import Trigger, every

__all__ = ["InferenceRunner"]


class InferenceRunner(Callback):
    """Evaluate the model on validation data when fired (default: every epoch).

    Batches are ``(inputs, targets)``; the loss is the trainer's ``loss_fn`` (or
    ``loss_fn`` given here), averaged over samples. Accuracy is computed when the
    outputs are ``(N, classes)`` scores and the targets class indexes. Sums stay on
    the device; the metrics are put lazily (reading them syncs). It fires ``eval_start``
    before the pass, ``eval_step_end`` after each batch (its payload: ``batch``, on the
    device, and the model's ``outputs``) and ``eval_end`` after the metrics are put, so
    triggers can name them (``on = "eval_end"``).

    Args:
        data: validation batches (default: the trainer's ``val_data``).
        loss_fn: default: the trainer's ``loss_fn``.
        prefix: metric name prefix.
    """

    default_trigger: ClassVar[Trigger] = every("1 epoch")
    produces: tuple[str, ...] = ("val/loss", "val/accuracy", "val/error")

    def __init__(self, data: Iterable[Any] | None = None,
                 loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
                 prefix: str = "val") -> None:
        self.data = data
        self.loss_fn = loss_fn
        self.prefix = prefix
        if prefix != "val":
            self.produces = tuple(f"{prefix}/{m}" for m in ("loss", "accuracy", "error"))

    def _setup(self) -> None:
        if self.data is None:
            self.data = self.trainer.val_data
        if self.data is None:
            raise ValueError(f"callback {self.name!r} (InferenceRunner): no validation data; "
                             "give Trainer(val_data=...) or InferenceRunner(data=...)")
        if self.loss_fn is None:
            self.loss_fn = self.trainer.loss_fn
        if self.loss_fn is None:
            raise ValueError(f"callback {self.name!r} (InferenceRunner): no loss function; "
                             "give InferenceRunner(loss_fn=...)")

    def _trigger(self) -> None:
        model, trainer = self.model, self.trainer
        assert self.data is not None and self.loss_fn is not None
        was_training = model.training
        model.eval()
        device = trainer.device
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), device=device)
        n = 0
        trainer.fire("eval_start")
        with torch.inference_mode(), trainer.autocast():
            for batch in self.data:
                inputs, targets = trainer.to_device(batch)
                out = model(inputs)
                size = targets.shape[0]
                loss_sum += self.loss_fn(out, targets).float() * size
                if out.ndim == 2 and not targets.is_floating_point():
                    correct += (out.argmax(dim=1) == targets).sum()
                n += size
                trainer.fire("eval_step_end", batch=(inputs, targets), outputs=out)
        model.train(was_training)
        if n == 0:
            raise ValueError(f"callback {self.name!r} (InferenceRunner): validation data is "
                             "empty")
        p = self.prefix
        self.metrics.put(f"{p}/loss", loss_sum / n)
        accuracy = correct / n
        self.metrics.put(f"{p}/accuracy", accuracy)
        self.metrics.put(f"{p}/error", 1 - accuracy)
        trainer.fire("eval_end")
