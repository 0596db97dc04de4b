"""Which firings end the planned run, as they end the real one.

A run stops after the event where a callback asked to (the other callbacks firing
there still run), fires ``train_end`` there, and nothing more. The plan knows the
built-ins that stop: ``EarlyStopping`` without ``patience`` stops whenever it fires
(its trigger holds the metric part); with ``patience`` it counts the checks of
``monitor`` without a new best and stops on a value that is not finite or past a
threshold (``check_finite``, ``stopping_threshold``, ``divergence_threshold``), which a
metric stream (``--metrics``) lets the plan decide too; ``TerminateOnNaN`` stops
at its first firing after a non-finite training loss (its ``eval_end`` part is not
simulated). A firing whose condition the plan cannot decide stops nothing: the plan
goes on, marked ``?``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs

from schedtrain.schedule.firings import Firing
from schedtrain.simulation.metric_stream import StreamMetrics
from schedtrain.spec import Spec
from schedtrain.triggers.metric import early_stop
from schedtrain.triggers.protocol import MetricsView

__all__ = ["StopRule", "stop_rules"]

#: Given a firing and the metric values visible then, why the run stops there, or None.
StopRule = Callable[[Firing, MetricsView | None], str | None]


def stop_rules(spec: Spec) -> dict[str, StopRule]:
    """Callback name -> its stop rule, for the callbacks of ``spec`` that stop a run."""
    rules: dict[str, StopRule] = {}
    for name, cb in spec.callbacks.items():
        if cb.type == "EarlyStopping" and "patience" not in cb.args:
            rules[name] = _fires(name)
        elif cb.type == "EarlyStopping":
            rules[name] = _Patience(name, str(cb.args.get("monitor", "val/loss")),
                                    int(cb.args["patience"]), str(cb.args.get("mode", "min")),
                                    float(cb.args.get("min_delta", 0.0)),
                                    bool(cb.args.get("check_finite", True)),
                                    _number(cb.args.get("stopping_threshold")),
                                    _number(cb.args.get("divergence_threshold")))
        elif cb.type == "TerminateOnNaN":
            rules[name] = _not_finite(name)
    return rules


def _fires(name: str) -> StopRule:
    def rule(f: Firing, _metrics: MetricsView | None) -> str | None:
        return None if f.conditional else f"{name!r} (EarlyStopping) fired"
    return rule


def _not_finite(name: str) -> StopRule:
    """The real run notes every step's loss and reads the note at each firing: it stops
    at the first firing after a step whose loss was not finite. Published ``train/loss``
    values are means since the last one, so a stream holds a non-finite one exactly where
    a step's loss was; the first firing that sees one stops, whatever came since."""
    def rule(f: Firing, metrics: MetricsView | None) -> str | None:
        if not isinstance(metrics, StreamMetrics) or f.event.startswith("eval_"):
            return None
        bad = next((v for v in metrics.visible("train/loss") if not math.isfinite(v)), None)
        if bad is None:
            return None
        return f"{name!r} (TerminateOnNaN) saw train/loss = {bad}"
    return rule


def _number(v: object) -> float | None:
    return None if v is None else float(v)  # type: ignore[arg-type]


@attrs.define
class _Patience:
    """EarlyStopping's own count of checks without a new best, on the stream's values."""

    name: str
    monitor: str
    patience: int
    mode: str
    min_delta: float
    check_finite: bool = True
    stopping_threshold: float | None = None
    divergence_threshold: float | None = None
    best: float | None = None
    wait: int = 0

    def __call__(self, f: Firing, metrics: MetricsView | None) -> str | None:
        got = metrics.latest(self.monitor) if metrics is not None else None
        if got is None or f.conditional:
            return None
        self.best, self.wait, why = early_stop(
            got.value, best=self.best, wait=self.wait, monitor=self.monitor, mode=self.mode,
            min_delta=self.min_delta, patience=self.patience, check_finite=self.check_finite,
            stopping_threshold=self.stopping_threshold,
            divergence_threshold=self.divergence_threshold)
        return None if why is None else f"{self.name!r} (EarlyStopping): {why}"
