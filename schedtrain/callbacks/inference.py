"""``InferenceRunner``: a validation pass feeding pluggable inferencers (``inferencers``).

By default it writes ``val/loss``, ``val/accuracy`` and ``val/error``; given inferencers
(``ScalarStats``, ``ClassificationError``, ``TorchMetric``, or TOML tables naming them) it
writes what they produce instead.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import torch

from schedtrain.callbacks.base import Callback
from schedtrain.callbacks.inferencers import EvalBatch, Inferencer, ScalarStats, from_spec
from schedtrain.triggers import Trigger, every

__all__ = ["InferenceRunner"]


class _Accuracy:
    """The default's ``val/accuracy`` and ``val/error``: top-1, over the batches whose
    outputs are ``(N, classes)`` scores and targets class indexes; not put at all when no
    batch is (a regression or a language model's unflattened logits), rather than a
    misleading 0."""

    needs_loss = False

    def __init__(self, prefix: str) -> None:
        self.names: tuple[str, ...] = (f"{prefix}/accuracy", f"{prefix}/error")
        self._correct = torch.zeros(())
        self._n = 0

    def reset(self, device: torch.device) -> None:
        self._correct, self._n = torch.zeros((), device=device), 0

    def update(self, batch: EvalBatch) -> None:
        out, targets = batch.outputs, batch.targets
        if (isinstance(out, torch.Tensor) and out.ndim == 2 and targets.ndim == 1
                and not targets.is_floating_point()):
            self._correct += (out.argmax(dim=1) == targets).sum()
            self._n += batch.size

    def result(self) -> dict[str, torch.Tensor | float]:
        if self._n == 0:
            return {}
        accuracy = self._correct / self._n
        return {self.names[0]: accuracy, self.names[1]: 1 - accuracy}


class InferenceRunner(Callback):
    """Evaluate the model on validation data when fired (default: every epoch).

    Batches are ``(inputs, targets)``; the loss is the trainer's ``loss_fn`` (or
    ``loss_fn`` given here), computed only when an inferencer needs it. Sums stay on
    the device; the metrics are put lazily (reading them syncs). It fires ``eval_start``
    before the pass, ``eval_step_start`` before each batch's forward and ``eval_step_end``
    after it, and ``eval_end`` after the metrics are put (its payload: ``evaluation``,
    this callback's name, and ``metrics``, what it put), so triggers can name them
    (``on = "eval_end"``). Both step events carry ``batch`` (on the device), ``index``
    (0-based in this evaluation) and ``loss`` (the batch's loss, ``None`` before the
    forward or when no inferencer needs it); ``eval_step_end`` adds the model's
    ``outputs``.

    Fired at ``sanity_eval`` (``[run] sanity_eval_batches = N``), it is a sanity check,
    as Lightning's ``num_sanity_val_steps``: it evaluates at most N batches, fires no
    ``eval_*`` event and puts no metric (a metric trigger or a best-checkpoint saver
    never sees a value from it); a broken validation step fails before training starts.

    ``InferenceRunner(data, [inferencers])``, tensorpack's positional form, works too: a
    list or tuple of inferencers, or one inferencer, in the second place is taken as
    ``inferencers``.

    Args:
        data: validation batches (default: the trainer's ``val_data``).
        loss_fn: ``(outputs, targets) -> loss``; default: the trainer's ``loss_fn``.
        prefix: the default metrics' prefix (``val/loss``, ``val/accuracy``, ``val/error``).
        inferencers: what to compute instead of the default: inferencer objects, or TOML
            tables such as ``{"type": "ClassificationError", "k": 5,
            "name": "val-error-top5"}``; ``produces`` lists their metric names.
    """

    may_stop_alone: ClassVar[bool] = False

    default_trigger: ClassVar[Trigger] = every("1 epoch")
    produces: tuple[str, ...] = ("val/loss", "val/accuracy", "val/error")

    def __init__(self, data: Iterable[Any] | None = None,
                 loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
                 prefix: str = "val",
                 inferencers: Sequence[Inferencer | Mapping[str, Any]] | Inferencer | None
                 = None) -> None:
        loss_fn, inferencers = _loss_and_inferencers(loss_fn, inferencers)
        if data is not None and (isinstance(data, (str, bytes, Mapping))
                                 or not isinstance(data, Iterable)):
            raise TypeError(f"InferenceRunner: `data` must be an iterable of (inputs, "
                            f"targets) batches such as a DataLoader, got {_kind(data)}")
        if not isinstance(prefix, str):
            raise TypeError(f"InferenceRunner: `prefix` must be a string, got {_kind(prefix)}")
        self.data = data
        self.loss_fn = loss_fn
        self.prefix = prefix
        if inferencers is None:
            self.inferencers: list[Inferencer] = [ScalarStats(("loss",), prefix),
                                                  _Accuracy(prefix)]
        else:
            self.inferencers = [_inferencer(x, i) for i, x in enumerate(inferencers)]
        names = [n for inf in self.inferencers for n in inf.names]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"`inferencers` produce {twice} more than once; give each a "
                             "distinct name")
        self.produces = tuple(names)

    @property
    def _needs_loss(self) -> bool:
        return any(inf.needs_loss for inf in self.inferencers)

    def _setup(self) -> None:
        if self.data is None:
            self.data = self.trainer.val_data
        if self.data is None:
            raise ValueError(f"callback {self.name!r} (InferenceRunner): no validation data; "
                             "give Trainer(val_data=...) or InferenceRunner(data=...)")
        if self.loss_fn is None:
            self.loss_fn = self.trainer.loss_fn
        if self.loss_fn is None and self._needs_loss:
            raise ValueError(f"callback {self.name!r} (InferenceRunner): no loss function; "
                             "give InferenceRunner(loss_fn=...)")

    def _trigger(self) -> None:
        model, trainer = self.model, self.trainer
        assert self.data is not None
        # At sanity_eval the event's payload says how many batches; none: a full pass.
        given = trainer.payload.get("sanity_eval_batches")
        limit = given if isinstance(given, int) and not isinstance(given, bool) else None
        sanity = limit is not None
        loss_fn = self.loss_fn if self._needs_loss else None
        was_training = model.training
        model.eval()
        for inf in self.inferencers:
            inf.reset(trainer.device)
        n = 0
        if not sanity:
            trainer.fire("eval_start")
        with torch.inference_mode(), trainer.autocast():
            # islice: a sanity check draws no batch beyond its N
            data = self.data if limit is None else itertools.islice(self.data, limit)
            for index, batch in enumerate(data):
                inputs, targets = trainer.to_device(batch)
                if not sanity:
                    trainer.fire("eval_step_start", batch=(inputs, targets), index=index,
                                 loss=None)
                out = model(inputs)
                size = targets.shape[0]
                loss = loss_fn(out, targets).float() if loss_fn is not None else None
                seen = EvalBatch(out, targets, loss, size)
                for inf in self.inferencers:
                    inf.update(seen)
                n += size
                if not sanity:
                    trainer.fire("eval_step_end", batch=(inputs, targets), index=index,
                                 loss=loss, outputs=out)
        model.train(was_training)
        if n == 0:
            raise ValueError(f"callback {self.name!r} (InferenceRunner): validation data is "
                             "empty")
        results = [inf.result() for inf in self.inferencers]  # computed: a sanity check
        if sanity:
            return
        for result in results:
            for name, value in result.items():
                self.metrics.put(name, value)
        trainer.fire("eval_end", evaluation=self.name, metrics=self.produces)


def _inferencer(item: Inferencer | Mapping[str, Any], index: int) -> Inferencer:
    if isinstance(item, Mapping):
        try:
            return from_spec(item)
        except (ImportError, TypeError, ValueError) as exc:
            raise ValueError(f"`inferencers[{index}]`: {exc}") from None
    if not isinstance(item, Inferencer):
        hint = (" (wrap a torchmetrics metric: TorchMetric(metric, name=...))"
                if callable(getattr(item, "compute", None)) else "")
        raise TypeError(f"`inferencers[{index}]` must be an inferencer (ScalarStats, "
                        f"ClassificationError, TorchMetric) or a table naming one, got "
                        f"{type(item).__name__}{hint}")
    return item


def _is_inferencers(value: object) -> bool:
    """Whether ``value`` is what tensorpack puts second: inferencers, a list or one."""
    # A list or tuple is never a loss function: its items are checked as inferencers,
    # so a wrong one is named by its index.
    return isinstance(value, (Inferencer, list, tuple))


def _loss_and_inferencers(
    loss_fn: object, inferencers: object,
) -> tuple[Callable[[Any, Any], torch.Tensor] | None,
           Sequence[Inferencer | Mapping[str, Any]] | None]:
    """``loss_fn`` and ``inferencers`` checked, tensorpack's ``(data, infs)`` form accepted;
    anything unusable is refused now rather than at the first evaluation."""
    if loss_fn is not None and _is_inferencers(loss_fn):
        if inferencers is not None:
            raise TypeError("InferenceRunner: inferencers given twice, in the second place "
                            "(tensorpack's InferenceRunner(data, infs)) and as `inferencers`")
        loss_fn, inferencers = None, loss_fn
    if loss_fn is not None and (not callable(loss_fn) or isinstance(loss_fn, Inferencer)
                                or callable(getattr(loss_fn, "compute", None))):
        hint = (" (a torchmetrics metric goes in `inferencers`: TorchMetric(metric, "
                "name=...))" if callable(getattr(loss_fn, "compute", None)) else "")
        raise TypeError(f"InferenceRunner: `loss_fn` (the second argument) must be a function "
                        f"(outputs, targets) -> loss, or, as in tensorpack, a list of "
                        f"inferencers, got {_kind(loss_fn)}{hint}")
    if isinstance(inferencers, (Inferencer, Mapping)):
        inferencers = [inferencers]
    if inferencers is not None and not isinstance(inferencers, (list, tuple)):
        raise TypeError(f"InferenceRunner: `inferencers` must be a list of inferencers "
                        f"(ScalarStats, ClassificationError, TorchMetric) or tables naming "
                        f"them, got {_kind(inferencers)}")
    return loss_fn, inferencers


def _kind(value: object) -> str:
    """A short description of a wrong value for an error message."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"
