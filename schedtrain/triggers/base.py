"""``Trigger``, the base of every trigger, and the algebra over it: ``&``, ``|``, ``~``.

A trigger is an immutable value. What the table and the simulator ask of it is
``events()`` (where it can be true) and ``compile()``: a ``Node`` (see
``triggers.protocol``) that evaluates, bounds and saves state. Stateless triggers
are their own node. A user's trigger subclasses ``Trigger`` and implements the same
few methods as the built-ins; nothing in the table or simulator names a built-in.

Compositions flatten (``(a & b) & c`` is ``all_of(a, b, c)``) and ``~~a`` is ``a``.
Clock-only children of an ``all_of`` are evaluated first, dynamic children
(conditions, metric triggers) only when all of those hold; ``any_of`` evaluates every
child, so a metric trigger's state never depends on the order of its siblings.
"""

from __future__ import annotations

import math
from typing import Any, Final

import attrs

from schedtrain.errors import ArgumentError
from schedtrain.events import DEFAULT_EVENTS, EventSet
from schedtrain.time import Timestamp
from schedtrain.triggers.nodes import AllNode, AnyNode, NotNode
from schedtrain.triggers.protocol import ANY_TIME, Due, Explanation, Node, Point
from schedtrain.triggers.search import SEARCH_BUDGET, Search, first_possible_memo, remembered

__all__ = ["MAX_DEPTH", "SEARCH_BUDGET", "AllOf", "AnyOf", "Not", "Trigger", "all_of", "any_of",
           "first_possible_memo", "not_"]

#: How deeply compositions may nest (``any`` inside ``all`` inside ...): deeper trees
#: are refused when built, so nothing later recurses without bound.
MAX_DEPTH: Final = 64
#: How many rounds the static "can it ever fire" check spends on one counter.
_FIXPOINT_ROUNDS: Final = 64
class Trigger:
    """Base of every trigger value. Compose with ``&``, ``|`` and ``~``.

    Subclass it for your own trigger and implement ``events`` and ``evaluate``, and
    ``bound`` so the table can skip points where it cannot fire; a trigger with state
    returns a fresh stateful node from ``compile`` (see docs/triggers.md).
    """

    __slots__ = ()

    # -- what the table and the simulator use ------------------------------------------
    def events(self) -> EventSet:
        """Events at which the trigger can be true (default: every default event)."""
        return DEFAULT_EVENTS

    def compile(self) -> Node:
        """A node for the trigger table; stateless triggers are their own node."""
        return self

    def evaluate(self, pt: Point) -> bool | None:
        """Whether the trigger is true at ``pt`` (``None``: cannot be decided in a plan)."""
        raise NotImplementedError(f"{type(self).__name__} must implement evaluate()")

    def bound(self, event: str, last: Timestamp) -> Due:
        """Per counter, the value before which it cannot be true at ``event`` after ``last``.

        The default, ``ANY_TIME``, has the trigger evaluated at every point of ``event``.
        """
        return ANY_TIME

    def explain(self, pt: Point) -> Explanation:
        """Why the trigger is or is not true at ``pt`` (never changes state)."""
        value = self.evaluate(pt)
        return Explanation(repr(self), value, self._reason(pt, value))

    def _reason(self, pt: Point, value: bool | None) -> str:
        return "true here" if value else "false here"

    def state_dict(self) -> dict[str, Any]:
        """Stateless triggers have nothing to save."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Stateless triggers have nothing to restore."""

    # -- what static checks and tools use ----------------------------------------------
    @property
    def dynamic(self) -> bool:
        """Whether evaluation reads anything beyond the clock (metrics, predicates)."""
        return False

    @property
    def pure(self) -> bool:
        """Reads only the clock and keeps no state: equal pure triggers fire together."""
        return not self.dynamic and type(self).compile is Trigger.compile

    def children(self) -> tuple[Trigger, ...]:
        """Sub-triggers, for walking a tree."""
        return ()

    def reads_deadline(self) -> bool:
        """Whether it (or a sub-trigger) reads the run's deadline: a deadline learned
        mid-run (a preemption notice) re-arms it."""
        return any(c.reads_deadline() for c in self.children())

    def child_path(self, index: int) -> str:
        """The key-path step to child ``index`` in error messages (``.any[1]``)."""
        return f".children[{index}]"

    @property
    def depth(self) -> int:
        """Nesting depth: 1 for a leaf."""
        return 1

    def metrics(self) -> frozenset[str]:
        """Metric names this trigger itself reads (not its children)."""
        return frozenset()

    def predicates(self) -> frozenset[str]:
        """Names of registered predicates this trigger itself calls."""
        return frozenset()

    def first_possible(self, counter: str, value: float) -> float:
        """The smallest ``counter`` value >= ``value`` at which it could be true (``inf``: none).

        Used to prove statically that a trigger can never fire. ``step``, ``batch`` and
        ``epoch`` are asked about (each moves by one at the events that read it); the
        default claims nothing.
        """
        return value

    # -- the algebra ------------------------------------------------------------------
    def __and__(self, other: Trigger) -> Trigger:
        if not isinstance(other, Trigger):
            return NotImplemented
        return all_of(self, other)

    def __or__(self, other: Trigger) -> Trigger:
        if not isinstance(other, Trigger):
            return NotImplemented
        return any_of(self, other)

    def __invert__(self) -> Trigger:
        return not_(self)


def _check_children(_i: object, _a: object, value: tuple[Trigger, ...]) -> None:
    if len(value) < 2:
        raise ValueError("a composition needs at least two triggers")
    for child in value:
        if not isinstance(child, Trigger):
            raise TypeError(f"expected a trigger, got {child!r}")


def _check_depth(depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ArgumentError("triggers", f"triggers nest {depth} levels deep; at most "
                            f"{MAX_DEPTH} are allowed", expected=f"at most {MAX_DEPTH} levels",
                            found=f"{depth} levels")


def _wrap(child: Trigger) -> str:
    return f"({child!r})" if isinstance(child, AllOf | AnyOf) else repr(child)


@attrs.frozen(repr=False)
class _Composite(Trigger):
    """A trigger over two or more children."""

    triggers: tuple[Trigger, ...] = attrs.field(validator=_check_children)
    _depth: int = attrs.field(init=False, eq=False, hash=False)
    _pure: bool = attrs.field(init=False, eq=False, hash=False)

    def __attrs_post_init__(self) -> None:
        depth = 1 + max(t.depth for t in self.triggers)
        _check_depth(depth)
        object.__setattr__(self, "_depth", depth)
        object.__setattr__(self, "_pure", all(t.pure for t in self.triggers))

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def pure(self) -> bool:
        return self._pure

    @property
    def dynamic(self) -> bool:
        return any(t.dynamic for t in self.triggers)

    def children(self) -> tuple[Trigger, ...]:
        return self.triggers


@attrs.frozen(repr=False)
class AllOf(_Composite):
    """True where every child is true."""

    def events(self) -> EventSet:
        return EventSet.all_of(t.events() for t in self.triggers)

    def compile(self) -> Node:
        nodes = [t.compile() for t in self.triggers]
        return AllNode(self, nodes, [t.dynamic for t in self.triggers])

    def child_path(self, index: int) -> str:
        return f".all[{index}]"

    def first_possible(self, counter: str, value: float) -> float:
        return remembered(self, counter, value, self._climb)

    def _climb(self, search: Search, counter: str, value: float) -> float:
        # Each child's answer is monotone in `value`, so the rounds climb to the least
        # value all children allow; giving up after a few rounds claims nothing. A
        # child's exact answer `a` holds for every value up to `a`, so it is asked
        # again only once the climb passes it.
        kids = self.triggers
        known = [-math.inf] * len(kids)  # each child's exact answer so far
        for _ in range(_FIXPOINT_ROUNDS):
            nxt = value
            for i, t in enumerate(kids):
                answer = known[i]
                if answer < value:
                    if not search.charge(1):
                        return value
                    gave_up = search.gave_up
                    answer = t.first_possible(counter, value)
                    known[i] = answer if search.gave_up == gave_up else -math.inf
                    if answer == math.inf:
                        return answer
                nxt = max(nxt, answer)
            if nxt == value:
                return nxt
            value = nxt
        search.gave_up += 1
        return value

    def __repr__(self) -> str:
        return " & ".join(_wrap(t) for t in self.triggers)


@attrs.frozen(repr=False)
class AnyOf(_Composite):
    """True where some child is true."""

    def events(self) -> EventSet:
        return EventSet.union_of(t.events() for t in self.triggers)

    def compile(self) -> Node:
        return AnyNode(self, [t.compile() for t in self.triggers])

    def child_path(self, index: int) -> str:
        return f".any[{index}]"

    def first_possible(self, counter: str, value: float) -> float:
        return remembered(self, counter, value, self._lowest)

    def _lowest(self, search: Search, counter: str, value: float) -> float:
        if not search.charge(len(self.triggers)):
            return value
        return min(t.first_possible(counter, value) for t in self.triggers)

    def __repr__(self) -> str:
        return " | ".join(_wrap(t) for t in self.triggers)


@attrs.frozen(repr=False)
class Not(Trigger):
    """True where the child is false. A ``not`` has no clock part: it is evaluated at every
    default event, and names no event of its child."""

    trigger: Trigger
    _depth: int = attrs.field(init=False, eq=False, hash=False)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.trigger, Trigger):
            raise TypeError(f"expected a trigger, got {self.trigger!r}")
        _check_depth(1 + self.trigger.depth)
        object.__setattr__(self, "_depth", 1 + self.trigger.depth)

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def dynamic(self) -> bool:
        return self.trigger.dynamic

    @property
    def pure(self) -> bool:
        return self.trigger.pure

    def children(self) -> tuple[Trigger, ...]:
        return (self.trigger,)

    def child_path(self, index: int) -> str:
        return ".not"

    def compile(self) -> Node:
        return NotNode(self, self.trigger.compile())

    def __repr__(self) -> str:
        inner = self.trigger
        return f"~({inner!r})" if isinstance(inner, AllOf | AnyOf) else f"~{inner!r}"


def all_of(*triggers: Trigger) -> Trigger:
    """True where all ``triggers`` are; nested ``all_of`` are spliced in."""
    flat: list[Trigger] = []
    for t in triggers:
        flat.extend(t.triggers if isinstance(t, AllOf) else [t])
    return flat[0] if len(flat) == 1 else AllOf(tuple(flat))


def any_of(*triggers: Trigger) -> Trigger:
    """True where any of ``triggers`` is; nested ``any_of`` are spliced in."""
    flat: list[Trigger] = []
    for t in triggers:
        flat.extend(t.triggers if isinstance(t, AnyOf) else [t])
    return flat[0] if len(flat) == 1 else AnyOf(tuple(flat))


def not_(trigger: Trigger) -> Trigger:
    """True where ``trigger`` is not; ``not_(not_(t))`` is ``t``."""
    if not isinstance(trigger, Trigger):
        raise TypeError(f"expected a trigger, got {trigger!r}")
    return trigger.trigger if isinstance(trigger, Not) else Not(trigger)
