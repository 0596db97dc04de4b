"""Three-valued logic: ``True``, ``False`` and ``None`` (unknown, when a plan lacks values)."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["Truth", "k_and", "k_not", "k_or"]

Truth = bool | None


def k_and(values: Iterable[Truth]) -> Truth:
    """False if any is false, else unknown if any is unknown, else true."""
    unknown = False
    for v in values:
        if v is False:
            return False
        if v is None:
            unknown = True
    return None if unknown else True


def k_or(values: Iterable[Truth]) -> Truth:
    """True if any is true, else unknown if any is unknown, else false."""
    unknown = False
    for v in values:
        if v is True:
            return True
        if v is None:
            unknown = True
    return None if unknown else False


def k_not(value: Truth) -> Truth:
    """Unknown stays unknown."""
    return None if value is None else not value
