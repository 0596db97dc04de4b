"""Remembered answers for composites' ``first_possible``, within a budget.

``any`` and ``all`` ask each child, and an ``all`` asks again at each value its climb
reaches, so the plain recursion is exponential in the depth of alternating ``any``/
``all``. A question (or a ``first_possible_memo`` scope, such as one ``check``) remembers
each node's answers and stops asking past ``SEARCH_BUDGET`` child answers.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Final

__all__ = ["SEARCH_BUDGET", "Search", "first_possible_memo", "remembered"]

#: How many child answers composites' ``first_possible`` may ask for in one question or
#: ``first_possible_memo`` scope (``check`` adds 100 per trigger node it checks); past it
#: a composite claims nothing, which is always safe, so the static checks end in bounded
#: time.
SEARCH_BUDGET: Final = 40_000


class Search:
    """Remembered answers of composites' ``first_possible`` while a question (or a
    ``first_possible_memo`` scope) lasts.

    An exact answer ``r`` to ``value`` is remembered as the span ``[value, r]``: nothing
    in between can be true, so every value in it has the answer ``r``; an answer that
    gave up climbing is remembered for its own value only. Without this an ``all`` asks
    its children again at each value it climbs to, and alternating ``any``/``all`` cost
    grows exponentially with depth. Answers are the plain recursion's unless the budget
    runs out (what that cuts short is not remembered). Entries hold the node, so no ``id`` is reused
    while the scope lives.
    """

    __slots__ = ("asked", "budget", "gave_up", "over", "points", "spans")

    def __init__(self, budget: int = SEARCH_BUDGET) -> None:
        self.budget = budget
        #: (node id, counter) -> (node, sorted span starts, start -> end)
        self.spans: dict[tuple[int, str], tuple[object, list[float], dict[float, float]]] = {}
        self.points: dict[tuple[int, str, float], tuple[object, float]] = {}
        self.asked = 0  # child answers asked for in this scope
        self.gave_up = 0  # climbs stopped by the round limit
        self.over = 0  # answers cut short by the budget

    def charge(self, calls: int) -> bool:
        """Count ``calls`` child answers; ``False`` once the scope's budget is spent."""
        self.asked += calls
        if self.asked > self.budget:
            self.over += 1
            return False
        return True


_SEARCH: ContextVar[Search | None] = ContextVar("schedtrain_first_possible", default=None)


@contextmanager
def first_possible_memo(budget: int = SEARCH_BUDGET) -> Iterator[None]:
    """Share remembered ``first_possible`` answers across the questions asked inside
    (the triggers must not change meanwhile: they are immutable values)."""
    if _SEARCH.get() is not None:
        yield
        return
    token = _SEARCH.set(Search(budget))
    try:
        yield
    finally:
        _SEARCH.reset(token)


def remembered(node: object, counter: str, value: float,
                compute: Callable[[Search, str, float], float]) -> float:
    """``compute(search, counter, value)`` for ``node``, remembered (see ``Search``)."""
    search = _SEARCH.get()
    if search is None:
        with first_possible_memo():
            return remembered(node, counter, value, compute)
    entry = search.spans.get((id(node), counter))
    if entry is not None:
        _, starts, ends = entry
        i = bisect.bisect_right(starts, value) - 1
        if i >= 0 and value <= ends[starts[i]]:
            return ends[starts[i]]
    point = search.points.get((id(node), counter, value))
    if point is not None:
        return point[1]
    gave_up, over = search.gave_up, search.over
    answer = compute(search, counter, value)
    if search.over != over:
        return answer
    if search.gave_up != gave_up:
        search.points[(id(node), counter, value)] = (node, answer)
        return answer
    if entry is None:
        entry = search.spans.setdefault((id(node), counter), (node, [], {}))
    bisect.insort(entry[1], value)
    entry[2][value] = answer
    return answer
