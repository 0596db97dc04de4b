"""Which way a metric improves, and warnings where a spec counts it the other way.

``improved`` and ``plateau`` minimise unless given ``mode = "max"``, and so do
``TopKSaver`` and ``EarlyStopping``: on ``val/accuracy`` that keeps the worst weights
and stops while the metric still rises. A spec is warned (not refused: a name may
mislead) where a mode disagrees with the callback it gates (a ``MaxSaver`` keeps the
highest value) or with what the metric's name says (``accuracy`` rises, ``loss`` falls).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, Final, Literal

from schedtrain.spec.model import Spec
from schedtrain.triggers.metric import Improved, Plateau

__all__ = ["callback_direction", "direction_notes", "metric_direction"]

Direction = Literal["min", "max"]

#: Words in a metric name that say lower is better...
LOWER_IS_BETTER: Final = frozenset({
    "loss", "error", "err", "errors", "mse", "mae", "rmse", "nll", "perplexity", "ppl",
    "wer", "cer", "bpc", "bpb", "cost", "regret", "distance"})
#: ...and higher is better.
HIGHER_IS_BETTER: Final = frozenset({
    "accuracy", "acc", "auc", "auroc", "auprc", "f1", "precision", "recall", "iou", "miou",
    "dice", "map", "bleu", "rouge", "psnr", "ssim", "reward", "r2"})

#: Built-in callbacks that keep or judge the best value of ``monitor``: their direction
#: (a fixed one, or the name of their argument that gives it) and default monitor.
_BEST_KEEPERS: Final[Mapping[str, tuple[str, str]]] = {
    "MinSaver": ("min", "val/loss"), "MaxSaver": ("max", "val/accuracy"),
    "TopKSaver": ("mode", "val/loss"), "EarlyStopping": ("mode", "val/loss"),
}


def metric_direction(name: str) -> Direction | None:
    """``"max"`` when the name says higher is better (``val/accuracy``, ``val/f1``),
    ``"min"`` when lower is (``train/loss``, ``val-error-top1``), else ``None``."""
    words = set()
    for word in re.split(r"[^a-z0-9]+", name.lower()):
        words |= {word, word.rstrip("0123456789")}
    lower, higher = bool(words & LOWER_IS_BETTER), bool(words & HIGHER_IS_BETTER)
    if lower == higher:
        return None
    return "min" if lower else "max"


def callback_direction(kind: str | None, args: Mapping[str, Any]) -> tuple[Direction, str] | None:
    """``(direction, monitor)`` of a built-in that keeps the best ``monitor``, or ``None``."""
    if kind is None or kind not in _BEST_KEEPERS:
        return None
    how, default = _BEST_KEEPERS[kind]
    direction = args.get("mode", "min") if how == "mode" else how
    monitor = args.get("monitor", default)
    if direction == "min" and isinstance(monitor, str):
        return "min", monitor
    if direction == "max" and isinstance(monitor, str):
        return "max", monitor
    return None  # refused by the argument checks


def _word(direction: Direction) -> tuple[str, str]:
    return ("lower", "lowest") if direction == "min" else ("higher", "highest")


def direction_notes(spec: Spec) -> list[str]:
    """A warning for each mode that disagrees with its callback or its metric's name."""
    first: dict[str, str] = {}
    for path, text in _notes(spec):
        first.setdefault(path, text)  # a named trigger several callbacks share: once
    return [f"{path}: {text}" for path, text in first.items()]


def _notes(spec: Spec) -> Iterator[tuple[str, str]]:
    for name, cb in spec.callbacks.items():
        keeper = callback_direction(cb.type, cb.args)
        if keeper is not None:
            direction, monitor = keeper
            said = metric_direction(monitor)
            if said is not None and said != direction:
                fix = ("use MaxSaver" if cb.type == "MinSaver" else "use MinSaver"
                       if cb.type == "MaxSaver" else f"give mode = \"{said}\"")
                yield (f"callbacks.{name}.monitor",
                       f"{cb.type} counts a {_word(direction)[0]} {monitor!r} as better, but "
                       f"its name says {_word(said)[0]} is better; {fix}")
        located = spec.located.get(name)
        for node in located.walk() if located is not None else ():
            t = node.trigger
            if not isinstance(t, Improved | Plateau):
                continue
            key = "improved" if isinstance(t, Improved) else "plateau"
            if keeper is not None and t.metric == keeper[1] and t.mode != keeper[0]:
                yield (node.path,
                       f"{t!r} counts a {_word(t.mode)[0]} {t.metric!r} as better, but "
                       f"{cb.type} {name!r} keeps the {_word(keeper[0])[1]}: its trigger and "
                       f"it disagree; give mode = \"{keeper[0]}\" in the `{key}` table")
                continue
            said = metric_direction(t.metric)
            if said is not None and said != t.mode:
                yield (node.path,
                       f"{t!r} counts a {_word(t.mode)[0]} {t.metric!r} as better (mode = "
                       f"\"min\" is the default), but its name says {_word(said)[0]} is "
                       f"better; give mode = \"{said}\" in the `{key}` table")
