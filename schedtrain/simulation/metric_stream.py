"""Metric streams for planning: values over time, read from JSONL or given in Python.

A record is visible from the evaluation point its time is reached: a step-stamped
value from that step's ``step_end``, an epoch-stamped one from that epoch's
``epoch_end`` (never, if that epoch is cut short by ``max_steps``).
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from schedtrain.errors import Error
from schedtrain.simulation.simclock import (
    PH_EPOCH_END,
    PH_STEP,
    TRAIN_START,
    Key,
    RunShape,
    batch_key,
)
from schedtrain.time import Time, Unit, as_time
from schedtrain.triggers.protocol import MetricValue

__all__ = ["MetricRecord", "MetricStreamError", "StreamMetrics", "read_metrics", "records"]


class MetricStreamError(Error, ValueError):
    """A metric stream file that cannot be read; says which line and what is wrong."""


class MetricRecord(NamedTuple):
    """A metric value that appears at a given time of a simulated run."""

    at: Time
    name: str
    value: float


def _at(at: Any) -> Time:
    if isinstance(at, int) and not isinstance(at, bool):
        return Time(at, Unit.STEP)
    return as_time(at, "metric time")


def records(metrics: Any, times: dict[tuple[type, Any], Time] | None = None
            ) -> list[MetricRecord]:
    """Accept ``{"val/loss": [("1 epoch", 0.9), ...]}`` or ``[(at, name, value), ...]``.

    ``times`` memoizes the points read (shared by the calls given it): streams of many
    ranks name the same points, and each is parsed once (and is then one object)."""
    at = _at if times is None else _memo(times)
    out: list[MetricRecord] = []
    if isinstance(metrics, Mapping):
        for name, series in metrics.items():
            for point, value in series:
                out.append(MetricRecord(at(point), str(name), float(value)))
    else:
        for point, name, value in metrics:
            out.append(MetricRecord(at(point), str(name), float(value)))
    return out


def _memo(times: dict[tuple[type, Any], Time]) -> Any:
    def at(point: Any) -> Time:
        key = (type(point), point)  # 1, 1.0 and True are equal keys, not equal points
        try:
            hit = times.get(key)
        except TypeError:  # unhashable: _at says what is wrong with it
            return _at(point)
        if hit is None:
            hit = times[key] = _at(point)
        return hit
    return at


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_metrics(path: str | Path) -> list[MetricRecord]:
    """Read a JSONL metric stream: ``{"name", "value", "step" | "epoch"}`` per line.

    Lines of a training run's ``events.jsonl`` work too: those with ``"kind"`` other
    than ``"scalar"`` are skipped, and extra keys are ignored.

    Raises:
        MetricStreamError: the file cannot be read or a line is malformed (with its
            line number).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise MetricStreamError(f"{path}: cannot read the metrics: {reason}") from None
    out: list[MetricRecord] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise MetricStreamError(f"{where}: invalid JSON: {exc.msg}") from None
        if not isinstance(rec, dict):
            raise MetricStreamError(f"{where}: expected a JSON object, found "
                                    f"{type(rec).__name__}")
        if rec.get("kind", "scalar") != "scalar":
            continue
        name, value = rec.get("name"), rec.get("value")
        if not isinstance(name, str):
            raise MetricStreamError(f"{where}: expected \"name\": a metric name, found {name!r}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise MetricStreamError(f"{where}: expected \"value\": a number, found {value!r}")
        try:
            if _is_count(rec.get("step")):
                at = Time(rec["step"], Unit.STEP)
            elif _is_count(rec.get("epoch")):
                at = Time(rec["epoch"], Unit.EPOCH)
            else:
                raise MetricStreamError(f"{where}: expected \"step\" or \"epoch\": a whole "
                                        "number >= 0")
        except ValueError as exc:
            raise MetricStreamError(f"{where}: {exc}") from None
        out.append(MetricRecord(at, name, float(value)))
    return out


def visible_from(at: Time, shape: RunShape) -> Key:
    """The run position from which a value stamped ``at`` is visible."""
    never = (shape.total_steps + 1, 0, 0)
    if at.unit is Unit.EPOCH:
        e = at.base
        if e == 0:
            return TRAIN_START
        # An epoch that never ends (past the run, or cut short) never shows its values.
        return never if e > shape.ended_epochs else (shape.start(e), PH_EPOCH_END, 0)
    if at.unit is Unit.BATCH:
        b = at.base
        return batch_key(b, shape) if b else TRAIN_START
    s = shape.min_steps(at.counter, at.base)
    if s == 0:
        return TRAIN_START
    return (int(s), PH_STEP, 0) if math.isfinite(s) and s <= shape.total_steps else never


class StreamMetrics:
    """Metric values of a simulated run; ``position`` is where the run is now."""

    def __init__(self, stream: Iterable[MetricRecord], shape: RunShape) -> None:
        by_name: dict[str, list[tuple[Key, float]]] = {}
        for r in stream:
            by_name.setdefault(r.name, []).append((visible_from(r.at, shape), float(r.value)))
        ordered = {n: sorted(v, key=lambda kv: kv[0]) for n, v in by_name.items()}
        self._keys = {n: [k for k, _ in v] for n, v in ordered.items()}
        self._values = {n: [x for _, x in v] for n, v in ordered.items()}
        self.position: Key = TRAIN_START

    def latest(self, name: str) -> MetricValue | None:
        """The newest value of ``name`` visible at ``position``, and how many there were."""
        keys = self._keys.get(name)
        if not keys:
            return None
        n = bisect.bisect_right(keys, self.position)
        return MetricValue(self._values[name][n - 1], n) if n else None

    def visible(self, name: str) -> list[float]:
        """Every value of ``name`` visible at ``position``, oldest first."""
        keys = self._keys.get(name, [])
        return self._values[name][:bisect.bisect_right(keys, self.position)] if keys else []
