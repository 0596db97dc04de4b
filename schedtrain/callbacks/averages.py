"""``MovingAverageSummary``: exponential moving averages of chosen metrics.

Each firing folds the metric's newest value into its average, if the metric has had a
new value since the last firing. The averages stay tensors on the device (no sync) and
are saved as they are, so a resumed run continues them bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from schedtrain.callbacks.base import Callback
from schedtrain.triggers import Trigger, every

__all__ = ["MovingAverageSummary"]


class MovingAverageSummary(Callback):
    """Put ``ema = decay * ema + (1 - decay) * value`` of each metric as ``NAME_ema``.

    The first value starts the average. With the default trigger (every step) the train
    loss is averaged per step, as tensorpack does; fired less often, each firing folds in
    the metric's newest value (``train/loss`` is then the mean since the last firing).

    Args:
        metrics: the metrics to average.
        decay: the weight of the past, in ``[0, 1)``.
        suffix: appended to each metric's name for its average.
    """

    may_stop_alone: ClassVar[bool] = False

    default_trigger: ClassVar[Trigger] = every("1 step")

    def __init__(self, metrics: Sequence[str] = ("train/loss",), decay: float = 0.95,
                 suffix: str = "_ema") -> None:
        if isinstance(metrics, str) or not metrics or not all(
                isinstance(m, str) and m for m in metrics):
            raise ValueError(f"`metrics` must be a non-empty list of metric names, got "
                             f"{metrics!r}")
        if (isinstance(decay, bool) or not isinstance(decay, int | float)
                or not 0 <= decay < 1):
            raise ValueError(f"`decay` must be a number in [0, 1), got {decay!r}")
        if not isinstance(suffix, str) or not suffix:
            raise ValueError(f"`suffix` must be a non-empty string, got {suffix!r}")
        self.sources = tuple(metrics)
        self.decay = float(decay)
        self.produces = tuple(f"{m}{suffix}" for m in self.sources)
        self.needs = self.sources
        self.averages: dict[str, torch.Tensor] = {}
        self._seen: dict[str, int] = {}

    def _trigger(self) -> None:
        for source, name in zip(self.sources, self.produces, strict=True):
            got = self.metrics.newest(source)
            if got is None or got[1] == self._seen.get(source):
                continue
            value, self._seen[source] = got
            current = (value.detach() if isinstance(value, torch.Tensor)
                       else torch.tensor(value)).to(torch.float32)
            old = self.averages.get(source)
            ema = (current.clone() if old is None
                   else old.to(current.device) * self.decay + current * (1 - self.decay))
            self.averages[source] = ema
            self.metrics.put(name, ema)

    def state_dict(self) -> dict[str, Any]:
        return {"averages": dict(self.averages), "seen": dict(self._seen)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.averages = dict(state["averages"])
        self._seen = {k: int(v) for k, v in state["seen"].items()}
