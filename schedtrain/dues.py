"""``DueBook``: per callback a due vector for one event, and their element-wise minimum.

A callback's due vector holds, per counter, the value before which its trigger cannot
be true (see ``triggers.protocol.Due``). The book answers two questions cheaply:
the minimum over all callbacks (nothing at all can fire before it), and which
callbacks' own vectors a clock position has reached. Vectors with one finite counter
(the common case: "at step 500") live in a heap per counter; the rest are scanned.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

from schedtrain.triggers.protocol import NEVER, Due

__all__ = ["DueBook"]

_INF = math.inf


class DueBook:
    """Due vectors of ``n`` callbacks at one event; all ``NEVER`` until set."""

    def __init__(self, n: int) -> None:
        self._dues: list[Due] = [NEVER] * n
        self._version = [0] * n
        # Per counter a heap of (threshold, callback, version); an entry whose version is
        # not the callback's current one has been superseded and is dropped when met.
        self._heaps: list[list[tuple[float, int, int]]] = [[] for _ in range(6)]
        self._general: set[int] = set()  # callbacks with several finite counters
        self.minimum: Due = NEVER

    def set(self, dues: Iterable[tuple[int, Due]]) -> None:
        """Replace the vectors of some callbacks, then recompute ``minimum``."""
        dues_of, version, general, heaps = self._dues, self._version, self._general, self._heaps
        for i, due in dues:
            dues_of[i] = due
            version[i] += 1
            finite = 6 - due.count(_INF)
            if finite == 1:
                general.discard(i)
                k = 0
                while due[k] == _INF:
                    k += 1
                heapq.heappush(heaps[k], (due[k], i, version[i]))
            elif finite:
                general.add(i)
            else:
                general.discard(i)
        self._refresh()

    def _refresh(self) -> None:
        version, dues = self._version, self._dues
        g = [_INF] * 6
        for k, heap in enumerate(self._heaps):
            while heap and heap[0][2] != version[heap[0][1]]:
                heapq.heappop(heap)
            if heap:
                g[k] = heap[0][0]
        for i in self._general:
            d = dues[i]
            for k in range(6):
                g[k] = min(g[k], d[k])
        self.minimum = (g[0], g[1], g[2], g[3], g[4], g[5])

    def reached(self, cur: tuple[float, ...]) -> list[int]:
        """Callbacks whose vector ``cur`` reaches (some counter at or past its threshold).

        Their heap entries are consumed: call ``set`` for each one afterwards.
        """
        version = self._version
        found: set[int] = set()
        for k, heap in enumerate(self._heaps):
            c = cur[k]
            while heap and heap[0][0] <= c:
                _, i, v = heapq.heappop(heap)
                if v == version[i]:
                    found.add(i)
        dues = self._dues
        for i in self._general:
            d = dues[i]
            if any(c >= x for c, x in zip(cur, d, strict=True)):
                found.add(i)
        return sorted(found)
