"""``every("auto")``: a checkpoint interval picked from a save's cost and the failure rate.

Young (1974) and Daly (2006): with a save costing ``C`` seconds and a mean time between
failures ``MTBF``, the interval that loses the least time to saves and to work redone
after a failure is about ``sqrt(2 * C * MTBF)``. ``auto_interval`` turns that into steps
by the measured seconds per step; ``max_overhead`` raises it where ``C / interval``
would take a larger share of the time.

``AutoEvery`` fires at ``step_end`` at step ``first`` (a save whose cost is then known),
then ``interval`` steps after each firing. Its ``Decider`` holds the interval: the saver
that owns the trigger feeds it each save's measured cost (``decide``), and the next
firing is placed by the interval decided then. The step of the next firing is fixed
at the firing itself, so the checkpoint that firing writes holds it, with every
decision made so far (``state_dict``): a run resumed from it fires where the
uninterrupted one did, and goes on as the same recorded decisions say.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Final

import attrs

from schedtrain.errors import ArgumentError
from schedtrain.events import EventSet
from schedtrain.readback import DamagedFile, at_most, between, invalid, structure
from schedtrain.time import Timestamp
from schedtrain.triggers.base import Trigger
from schedtrain.triggers.protocol import NEVER, Due, Explanation, Point, due_on

__all__ = ["DEFAULT_FIRST", "KEEP_DECISIONS", "MAX_INTERVAL", "MAX_SECONDS", "AutoEvery",
           "AutoState", "Decider", "DeciderState", "Decision", "auto_every", "auto_interval",
           "auto_parts", "young_daly_seconds"]

#: The step of an auto trigger's first firing when not given: early, so the save's cost
#: is measured before the interval it decides matters.
DEFAULT_FIRST: Final = 10
#: Decisions a trigger's state keeps (the newest): the log has them all.
KEEP_DECISIONS: Final = 64
#: The longest interval in steps ``every("auto")`` decides, and the farthest past its
#: checkpoint's step a resumed state may place its next firing.
MAX_INTERVAL: Final = 10_000_000
#: The most seconds a measured save cost or step time may be (a resumed state's bound).
MAX_SECONDS: Final = 1e7
_MAX_STEP: Final = 2**62


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or value <= 0:
        raise ArgumentError(name, f"`{name}` must be a finite number > 0, got {value!r}",
                            expected="a finite number > 0", found=repr(value))
    return float(value)


def young_daly_seconds(cost_s: float, mtbf_s: float) -> float:
    """Young/Daly's interval in seconds, ``sqrt(2 * cost_s * mtbf_s)``."""
    return math.sqrt(2 * _positive("cost_s", cost_s) * _positive("mtbf_s", mtbf_s))


def auto_interval(cost_s: float, mtbf_s: float, step_s: float,
                  max_overhead: float | None = None) -> int:
    """The interval in steps (at least 1): Young/Daly's seconds over ``step_s``, raised
    so that ``cost_s`` over the interval's seconds is at most ``max_overhead`` (a
    fraction, 0.02 for 2%) where that is given."""
    step_s = _positive("step_s", step_s)
    steps = max(1, round(young_daly_seconds(cost_s, mtbf_s) / step_s))
    if max_overhead is not None:
        bound = math.ceil(cost_s / (_positive("max_overhead", max_overhead) * step_s)
                          - 1e-9)  # an exact quotient is not raised by a rounding error
        steps = max(steps, bound)
    return min(steps, MAX_INTERVAL)


@attrs.frozen
class Decision:
    """One recorded decision, as a checkpoint holds it."""

    step: int = attrs.field(validator=between(0, _MAX_STEP))
    interval: int = attrs.field(validator=between(1, MAX_INTERVAL))
    cost_s: float = attrs.field(validator=between(-MAX_SECONDS, MAX_SECONDS))
    step_s: float = attrs.field(validator=between(0, MAX_SECONDS))


@attrs.frozen
class DeciderState:
    """A ``Decider``'s state read back: an interval within 1..``MAX_INTERVAL``, what was
    measured (a count and two sums of finite, bounded seconds), the newest decisions."""

    interval: int = attrs.field(validator=between(1, MAX_INTERVAL))
    measured: tuple[int, float, float]
    decisions: tuple[Decision, ...] = attrs.field(validator=at_most(KEEP_DECISIONS))

    def __attrs_post_init__(self) -> None:
        n, costs, steps = self.measured
        if not 0 <= n <= _MAX_STEP:
            raise invalid("measured", f"expected a count of saves >= 0, found {n!r}")
        top = n * MAX_SECONDS
        if not (0 <= costs <= top and 0 <= steps <= top):
            raise invalid("measured", f"expected sums of {n} measurements, each from 0 to "
                          f"{MAX_SECONDS:,.0f} s, found {costs!r} and {steps!r}")


@attrs.frozen
class AutoState:
    """An ``every("auto")`` node's state read back (its ``next`` firing's bound against
    the checkpoint's step is checked where that step is known: ``check_next``)."""

    next: int = attrs.field(validator=between(1, _MAX_STEP))
    decider: DeciderState

    def check_next(self, step: int, path: Path | str, key: str) -> None:
        """Refuse (``DamagedFile`` at ``key``, in ``path``) a next firing outside
        ``step + 1 .. step + MAX_INTERVAL``: a crafted ``10**12`` would mean no
        checkpoint for the rest of the run."""
        if not step < self.next <= step + MAX_INTERVAL:
            raise DamagedFile(path, f"{key}.next", f"expected a step from {step + 1:,} to "
                          f"{step + MAX_INTERVAL:,} (the checkpoint's step {step:,} plus at "
                          f"most {MAX_INTERVAL:,}), found {self.next:,}")


@attrs.define
class Decider:
    """The interval of an ``AutoEvery`` and how it was decided (mutable, plain data).

    Args:
        mtbf_s: the declared mean time between failures in seconds (``None``: not yet
            configured; the interval stays ``first``).
        max_overhead: the most of the time saves may take (a fraction), or ``None``.
        interval: the interval in steps now.
    """

    mtbf_s: float | None = None
    max_overhead: float | None = None
    interval: int = DEFAULT_FIRST
    #: (count, sum of costs, sum of seconds per step) of the saves measured
    measured: tuple[int, float, float] = (0, 0.0, 0.0)
    #: the newest decisions: {"step", "interval", "cost_s", "step_s"}, the save at
    #: ``step`` and what was measured of it
    decisions: list[dict[str, Any]] = attrs.field(factory=list)

    def configure(self, mtbf_s: float, max_overhead: float | None = None) -> None:
        """Set the failure rate and the overhead bound (from ``[run]``)."""
        self.mtbf_s = _positive("mtbf", mtbf_s)
        self.max_overhead = None if max_overhead is None else _positive(
            "max_checkpoint_overhead", max_overhead)

    #: the interval a declared cost gives before any save is measured (``declare``)
    declared: int | None = None

    def declare(self, cost_s: float, step_s: float) -> int:
        """The interval before the first save is measured, from a declared cost
        (``--checkpoint-seconds``) and seconds per step: a plan's, or a run's start."""
        if self.mtbf_s is None:
            raise ValueError("declare the mean time between failures first (configure)")
        self.declared = auto_interval(cost_s, self.mtbf_s, step_s, self.max_overhead)
        self.interval = self.declared
        return self.declared

    def reset(self, first: int) -> None:
        """Forget what was measured: the interval is the declared one, else ``first``."""
        self.interval = self.declared if self.declared is not None else first
        self.measured, self.decisions = (0, 0.0, 0.0), []

    def decide(self, step: int, cost_s: float, step_s: float) -> dict[str, Any]:
        """A save at ``step`` was measured: ``cost_s`` seconds, at ``step_s`` seconds per
        step. The interval becomes Young/Daly's for the mean cost and step time measured
        so far; returns the decision (recorded). The same measurements in the same
        order give the same decisions: a resumed run replays the log's."""
        if self.mtbf_s is None:
            raise ValueError("every('auto') needs a mean time between failures: configure "
                             "the Decider (a saver does, from [run] mtbf or failure_rate)")
        n, costs, steps = self.measured
        n, costs, steps = n + 1, costs + max(cost_s, 0.0), steps + step_s
        self.measured = (n, costs, steps)
        # A save measured at no cost (a clock too coarse) still takes something.
        cost = max(costs / n, 1e-6)
        self.interval = auto_interval(cost, self.mtbf_s, max(steps / n, 1e-9),
                                      self.max_overhead)
        decision = {"step": step, "interval": self.interval, "cost_s": cost_s,
                    "step_s": step_s}
        self.decisions = [*self.decisions, decision][-KEEP_DECISIONS:]
        return decision

    def state_dict(self) -> dict[str, Any]:
        return {"interval": self.interval, "measured": list(self.measured),
                "decisions": [dict(d) for d in self.decisions]}

    def load_state_dict(self, state: dict[str, Any] | DeciderState) -> None:
        """Restore ``state_dict`` (checked: ``DamagedFile`` where a field is out of
        bounds; a resume checked the checkpoint before anything was restored)."""
        rec = state if isinstance(state, DeciderState) else structure(
            state, DeciderState, "checkpoint", "decider")
        self.interval = rec.interval
        self.measured = rec.measured
        self.decisions = [attrs.asdict(d) for d in rec.decisions]


def _check_first(_i: object, _a: object, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError("offset", f"the first firing of every('auto') must be a step "
                            f">= 1, got {value!r}", expected="a number of steps >= 1",
                            found=repr(value))


@attrs.frozen(repr=False)
class AutoEvery(Trigger):
    """Fires at step ``first``, then each time the ``decider``'s interval has passed."""

    first: int = attrs.field(default=DEFAULT_FIRST, validator=_check_first)
    #: shared with the node and the saver that feeds it: not part of the value
    decider: Decider = attrs.field(factory=Decider, eq=False, hash=False)

    def events(self) -> EventSet:
        return EventSet.of("step_end")

    def __attrs_post_init__(self) -> None:
        self.decider.reset(self.first)  # nothing measured yet

    def compile(self) -> _AutoNode:
        # The decider is not reset here: a diff or plan that compiles the schedule again
        # must not wipe what the live run measured (it shares the decider).
        return _AutoNode(self)

    def evaluate(self, pt: Point) -> bool:  # a plain (stateless) look: the first firing
        return pt.event == "step_end" and pt.prev.step < self.first <= pt.now.step

    def bound(self, event: str, last: Timestamp) -> Due:
        return due_on("step", self.first) if event == "step_end" else NEVER

    def first_possible(self, counter: str, value: float) -> float:
        return max(value, self.first) if counter == "step" else value

    def __repr__(self) -> str:
        return "every('auto')" if self.first == DEFAULT_FIRST \
            else f"every('auto', offset='{self.first} steps')"


class _AutoNode:
    """The stateful ``AutoEvery``: the step of the next firing and the decider's state."""

    def __init__(self, trigger: AutoEvery) -> None:
        self.trigger, self.decider = trigger, trigger.decider
        self.next = trigger.first

    def evaluate(self, pt: Point) -> bool:
        if pt.event != "step_end" or pt.now.step < self.next:
            return False
        # Placed now, so the checkpoint this firing writes holds where the next one is.
        self.next = pt.now.step + self.decider.interval
        return True

    def bound(self, event: str, last: Timestamp) -> Due:
        return due_on("step", self.next) if event == "step_end" else NEVER

    def explain(self, pt: Point) -> Explanation:
        due = pt.event == "step_end" and pt.now.step >= self.next
        why = (f"step {pt.now.step} reached the decided {self.next}" if due
               else f"next at step {self.next} (interval {self.decider.interval})")
        return Explanation(repr(self.trigger), due, why)

    def state_dict(self) -> dict[str, Any]:
        return {"next": self.next, "decider": self.decider.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        rec = structure(state, AutoState, "checkpoint", "auto")
        self.next = rec.next
        self.decider.load_state_dict(rec.decider)


def auto_every(first: int = DEFAULT_FIRST) -> AutoEvery:
    """A saver's trigger whose interval is picked from the measured save cost and the
    run's ``mtbf`` (``every = "auto"`` in TOML); the first save at step ``first``."""
    return AutoEvery(first)


def auto_parts(trigger: Trigger) -> list[AutoEvery]:
    """The ``every("auto")`` parts of ``trigger`` (itself included): their intervals wait
    for a saver that measures its saves to feed them."""
    found = [trigger] if isinstance(trigger, AutoEvery) else []
    for child in trigger.children():
        found.extend(auto_parts(child))
    return found
