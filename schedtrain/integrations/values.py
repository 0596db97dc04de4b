"""Metric values as the integrations take them (torch-free): one number, and how a value
agreed across ranks by the host itself is named."""

from __future__ import annotations

from typing import Any, Final

__all__ = ["HOST", "number"]

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
