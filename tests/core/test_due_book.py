"""``DueBook``: callbacks sharing a trigger share one heap entry, and are reached exactly
as if each had its own."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from schedtrain.schedule.dues import DueBook

INF = math.inf

_thresholds = st.one_of(st.just(INF), st.integers(0, 30).map(float))
_due = st.tuples(*[_thresholds] * 6)


@st.composite
def _shared(draw: st.DrawFn) -> list[int]:
    """Per callback, the first callback of its group (-1: alone), as the table makes it."""
    n = draw(st.integers(1, 12))
    out: list[int] = []
    for i in range(n):
        firsts = sorted({f if f >= 0 else j for j, f in enumerate(out)})
        choice = draw(st.sampled_from([-1, i, *firsts]))
        out.append(choice if choice == -1 or choice <= i else -1)
    return out


def _groups(shared: list[int]) -> list[list[int]]:
    """The callbacks that always share their vectors: each group, and each one alone."""
    groups: dict[int, list[int]] = {}
    for i, first in enumerate(shared):
        groups.setdefault(first if first >= 0 else i, []).append(i)
    return list(groups.values())


@settings(max_examples=300, deadline=None)
@given(_shared(), st.lists(st.tuples(st.booleans(), st.lists(_due, min_size=1, max_size=12),
                                     st.tuples(*[st.integers(0, 40)] * 6)),
                           min_size=1, max_size=25))
def test_a_group_shares_an_entry_and_is_reached_as_each_alone(
        shared: list[int], ops: list[tuple[bool, list[tuple[float, ...]], tuple[int, ...]]]
) -> None:
    """Random sets and reaches of whole groups: the book with groups reaches the same
    callbacks, with the same minimum, as a book where every callback has its own entry."""
    n, groups = len(shared), _groups(shared)
    grouped, alone = DueBook(n, shared), DueBook(n)
    for i in range(n):  # the table sets every listener at attach
        due = (INF,) * 6
        grouped.set([(i, due)])
        alone.set([(i, due)])
    pending: set[int] = set()
    for do_reach, dues, cur in ops:
        if do_reach:
            got = grouped.reached(cur)
            assert got == alone.reached(cur)
            pending.update(got)
        # reached callbacks are set again (with new vectors), group by group, in order
        chosen = [g for g in groups if set(g) & pending] or groups[: len(dues)]
        sets = [(i, dues[k % len(dues)]) for k, g in enumerate(chosen) for i in g]
        sets.sort()
        grouped.set(sets)
        alone.set(sets)
        pending.clear()
        assert grouped.minimum == alone.minimum


def test_a_hundred_callbacks_on_one_grid_push_one_entry() -> None:
    """The first of a group stands for it: one entry per counter, whatever its size."""
    book = DueBook(100, [0] * 100)
    book.set([(i, (10.0, INF, INF, INF, INF, INF)) for i in range(100)])
    assert [len(h) for h in book._heaps] == [1, 0, 0, 0, 0, 0]
    assert book.reached((10, 0, 0, 0, 0, 0)) == list(range(100))
