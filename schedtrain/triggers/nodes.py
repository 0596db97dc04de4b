"""Compiled nodes of ``all_of``, ``any_of`` and ``not_``: evaluation, bounds and state."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from schedtrain.time import Timestamp
from schedtrain.triggers.kleene import k_and, k_not, k_or
from schedtrain.triggers.protocol import ANY_TIME, NEVER, Due, Explanation, Node, Point

__all__ = ["AllNode", "AnyNode", "NotNode", "and_bound"]


def and_bound(dues: Sequence[Due]) -> Due:
    """A bound for a conjunction: each child's bound holds, so keep the tightest single one.

    A child bounded on one counter gives a valid bound alone; among those the step
    counter is preferred, since the loop compares it first.
    """
    best: Due | None = None
    best_index = 7
    multi: Due | None = None
    for d in dues:
        if d == NEVER:
            return NEVER
        finite = [i for i, v in enumerate(d) if v != math.inf]
        if len(finite) == 1:
            i = finite[0]
            if i < best_index or (i == best_index and best is not None and d[i] > best[i]):
                best, best_index = d, i
        elif finite and d != ANY_TIME and multi is None:
            multi = d
    if best is not None:
        return best
    return multi if multi is not None else ANY_TIME


class _Text:
    """A composite node's text, the trigger's ``repr``: worked out when an explanation
    first reads it, not when a table of thousands of callbacks is compiled."""

    _text: str | None = None
    _source: object = None

    @property
    def text(self) -> str:
        """What the node's explanations call it (its trigger's ``repr``)."""
        if self._text is None:
            self._text = self._source if isinstance(self._source, str) else repr(self._source)
        return self._text


def _state(nodes: Sequence[Node]) -> dict[str, Any]:
    return {str(i): s for i, n in enumerate(nodes) if (s := n.state_dict())}


def _load(nodes: Sequence[Node], state: dict[str, Any]) -> None:
    for key, value in state.items():
        nodes[int(key)].load_state_dict(value)


class AllNode(_Text):
    """``all_of``: clock-only children first, dynamic ones only when all of those hold."""

    def __init__(self, text: object, nodes: list[Node], dynamic: list[bool]) -> None:
        self._source = text
        self.nodes = nodes
        self.static = [n for n, d in zip(nodes, dynamic, strict=True) if not d]
        self.dynamic = [n for n, d in zip(nodes, dynamic, strict=True) if d]

    def evaluate(self, pt: Point) -> bool | None:
        values = [n.evaluate(pt) for n in self.static]
        if False in values:
            return False
        values += [n.evaluate(pt) for n in self.dynamic]
        return k_and(values)

    def bound(self, event: str, last: Timestamp) -> Due:
        return and_bound([n.bound(event, last) for n in self.nodes])

    def explain(self, pt: Point) -> Explanation:
        parts = [n.explain(pt) for n in self.static]
        if all(p.value is not False for p in parts):
            parts += [n.explain(pt) for n in self.dynamic]
        value = k_and([p.value for p in parts])
        why = "all hold" if value else "some fail" if value is False else "some unknown"
        return Explanation(self.text, value, why, tuple(parts))

    def state_dict(self) -> dict[str, Any]:
        return _state(self.nodes)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _load(self.nodes, state)


class AnyNode(_Text):
    """``any_of``: every child is evaluated, so stateful children see every point."""

    def __init__(self, text: object, nodes: list[Node]) -> None:
        self._source = text
        self.nodes = nodes

    def evaluate(self, pt: Point) -> bool | None:
        return k_or([n.evaluate(pt) for n in self.nodes])

    def bound(self, event: str, last: Timestamp) -> Due:
        dues = [n.bound(event, last) for n in self.nodes]
        m = [min(d[i] for d in dues) for i in range(6)]
        return (m[0], m[1], m[2], m[3], m[4], m[5])

    def explain(self, pt: Point) -> Explanation:
        parts = [n.explain(pt) for n in self.nodes]
        value = k_or([p.value for p in parts])
        why = "one holds" if value else "none holds" if value is False else "some unknown"
        return Explanation(self.text, value, why, tuple(parts))

    def state_dict(self) -> dict[str, Any]:
        return _state(self.nodes)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _load(self.nodes, state)


class NotNode(_Text):
    """``not_``: true where the child is false; no bound (it may be true anywhere)."""

    def __init__(self, text: object, node: Node) -> None:
        self._source = text
        self.node = node

    def evaluate(self, pt: Point) -> bool | None:
        return k_not(self.node.evaluate(pt))

    def bound(self, event: str, last: Timestamp) -> Due:
        return ANY_TIME

    def explain(self, pt: Point) -> Explanation:
        inner = self.node.explain(pt)
        return Explanation(self.text, k_not(inner.value), "negation", (inner,))

    def state_dict(self) -> dict[str, Any]:
        return self.node.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.node.load_state_dict(state)
