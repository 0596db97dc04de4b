"""Units, durations (``Time``) and clock snapshots (``Timestamp``).

``Time`` is a value in one unit: ``Time.parse("500 steps")``, ``Time(2, Unit.EPOCH)``.
Printing and parsing round-trip; arithmetic and ordering work within one
dimension (the three time units ``s``, ``min`` and ``h`` share one).
"""

from __future__ import annotations

import enum
import math
import re
from typing import Final

import attrs

from schedtrain.errors import did_you_mean

__all__ = ["COUNTERS", "Time", "Timestamp", "Unit", "as_time"]

#: The clock's monotone counters, in the order used by due vectors.
COUNTERS: Final = ("step", "batch", "epoch", "sample", "token", "seconds")


class Unit(enum.Enum):
    """A unit of training time; ``counter`` names the clock counter it measures."""

    STEP = "step"
    BATCH = "batch"
    EPOCH = "epoch"
    SAMPLE = "sample"
    TOKEN = "token"
    SECOND = "s"
    MINUTE = "min"
    HOUR = "h"

    @property
    def counter(self) -> str:
        """The ``Timestamp`` field this unit reads."""
        return _COUNTER[self]

    @property
    def scale(self) -> int:
        """How many counter units one of this unit is (60 for minutes)."""
        return _SCALE.get(self, 1)

    @property
    def event(self) -> str:
        """The event at which periodic triggers in this unit are evaluated."""
        if self is Unit.EPOCH:
            return "epoch_end"
        if self is Unit.BATCH:
            return "batch_end"
        return "step_end"

    @property
    def is_time(self) -> bool:
        """Whether this is wall time (s, min, h)."""
        return self in _SCALE

    @property
    def is_integral(self) -> bool:
        """Counting units take whole numbers only."""
        return not self.is_time

    def spell(self, value: float) -> str:
        """The unit's name as printed after ``value`` ("1 step", "2 steps", "30 min")."""
        if self.is_time:
            return self.value
        if value == 1:
            return self.value
        return "batches" if self is Unit.BATCH else self.value + "s"

    @classmethod
    def parse(cls, text: str | Unit) -> Unit:
        """Parse a unit name, singular or plural (``steps``, ``epoch``, ``min``...)."""
        if isinstance(text, Unit):
            return text
        try:
            return _SPELLINGS[text.strip()]
        except KeyError:
            raise ValueError(
                f"unknown unit {text!r}{did_you_mean(text, _SPELLINGS)}; expected one of "
                "steps, batches, epochs, samples, tokens, s, min, h"
            ) from None


_COUNTER: Final = {
    Unit.STEP: "step",
    Unit.BATCH: "batch",
    Unit.EPOCH: "epoch",
    Unit.SAMPLE: "sample",
    Unit.TOKEN: "token",
    Unit.SECOND: "seconds",
    Unit.MINUTE: "seconds",
    Unit.HOUR: "seconds",
}
_SCALE: Final = {Unit.SECOND: 1, Unit.MINUTE: 60, Unit.HOUR: 3600}
_SPELLINGS: Final = {
    "step": Unit.STEP, "steps": Unit.STEP,
    "batch": Unit.BATCH, "batches": Unit.BATCH,
    "epoch": Unit.EPOCH, "epochs": Unit.EPOCH,
    "sample": Unit.SAMPLE, "samples": Unit.SAMPLE,
    "token": Unit.TOKEN, "tokens": Unit.TOKEN,
    "s": Unit.SECOND, "sec": Unit.SECOND, "secs": Unit.SECOND,
    "second": Unit.SECOND, "seconds": Unit.SECOND,
    "min": Unit.MINUTE, "mins": Unit.MINUTE, "minute": Unit.MINUTE, "minutes": Unit.MINUTE,
    "h": Unit.HOUR, "hr": Unit.HOUR, "hrs": Unit.HOUR, "hour": Unit.HOUR, "hours": Unit.HOUR,
}  # fmt: skip

_SUFFIX: Final = {"k": 1_000, "M": 1_000_000, "G": 1_000_000_000, "B": 1_000_000_000}
_TIME_RE: Final = re.compile(
    r"^\s*(?P<num>[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][+-]?[0-9]+)?)(?P<suffix>[kMGB]?)"
    r"\s*(?P<unit>[A-Za-z]+)\s*$"
)


def _to_unit(unit: str | Unit) -> Unit:
    return Unit.parse(unit)


def _format_number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return str(int(value)) if value.is_integer() else repr(value)


@attrs.frozen(eq=False, repr=False)
class Time:
    """A non-negative amount of training time in one unit.

    Args:
        value: the amount; whole numbers for steps, batches, epochs, samples and tokens.
        unit: a ``Unit`` or its name ("steps", "min", ...).
    """

    value: int | float
    unit: Unit = attrs.field(converter=_to_unit)

    def __attrs_post_init__(self) -> None:
        value = self.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"time value must be a number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"time must be a finite non-negative amount, got {value!r}")
        if self.unit.is_integral:
            if float(value) != int(value):
                raise ValueError(
                    f"{_format_number(value)} {self.unit.spell(2)} is not a whole number of "
                    f"{self.unit.spell(2)}"
                )
            object.__setattr__(self, "value", int(value))

    @classmethod
    def parse(cls, text: str | Time) -> Time:
        """Parse ``"500 steps"``, ``"1e6 tokens"``, ``"50M tokens"``, ``"30 min"``."""
        if isinstance(text, Time):
            return text
        if not isinstance(text, str):
            raise TypeError(f"expected a time such as '500 steps', got {text!r}")
        match = _TIME_RE.match(text)
        if match is None:
            raise ValueError(
                f"invalid time {text!r}: expected '<number> <unit>' such as '500 steps', "
                "'2 epochs', '1e6 tokens' or '30 min'"
            )
        try:
            unit = Unit.parse(match["unit"])
        except ValueError as exc:
            raise ValueError(f"invalid time {text!r}: {exc}") from None
        number = float(match["num"].replace("_", ""))
        number *= _SUFFIX.get(match["suffix"], 1)
        value: int | float = int(number) if number.is_integer() else number
        try:
            return cls(value, unit)
        except ValueError as exc:
            raise ValueError(f"invalid time {text!r}: {exc}") from None

    @property
    def base(self) -> int | float:
        """The value in the clock counter's own unit (seconds for time units)."""
        return self.value * self.unit.scale

    @property
    def counter(self) -> str:
        """The ``Timestamp`` counter this time is measured on."""
        return self.unit.counter

    def __str__(self) -> str:
        value = self.value
        if isinstance(value, int) and value:
            # Large round counts read better as "50M tokens"; parse accepts the suffix back.
            for suffix, scale in (("G", 10**9), ("M", 10**6)):
                if value % scale == 0:
                    return f"{value // scale}{suffix} {self.unit.spell(value)}"
        return f"{_format_number(value)} {self.unit.spell(value)}"

    def __repr__(self) -> str:
        return f"Time({str(self)!r})"

    def _check_same(self, other: object, op: str) -> Time:
        if not isinstance(other, Time):
            raise TypeError(f"cannot {op} {self} and {other!r}: not a Time")
        if other.counter != self.counter:
            raise TypeError(f"cannot {op} {self} and {other}: they have different units")
        return other

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Time):
            return NotImplemented
        return self.counter == other.counter and self.base == other.base

    def __hash__(self) -> int:
        return hash((self.counter, self.base))

    def __lt__(self, other: Time) -> bool:
        return self.base < self._check_same(other, "compare").base

    def __le__(self, other: Time) -> bool:
        return self.base <= self._check_same(other, "compare").base

    def __gt__(self, other: Time) -> bool:
        return self.base > self._check_same(other, "compare").base

    def __ge__(self, other: Time) -> bool:
        return self.base >= self._check_same(other, "compare").base

    def _finer(self, other: Time) -> Unit:
        return self.unit if self.unit.scale <= other.unit.scale else other.unit

    def __add__(self, other: Time) -> Time:
        other = self._check_same(other, "add")
        unit = self._finer(other)
        return Time((self.base + other.base) / unit.scale if unit.is_time else
                    self.base + other.base, unit)

    def __sub__(self, other: Time) -> Time:
        other = self._check_same(other, "subtract")
        if other.base > self.base:
            raise ValueError(f"cannot subtract {other} from {self}: time can't be negative")
        unit = self._finer(other)
        diff = self.base - other.base
        return Time(diff / unit.scale if unit.is_time else diff, unit)

    def __mul__(self, factor: int | float) -> Time:
        if isinstance(factor, bool) or not isinstance(factor, int | float):
            return NotImplemented
        return Time(self.value * factor, self.unit)

    __rmul__ = __mul__

    def __truediv__(self, other: Time) -> float:
        other = self._check_same(other, "divide")
        if other.base == 0:
            raise ZeroDivisionError(f"cannot divide {self} by {other}")
        return self.base / other.base


def as_time(value: Time | str, name: str = "time") -> Time:
    """Accept a ``Time`` or its text; errors name the parameter ``name``."""
    try:
        return Time.parse(value)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"`{name}`: {exc}") from None


@attrs.frozen
class Timestamp:
    """An immutable snapshot of the clock's counters, all *completed* counts.

    ``epoch`` is 0 during the first epoch and 1 at its ``epoch_end``;
    ``step_in_epoch`` counts optimizer steps completed in the current epoch.
    """

    step: int = 0
    batch: int = 0
    epoch: int = 0
    step_in_epoch: int = 0
    sample: int = 0
    token: int = 0
    seconds: float = 0.0

    def get(self, counter: str) -> int | float:
        """The value of one counter by name (``"step"``, ``"seconds"``...)."""
        value: int | float = getattr(self, counter)
        return value

    def in_unit(self, unit: Unit) -> float:
        """The counter for ``unit`` expressed in that unit (minutes for ``min``)."""
        return self.get(unit.counter) / unit.scale
