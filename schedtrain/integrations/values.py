"""Metric values as the integrations take them (torch-free): one number, and how a value
agreed across ranks by the host itself is named."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from schedtrain.readback import PartStateError, printable, state_number
from schedtrain.time import MAX_COUNT
from schedtrain.triggers.protocol import MetricValue

__all__ = ["HOST", "LatestValues", "number"]

#: A metric's reduction when the host agrees its value across ranks itself (it is used as
#: the host gives it).
HOST: Final = "host"


def number(name: str, value: Any) -> float:
    """``value`` as a float, or a ``TypeError`` naming the metric."""
    if isinstance(value, bool | str | bytes) or value is None:
        raise TypeError(f"metric {name!r} must be a number, got {type(value).__name__} "
                        f"{value!r:.40}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"metric {name!r} must be a number, got {type(value).__name__} "
                        f"{value!r:.40}") from None


class LatestValues:
    """The latest value of each metric and how many it has had (the core's ``MetricsView``).

    Conditions (``when("val/loss < 0.5")``) read the latest value; ``improved`` and
    ``plateau`` look only at values put since they last looked.
    """

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[str, MetricValue] = {}

    def put(self, name: str, value: Any) -> None:
        """Record a new value of ``name`` (a number, or anything ``float()`` reads)."""
        old = self._values.get(name)
        self._values[name] = MetricValue(number(name, value),
                                         1 if old is None else old.count + 1)

    def latest(self, name: str) -> MetricValue | None:
        """The newest value of ``name``, or ``None`` if it has none yet."""
        return self._values.get(name)

    def state_dict(self) -> dict[str, list[float]]:
        """Per metric ``[value, count]`` (plain data: JSON keeps it)."""
        return {n: [v.value, v.count] for n, v in self._values.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict``; a damaged one raises ``PartStateError`` by key, and
        nothing is restored."""
        if not isinstance(state, Mapping):
            raise PartStateError("", "expected a table of metric values")
        values = {}
        for name, pair in state.items():
            key = printable(str(name))[:60]
            if not isinstance(name, str) or not isinstance(pair, list | tuple) or len(pair) != 2:
                raise PartStateError(key, "expected a metric name and [value, count]")
            row = {"value": pair[0], "count": pair[1]}
            try:
                value = state_number(row, "value", real=True)
                seen = state_number(row, "count", low=1, high=MAX_COUNT, whole=True)
            except PartStateError as exc:
                raise PartStateError(f"{key}[{int(exc.key == 'count')}]", exc.reason) from None
            values[name] = MetricValue(float(value), seen)
        self._values = values
