"""``Firing`` and ``FiringLog``: what a simulated (or real) run fired, and queries over it."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, overload

import attrs

from schedtrain.time import Timestamp

__all__ = ["Firing", "FiringLog"]



@attrs.frozen
class Firing:
    """One callback firing: at which event, with the clock's counters then.

    ``conditional`` marks a firing that depends on a runtime condition or metric
    that the simulation could not decide.
    """

    callback: str
    event: str
    timestamp: Timestamp
    conditional: bool = False

    @property
    def step(self) -> int:
        """Steps completed at the firing."""
        return self.timestamp.step

    @property
    def epoch(self) -> int:
        """Epochs completed at the firing."""
        return self.timestamp.epoch

    def to_dict(self) -> dict[str, Any]:
        """The plan's JSON record (DESIGN §6)."""
        out: dict[str, Any] = {"callback": self.callback, "event": self.event}
        out.update(self.timestamp.to_dict())
        if self.conditional:
            out["conditional"] = True
        return out


class FiringLog(Sequence[Firing]):
    """Firings in order, with helpers to query them."""

    def __init__(self, firings: Iterable[Firing] = ()) -> None:
        self._firings = tuple(firings)

    @overload
    def __getitem__(self, index: int) -> Firing: ...
    @overload
    def __getitem__(self, index: slice) -> FiringLog: ...
    def __getitem__(self, index: int | slice) -> Firing | FiringLog:
        if isinstance(index, slice):
            return FiringLog(self._firings[index])
        return self._firings[index]

    def __len__(self) -> int:
        return len(self._firings)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FiringLog):
            return self._firings == other._firings
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._firings)

    def __add__(self, other: FiringLog) -> FiringLog:
        return FiringLog(self._firings + tuple(other))

    def __repr__(self) -> str:
        return f"FiringLog({len(self)} firings)"

    def of(self, callback: str) -> FiringLog:
        """Firings of one callback."""
        return FiringLog(f for f in self._firings if f.callback == callback)

    def steps(self, callback: str) -> list[int]:
        """Steps completed at each firing of ``callback``."""
        return [f.step for f in self.of(callback)]

    def epochs(self, callback: str) -> list[int]:
        """Epochs completed at each firing of ``callback``."""
        return [f.epoch for f in self.of(callback)]

    def events(self, callback: str) -> list[str]:
        """The event of each firing of ``callback``."""
        return [f.event for f in self.of(callback)]

    def count(self, callback: str) -> int:  # type: ignore[override,unused-ignore]
        """How many times ``callback`` fired."""
        return sum(1 for f in self._firings if f.callback == callback)

    def callbacks(self) -> list[str]:
        """Names that fired at least once, in order of first firing."""
        return list(dict.fromkeys(f.callback for f in self._firings))

    def to_json(self) -> str:
        """``{"firings": [...]}`` as ``schedtrain plan --format json`` prints it."""
        return json.dumps({"firings": [f.to_dict() for f in self._firings]})


