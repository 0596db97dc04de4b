"""``DueBook``: per callback a due vector for one event, and their element-wise minimum.

A callback's due vector holds, per counter, the value before which its trigger cannot
be true (see ``triggers.protocol.Due``): it may be true once *any* counter reaches its
threshold. So the book keeps, per counter, a heap of ``(threshold, callback)``; a
callback is reached when one of its entries is, and the minimum over all callbacks is
the top of each heap. Every operation is logarithmic in the number of callbacks.
Callbacks sharing a trigger (the table's groups) share one entry, their first's: a
hundred callbacks on one grid cost one push and one pop per firing, not a hundred.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence

from schedtrain.triggers.protocol import NEVER, Due

__all__ = ["DueBook"]

_INF = math.inf


class DueBook:
    """Due vectors of ``n`` callbacks at one event; all ``NEVER`` until set.

    Args:
        n: the number of callbacks.
        shared: per callback, the first callback whose due vectors are always its own
            (``-1``, or itself: none before it). A callback is ``set`` with its first,
            and is reached with it.
    """

    def __init__(self, n: int, shared: Sequence[int] = ()) -> None:
        self._version = [0] * n
        #: a callback whose first stands for it: never pushed
        self._follows = [0 <= first != i for i, first in enumerate(shared)] + [False] * (
            n - len(shared))
        #: a first callback -> all the callbacks it stands for, itself included
        self._group: dict[int, list[int]] = {}
        for i, first in enumerate(shared):
            if 0 <= first != i:
                self._group.setdefault(first, [first]).append(i)
        # Per counter a heap of (threshold, callback, version); an entry whose version is
        # not the callback's current one has been superseded and is dropped when met.
        self._heaps: list[list[tuple[float, int, int]]] = [[] for _ in range(6)]
        # Superseded entries far in the future would never reach the top: past this size
        # a heap is rebuilt from current entries (amortised, so memory stays bounded).
        self._limit = 2 * n + 64
        self.minimum: Due = NEVER

    def set(self, dues: Iterable[tuple[int, Due]]) -> None:
        """Replace the vectors of some callbacks, then recompute ``minimum``."""
        version, heaps, follows = self._version, self._heaps, self._follows
        push = heapq.heappush
        last: Due | None = None
        finite: list[tuple[list[tuple[float, int, int]], float]] = []
        for i, due in dues:
            if follows[i]:
                continue
            version[i] = v = version[i] + 1
            if due is not last:  # callbacks sharing a trigger share their due vector
                last = due
                finite = [(heaps[k], d) for k, d in enumerate(due) if d != _INF]
            for heap, d in finite:
                push(heap, (d, i, v))
        g = [_INF] * 6
        for k, heap in enumerate(heaps):
            if len(heap) > self._limit:
                heap[:] = [e for e in heap if e[2] == version[e[1]]]
                heapq.heapify(heap)
            while heap and heap[0][2] != version[heap[0][1]]:
                heapq.heappop(heap)
            if heap:
                g[k] = heap[0][0]
        self.minimum = (g[0], g[1], g[2], g[3], g[4], g[5])

    def reached(self, cur: tuple[float, ...]) -> list[int]:
        """Callbacks whose vector ``cur`` reaches (some counter at or past its threshold).

        Their entries are consumed: call ``set`` for each of them afterwards.
        """
        version = self._version
        found: set[int] = set()
        pop = heapq.heappop
        for k, heap in enumerate(self._heaps):
            c = cur[k]
            while heap and heap[0][0] <= c:
                _, i, v = pop(heap)
                if v == version[i]:
                    found.add(i)
        group = self._group
        if group:
            for i in [i for i in found if i in group]:
                found.update(group[i])
        return sorted(found)
