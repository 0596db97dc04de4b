"""Composition: ``all_of`` (``&``), ``any_of`` (``|``) and ``not_`` (``~``).

Compositions flatten (``(a & b) & c`` is ``all_of(a, b, c)``) and ``~~a`` is
``a``. Evaluation is three-valued (Kleene). Clock-only children of an ``all_of``
are evaluated first, and dynamic children (conditions, metric triggers) only
when all of those hold: "dynamic parts are evaluated only when their clock
part fires". ``any_of`` evaluates every child, so a metric trigger's state
never depends on the order of its siblings.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from schedtrain.time import COUNTERS, Timestamp
from schedtrain.triggers.base import (
    ANY_TIME,
    NEVER,
    Due,
    Explanation,
    Node,
    Point,
    Trigger,
)

__all__ = ["AllOf", "AnyOf", "Not", "all_of", "any_of", "not_"]


def _check_children(_i: object, _a: object, value: tuple[Trigger, ...]) -> None:
    if len(value) < 2:
        raise ValueError("a composition needs at least two triggers")
    for child in value:
        if not isinstance(child, Trigger):
            raise TypeError(f"expected a trigger, got {child!r}")


def _wrap(child: Trigger) -> str:
    return f"({child!r})" if isinstance(child, AllOf | AnyOf) else repr(child)


@attrs.frozen(repr=False)
class _Composite(Trigger):
    """A trigger over two or more children."""

    triggers: tuple[Trigger, ...] = attrs.field(validator=_check_children)

    @property
    def dynamic(self) -> bool:
        return any(t.dynamic for t in self.triggers)

    def children(self) -> tuple[Trigger, ...]:
        return self.triggers


@attrs.frozen(repr=False)
class AllOf(_Composite):
    """True where every child is true."""

    def events(self) -> frozenset[str] | None:
        result: frozenset[str] | None = None
        for t in self.triggers:
            ev = t.events()
            if ev is not None:
                result = ev if result is None else result & ev
        return result

    def compile(self) -> Node:
        return _AllNode(self, [t.compile() for t in self.triggers])

    def __repr__(self) -> str:
        return " & ".join(_wrap(t) for t in self.triggers)


@attrs.frozen(repr=False)
class AnyOf(_Composite):
    """True where some child is true."""

    def events(self) -> frozenset[str] | None:
        result: set[str] = set()
        for t in self.triggers:
            ev = t.events()
            if ev is None:
                return None
            result |= ev
        return frozenset(result)

    def compile(self) -> Node:
        return _AnyNode(self, [t.compile() for t in self.triggers])

    def __repr__(self) -> str:
        return " | ".join(_wrap(t) for t in self.triggers)


@attrs.frozen(repr=False)
class Not(Trigger):
    """True where the child is false (at every event, not only the child's)."""

    trigger: Trigger

    @property
    def dynamic(self) -> bool:
        return self.trigger.dynamic

    def children(self) -> tuple[Trigger, ...]:
        return (self.trigger,)

    def compile(self) -> Node:
        return _NotNode(self, self.trigger.compile())

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


# -- compiled nodes ------------------------------------------------------------------


def _kleene_and(values: list[bool | None]) -> bool | None:
    if False in values:
        return False
    return None if None in values else True


def _kleene_or(values: list[bool | None]) -> bool | None:
    if True in values:
        return True
    return None if None in values else False


def _and_bound(dues: list[Due]) -> Due:
    """A bound for a conjunction: any child's bound is valid; keep the tightest single one."""
    if any(d == NEVER for d in dues):
        return NEVER
    single: dict[int, float] = {}
    multi: list[Due] = []
    for d in dues:
        finite = [i for i, v in enumerate(d) if v != math.inf]
        if d == ANY_TIME:
            continue
        if len(finite) == 1:
            i = finite[0]
            single[i] = max(single.get(i, 0.0), d[i])
        else:
            multi.append(d)
    if single:
        # Every single-counter bound must hold, so any one is valid; prefer the step counter.
        i = min(single)
        out = [math.inf] * len(COUNTERS)
        out[i] = single[i]
        return (out[0], out[1], out[2], out[3], out[4], out[5])
    return multi[0] if multi else ANY_TIME


def _state(nodes: list[Node]) -> dict[str, Any]:
    return {str(i): n.state_dict() for i, n in enumerate(nodes) if n.state_dict()}


def _load(nodes: list[Node], state: dict[str, Any]) -> None:
    for key, value in state.items():
        nodes[int(key)].load_state_dict(value)


class _AllNode:
    def __init__(self, trigger: AllOf, nodes: list[Node]) -> None:
        self.trigger = trigger
        self.nodes = nodes
        dyn = [t.dynamic for t in trigger.triggers]
        self.static = [n for n, d in zip(nodes, dyn, strict=True) if not d]
        self.dynamic = [n for n, d in zip(nodes, dyn, strict=True) if d]

    def evaluate(self, pt: Point) -> bool | None:
        values = [n.evaluate(pt) for n in self.static]
        if False in values:
            return False
        values += [n.evaluate(pt) for n in self.dynamic]
        return _kleene_and(values)

    def bound(self, event: str, last: Timestamp) -> Due:
        return _and_bound([n.bound(event, last) for n in self.nodes])

    def explain(self, pt: Point) -> Explanation:
        parts = [n.explain(pt) for n in self.static]
        if all(p.value is not False for p in parts):
            parts += [n.explain(pt) for n in self.dynamic]
        value = _kleene_and([p.value for p in parts])
        why = "all hold" if value else "some fail" if value is False else "some unknown"
        return Explanation(repr(self.trigger), value, why, tuple(parts))

    def state_dict(self) -> dict[str, Any]:
        return _state(self.nodes)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _load(self.nodes, state)


class _AnyNode:
    def __init__(self, trigger: AnyOf, nodes: list[Node]) -> None:
        self.trigger = trigger
        self.nodes = nodes

    def evaluate(self, pt: Point) -> bool | None:
        return _kleene_or([n.evaluate(pt) for n in self.nodes])

    def bound(self, event: str, last: Timestamp) -> Due:
        dues = [n.bound(event, last) for n in self.nodes]
        mins = [min(d[i] for d in dues) for i in range(len(COUNTERS))]
        return (mins[0], mins[1], mins[2], mins[3], mins[4], mins[5])

    def explain(self, pt: Point) -> Explanation:
        parts = [n.explain(pt) for n in self.nodes]
        value = _kleene_or([p.value for p in parts])
        why = "one holds" if value else "none holds" if value is False else "some unknown"
        return Explanation(repr(self.trigger), value, why, tuple(parts))

    def state_dict(self) -> dict[str, Any]:
        return _state(self.nodes)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _load(self.nodes, state)


class _NotNode:
    def __init__(self, trigger: Not, node: Node) -> None:
        self.trigger = trigger
        self.node = node

    def evaluate(self, pt: Point) -> bool | None:
        value = self.node.evaluate(pt)
        return None if value is None else not value

    def bound(self, event: str, last: Timestamp) -> Due:
        return ANY_TIME

    def explain(self, pt: Point) -> Explanation:
        inner = self.node.explain(pt)
        value = None if inner.value is None else not inner.value
        return Explanation(repr(self.trigger), value, "negation", (inner,))

    def state_dict(self) -> dict[str, Any]:
        return self.node.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.node.load_state_dict(state)
