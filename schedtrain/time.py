"""Units, durations (``Time``) and clock snapshots (``Timestamp``).

``Time`` is a value in one unit: ``Time.parse("500 steps")``, ``Time(2, Unit.EPOCH)``.
Printing and parsing round-trip; arithmetic and ordering work within one
dimension (the three time units ``s``, ``min`` and ``h`` share one).

Time is exact: every ``Time`` has an integer ``base`` in its counter's unit (whole
steps, samples, ...; nanoseconds for ``s``, ``min`` and ``h``), computed from the
decimal text the user wrote, so ``"1.4 s"`` is exactly 1,400,000,000 ns and float
rounding never decides a firing.
"""

from __future__ import annotations

import enum
import math
import re
from fractions import Fraction
from typing import Final

import attrs

from schedtrain.errors import ArgumentError, did_you_mean, number_text, shorten

__all__ = ["COUNTERS", "MAX_COUNT", "NS_PER_SECOND", "Time", "Timestamp", "Unit", "as_time",
           "exact_ns"]

#: The clock's monotone counters, in the order used by due vectors.
COUNTERS: Final = ("step", "batch", "epoch", "sample", "token", "time_ns")
#: The largest amount a ``Time`` may have in its counter's unit (a signed 64-bit integer:
#: 9.2e18 steps or tokens, or about 292 years in nanoseconds).
MAX_COUNT: Final = 2**63 - 1
NS_PER_SECOND: Final = 1_000_000_000


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

    # The properties read `_value_` and tables keyed by it: `self.value` and a member's
    # hash go through Python-level enum code, and parsing a spec asks these per trigger.
    @property
    def counter(self) -> str:
        """The ``Timestamp`` field this unit reads."""
        return _COUNTER.get(self._value_, self._value_)

    @property
    def scale(self) -> int:
        """How many counter units one of this unit is (60 * 10^9 ns for minutes)."""
        return _SCALE_OF.get(self._value_, 1)

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
        return self._value_ in _SCALE_OF

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
        if not isinstance(text, str):
            raise TypeError(f"expected a unit such as 'steps', 'epochs' or 'min', got {text!r}")
        try:
            return _SPELLINGS[text.strip()]
        except KeyError:
            raise ValueError(
                f"unknown unit {text!r}{did_you_mean(text, _SPELLINGS)}; expected one of "
                "steps, batches, epochs, samples, tokens, s, min, h"
            ) from None


_SCALE: Final = {Unit.SECOND: NS_PER_SECOND, Unit.MINUTE: 60 * NS_PER_SECOND,
                 Unit.HOUR: 3600 * NS_PER_SECOND}
_SCALE_OF: Final = {u.value: scale for u, scale in _SCALE.items()}
_COUNTER: Final = dict.fromkeys(_SCALE_OF, "time_ns")
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
_NUMBER: Final = (r"\s*(?P<num>[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][+-]?[0-9]{1,4})?)"
                  r"(?P<suffix>[kMGB]?)")
# The docs' form is "<number> <unit>": the space is required ("5steps" is refused with a
# hint), as in every example; a suffix belongs to the number ("50M tokens").
_TIME_RE: Final = re.compile(_NUMBER + r"\s+(?P<unit>[A-Za-z]+)\s*")
_NO_SPACE_RE: Final = re.compile(_NUMBER + r"(?P<unit>[A-Za-z]+)\s*")


def _exact(value: int | float) -> Fraction:
    """The decimal a float was written as (``0.35`` is 35/100, not the nearest double)."""
    return Fraction(value) if isinstance(value, int) else Fraction(repr(value))


def exact_ns(seconds: int | float) -> int:
    """Seconds as whole nanoseconds, read from the decimal the number was written as."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(f"expected a number of seconds, got {seconds!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"expected a finite number of seconds >= 0, got {seconds!r}")
    return round(_exact(seconds) * NS_PER_SECOND)


def _format_number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return str(int(value)) if value.is_integer() else repr(value)


def _short(value: int | float) -> str:
    """A number for a message, shortened when it has more digits than anyone reads."""
    text = _format_number(value)
    return text if len(text) <= 24 else f"{text[:6]}...({len(text)} digits)"


def _value_from_base(base: int, unit: Unit) -> int | float:
    whole, rest = divmod(base, unit.scale)
    return whole if rest == 0 else base / unit.scale


@attrs.frozen(eq=False, repr=False, init=False)
class Time:
    """A non-negative amount of training time in one unit.

    Args:
        value: the amount; whole numbers for steps, batches, epochs, samples and tokens.
        unit: a ``Unit`` or its name ("steps", "min", ...).

    ``base`` is the exact amount in the counter's unit (nanoseconds for time units).
    """

    value: int | float
    unit: Unit
    base: int

    def __init__(self, value: int | float, unit: str | Unit = Unit.STEP) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ArgumentError("value", f"time value must be a number, got {value!r}",
                                expected="a number", found=repr(value))
        u = Unit.parse(unit)
        if (isinstance(value, float) and not math.isfinite(value)) or value < 0:
            raise ArgumentError("value", f"time must be a finite non-negative amount, got "
                                f"{value!r}", expected="a finite amount >= 0", found=repr(value))
        exact = _exact(value)
        if u.is_integral and exact.denominator != 1:
            raise ArgumentError("value", f"{_format_number(value)} {u.spell(2)} is not a whole "
                                f"number of {u.spell(2)}", expected="a whole number",
                                found=_format_number(value))
        base = round(exact * u.scale)
        if base > MAX_COUNT:
            raise ArgumentError("value", f"{_short(value)} {u.spell(2)} is too large: "
                                f"at most {MAX_COUNT} {'ns' if u.is_time else u.spell(2)}",
                                expected=f"at most {MAX_COUNT} in the counter's unit",
                                found=_short(value))
        self.__attrs_init__(int(value) if u.is_integral else value, u, base)

    @classmethod
    def from_base(cls, base: int, unit: str | Unit) -> Time:
        """The time of exactly ``base`` counter units (nanoseconds for time units)."""
        u = Unit.parse(unit)
        if not 0 <= base <= MAX_COUNT:
            raise ArgumentError("base", f"a time's base must be in 0..{MAX_COUNT}, got {base}")
        t = cls.__new__(cls)
        t.__attrs_init__(_value_from_base(base, u), u, base)
        return t

    @classmethod
    def parse(cls, text: str | Time) -> Time:
        """Parse ``"500 steps"``, ``"1e6 tokens"``, ``"50M tokens"``, ``"1.4 s"``, ``"30 min"``."""
        if isinstance(text, Time):
            return text
        if not isinstance(text, str):
            raise TypeError(f"expected a time such as '500 steps', got {text!r}")
        match = _TIME_RE.fullmatch(text)
        glued = _NO_SPACE_RE.fullmatch(text) if match is None else None
        if glued is not None:
            raise ValueError(f"invalid time {text!r}: write a space between the number and "
                             f"the unit: '{glued['num']}{glued['suffix']} {glued['unit']}'")
        if match is None:
            raise ValueError(
                f"invalid time {text!r}: expected '<number> <unit>' such as '500 steps', "
                "'2 epochs', '1e6 tokens' or '30 min'"
            )
        num, suffix, unit_text = match.group("num", "suffix", "unit")
        unit = _SPELLINGS.get(unit_text)
        if unit is None:
            try:
                unit = Unit.parse(unit_text)
            except ValueError as exc:
                raise ValueError(f"invalid time {text!r}: {exc}") from None
        huge = number_text(num)
        if huge is not None:
            raise ValueError(f"invalid time {shorten(text)!r}: {huge}; at most {MAX_COUNT} "
                             f"{'ns' if unit.is_time else unit.spell(2)}")
        digits = num.replace("_", "")
        scale = _SUFFIX.get(suffix, 1)
        # Fraction reads the decimal exactly; plain integers (most times) skip it.
        number = int(digits) * scale if digits.isdigit() else Fraction(digits) * scale
        unit_scale = unit.scale
        if isinstance(number, Fraction) and number.denominator != 1 and unit.is_integral:
            raise ValueError(f"invalid time {text!r}: {float(number):g} {unit.spell(2)} is not "
                             f"a whole number of {unit.spell(2)}")
        base = round(number * unit_scale)
        if base > MAX_COUNT:
            raise ValueError(f"invalid time {text!r}: too large, at most {MAX_COUNT} "
                             f"{'ns' if unit.is_time else unit.spell(2)}")
        # from_base's work, without its checks: the unit is a Unit and 0 <= base here
        t = cls.__new__(cls)
        t.__attrs_init__(base if unit_scale == 1 else _value_from_base(base, unit), unit, base)
        return t

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
        return Time.from_base(self.base + other.base, self._finer(other))

    def __sub__(self, other: Time) -> Time:
        other = self._check_same(other, "subtract")
        if other.base > self.base:
            raise ValueError(f"cannot subtract {other} from {self}: time can't be negative")
        return Time.from_base(self.base - other.base, self._finer(other))

    def __mul__(self, factor: int | float) -> Time:
        if isinstance(factor, bool) or not isinstance(factor, int | float):
            return NotImplemented
        if not math.isfinite(factor) or factor < 0:
            raise ValueError(f"cannot multiply {self} by {factor!r}: expected a finite "
                             "factor >= 0")
        exact = self.base * _exact(factor)
        if self.unit.is_integral and exact.denominator != 1:
            raise ValueError(f"{self} * {factor!r} is not a whole number of "
                             f"{self.unit.spell(2)}")
        return Time.from_base(round(exact), self.unit)

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
    except TypeError as exc:
        raise TypeError(f"`{name}`: {exc}") from None
    except ValueError as exc:
        raise ArgumentError(name, f"`{name}`: {exc}", found=repr(value)) from None


@attrs.frozen(init=False)
class Timestamp:
    """An immutable snapshot of the clock's counters, all *completed* counts.

    ``epoch`` is 0 during the first epoch and 1 at its ``epoch_end``;
    ``step_in_epoch`` counts optimizer steps completed in the current epoch;
    ``time_ns`` is training wall time in whole nanoseconds (``seconds`` reads it in
    seconds). Build one with counters by keyword: ``Timestamp(step=1500, seconds=2.5)``.
    """

    step: int
    batch: int
    epoch: int
    step_in_epoch: int
    sample: int
    token: int
    time_ns: int

    def __init__(self, step: int = 0, batch: int = 0, epoch: int = 0, step_in_epoch: int = 0,  # noqa: PLR0917 - the counters, in their documented order
                 sample: int = 0, token: int = 0, seconds: int | float = 0, *,
                 time_ns: int | None = None) -> None:
        ns = exact_ns(seconds) if time_ns is None else time_ns
        self.__attrs_init__(step, batch, epoch, step_in_epoch, sample, token, ns)

    @classmethod
    def make(cls, step: int, batch: int, epoch: int, step_in_epoch: int, sample: int,  # noqa: PLR0917
             token: int, time_ns: int) -> Timestamp:
        """All seven counters, positionally, without conversions (for clocks)."""
        ts = cls.__new__(cls)
        ts.__attrs_init__(step, batch, epoch, step_in_epoch, sample, token, time_ns)
        return ts

    @property
    def seconds(self) -> float:
        """Training wall time in seconds."""
        return self.time_ns / NS_PER_SECOND

    def get(self, counter: str) -> int:
        """The value of one counter by name (``"step"``, ``"time_ns"``...)."""
        value: int = getattr(self, counter)
        return value

    def in_unit(self, unit: Unit) -> int | float:
        """The counter for ``unit`` expressed in that unit (minutes for ``min``)."""
        value = self.get(unit.counter)
        return value if unit.scale == 1 else value / unit.scale

    def to_dict(self) -> dict[str, int | float]:
        """The counters as a plan's JSON record shows them (``seconds`` as a number)."""
        return {"step": self.step, "batch": self.batch, "epoch": self.epoch,
                "step_in_epoch": self.step_in_epoch, "sample": self.sample,
                "token": self.token, "seconds": self.seconds}
