"""Inferencers: what ``InferenceRunner`` computes over a validation pass (tensorpack's idea).

Each inferencer is reset before a pass, updated with every batch and reduced at its end
into named scalars. Sums stay tensors on the device (no sync per batch); each result is a
mean over this process's samples, which the trainer averages across ranks like any
metric a callback ``produces``. Built-ins: ``ScalarStats`` (mean of the loss or of scalar
outputs), ``ClassificationError`` (top-k error) and ``TorchMetric`` (any torchmetrics
``Metric``). ``from_spec`` builds one from its TOML table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs
import torch

__all__ = ["ClassificationError", "EvalBatch", "Inferencer", "ScalarStats", "TorchMetric",
           "from_spec"]


@attrs.frozen
class EvalBatch:
    """One validation batch as an inferencer sees it.

    Args:
        outputs: the model's output (a tensor, or a mapping of named outputs).
        targets: the batch's targets.
        loss: the batch's mean loss (``None`` when no inferencer asked for it).
        size: how many samples the batch holds.
    """

    outputs: Any
    targets: Any
    loss: torch.Tensor | None
    size: int


@runtime_checkable
class Inferencer(Protocol):
    """What ``InferenceRunner`` calls: ``names`` it produces, ``needs_loss``, and three steps."""

    names: tuple[str, ...]
    needs_loss: bool

    def reset(self, device: torch.device) -> None:
        """Forget the previous pass; sums will live on ``device``."""

    def update(self, batch: EvalBatch) -> None:
        """Add one batch (no device sync)."""

    def result(self) -> dict[str, torch.Tensor | float]:
        """The pass's value of each name in ``names``."""


class _Sums:
    """Weighted sums per name, kept as device tensors."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.count = 0
        self.device = torch.device("cpu")

    def reset(self, device: torch.device) -> None:
        self.sums, self.count, self.device = {}, 0, device

    def add(self, name: str, value: torch.Tensor, weight: int) -> None:
        value = value.detach().float() * weight
        self.sums[name] = self.sums[name] + value if name in self.sums else value

    def means(self, names: Sequence[str]) -> dict[str, torch.Tensor | float]:
        if self.count == 0:
            return {}
        return {n: self.sums.get(n, torch.zeros((), device=self.device)) / self.count
                for n in names}


class ScalarStats:
    """The mean over samples of scalar values: ``"loss"`` (the loss function's value) or a
    named entry of the model's outputs when they are a mapping.

    Args:
        names: the values, e.g. ``["loss"]`` or ``["loss", "aux_loss"]``.
        prefix: metric names are ``f"{prefix}/{name}"`` (``val/loss``).
    """

    def __init__(self, names: Sequence[str] = ("loss",), prefix: str = "val") -> None:
        if isinstance(names, str) or not names or not all(
                isinstance(n, str) and n for n in names):
            raise ValueError(f"`names` must be a non-empty list of names, got {names!r}")
        self.keys = tuple(names)
        self.prefix = prefix
        self.names = tuple(f"{prefix}/{n}" for n in self.keys)
        self.needs_loss = "loss" in self.keys
        self._sums = _Sums()

    def reset(self, device: torch.device) -> None:
        self._sums.reset(device)

    def update(self, batch: EvalBatch) -> None:
        for key, name in zip(self.keys, self.names, strict=True):
            self._sums.add(name, self._value(key, batch).mean(), batch.size)
        self._sums.count += batch.size

    def _value(self, key: str, batch: EvalBatch) -> torch.Tensor:
        if key == "loss" and batch.loss is not None:
            return batch.loss
        outputs = batch.outputs
        if isinstance(outputs, Mapping) and key in outputs:
            return torch.as_tensor(outputs[key])
        have = sorted(outputs) if isinstance(outputs, Mapping) else []
        raise ValueError(f"ScalarStats: the model's outputs have no {key!r} (outputs: "
                         f"{have or type(outputs).__name__}); name 'loss' or a key of a "
                         "mapping the model returns")

    def result(self) -> dict[str, torch.Tensor | float]:
        return self._sums.means(self.names)

    def __repr__(self) -> str:
        return f"ScalarStats({list(self.keys)!r}, prefix={self.prefix!r})"


class ClassificationError:
    """The fraction of samples whose target is not among the ``k`` highest scores.

    The model's outputs must be ``(N, classes)`` scores and the targets class indexes
    ``(N,)``; ``k = 1`` is the plain error rate.

    Args:
        k: how many top scores count as a hit.
        name: the metric name (default ``val-error-topK``, as tensorpack names them).
    """

    needs_loss = False

    def __init__(self, k: int = 1, name: str | None = None) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"`k` must be a whole number >= 1, got {k!r}")
        if name is None:
            name = f"val-error-top{k}"
        if not isinstance(name, str) or not name:
            raise ValueError(f"`name` must be a metric name, got {name!r}")
        self.k, self.name = k, name
        self.names = (name,)
        self._sums = _Sums()

    def reset(self, device: torch.device) -> None:
        self._sums.reset(device)

    def update(self, batch: EvalBatch) -> None:
        out, targets = batch.outputs, batch.targets
        if not (isinstance(out, torch.Tensor) and out.ndim == 2
                and isinstance(targets, torch.Tensor) and targets.ndim == 1
                and not targets.is_floating_point()):
            raise ValueError(f"ClassificationError {self.name!r}: expected (N, classes) scores "
                             "and (N,) class indexes, got outputs "
                             f"{_shape(out)} and targets {_shape(targets)}")
        if self.k > out.shape[1]:
            raise ValueError(f"ClassificationError {self.name!r}: k = {self.k} but the outputs "
                             f"have {out.shape[1]} classes")
        top = out.topk(self.k, dim=1).indices
        wrong = (top != targets.unsqueeze(1)).all(dim=1).sum()
        self._sums.add(self.name, wrong, 1)
        self._sums.count += batch.size

    def result(self) -> dict[str, torch.Tensor | float]:
        return self._sums.means(self.names)

    def __repr__(self) -> str:
        return f"ClassificationError(k={self.k}, name={self.name!r})"


class TorchMetric:
    """A torchmetrics ``Metric`` as an inferencer: ``update(outputs, targets)`` per batch,
    ``compute()`` at the end (torchmetrics syncs it across processes itself).

    Args:
        metric: the metric, or its class as ``"package.module:Class"`` (torchmetrics is
            imported only then, and must be installed: ``pip install torchmetrics``).
        name: the metric name, e.g. ``val/f1``.
        args: keyword arguments for the class, when ``metric`` names one.
    """

    needs_loss = False

    def __init__(self, metric: Any, name: str,
                 args: Mapping[str, Any] | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"`name` must be a metric name, got {name!r}")
        base = _metric_base()
        if isinstance(metric, str):
            from schedtrain.imports import import_class

            metric = import_class(metric, base, "a torchmetrics metric")(**dict(args or {}))
        elif args:
            raise ValueError("`args` is for a metric given by its class path, not an object")
        if not isinstance(metric, base):
            raise TypeError(f"TorchMetric {name!r}: expected a torchmetrics.Metric, got "
                            f"{type(metric).__name__}")
        self.metric: Any = metric
        self.name = name
        self.names = (name,)

    def reset(self, device: torch.device) -> None:
        self.metric.reset()
        self.metric.to(device)

    def update(self, batch: EvalBatch) -> None:
        self.metric.update(batch.outputs, batch.targets)

    def result(self) -> dict[str, torch.Tensor | float]:
        value = self.metric.compute()
        return {self.name: value.float() if isinstance(value, torch.Tensor) else value}

    def __repr__(self) -> str:
        return f"TorchMetric({type(self.metric).__name__}, name={self.name!r})"


def _metric_base() -> type:
    try:
        import torchmetrics
    except ImportError:
        raise ImportError("TorchMetric needs torchmetrics: pip install torchmetrics") from None
    base: type = torchmetrics.Metric
    return base


def _shape(x: Any) -> str:
    return f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


#: Inferencer types by the name a TOML table gives as ``type``.
KINDS: Mapping[str, type] = {"ScalarStats": ScalarStats,
                             "ClassificationError": ClassificationError,
                             "TorchMetric": TorchMetric}


def from_spec(table: Mapping[str, Any]) -> Inferencer:
    """An inferencer from its TOML table, e.g. ``{type = "ClassificationError", k = 5}``
    (checked beforehand by ``schedtrain check``)."""
    args = dict(table)
    kind = args.pop("type", None)
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown inferencer type {kind!r}; expected one of {', '.join(KINDS)}")
    built: Inferencer = cls(**args)
    return built
