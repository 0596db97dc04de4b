"""Pairing two sorted lists of places by nearness: which removed firing an added one
moved from (``schedtrain diff``'s ``moved`` lines)."""

from __future__ import annotations

from typing import Final

__all__ = ["nearest_pairs"]

Place = tuple[int, int, int]

#: Beyond this many cells (fewer side x the larger side's spare), pairs go in order: the
#: least-distance pairing costs that many steps of Python.
_NEAREST_CELLS: Final = 2_000_000


def nearest_pairs(a: list[Place], b: list[Place]) -> list[tuple[int, int]]:
    """Index pairs ``(i, j)`` matching every place of the shorter of ``a`` and ``b`` (each
    in time order) to one of the other, in order (no crossing), with the least total
    distance: in steps, then batches, then epochs; among equals the earlier partner.
    Dynamic programming over the band of feasible partners, as in sequence alignment."""
    swap = len(a) > len(b)
    xs, ys = (b, a) if swap else (a, b)
    k, spare = len(xs), len(ys) - len(xs)
    if k == 0:
        return []
    if k * (spare + 1) > _NEAREST_CELLS:
        pairs = [(i, i) for i in range(k)]
    else:
        def dist(x: Place, y: Place) -> Place:
            return (abs(x[0] - y[0]), abs(x[1] - y[1]), abs(x[2] - y[2]))

        def add(u: Place, v: Place) -> Place:
            return (u[0] + v[0], u[1] + v[1], u[2] + v[2])

        # cost[i][s]: xs[:i] matched within ys[:i + s] (s of those left out), least total
        cost = [[(0, 0, 0)] * (spare + 1)]
        for i in range(1, k + 1):
            row: list[Place] = []
            for s in range(spare + 1):
                take = add(cost[i - 1][s], dist(xs[i - 1], ys[i - 1 + s]))
                row.append(min(take, row[s - 1]) if s else take)
            cost.append(row)
        pairs, s = [], spare
        for i in range(k, 0, -1):  # back from the end; a tie leaves ys[i - 1 + s] out
            while s and cost[i][s] == cost[i][s - 1]:
                s -= 1
            pairs.append((i - 1, i - 1 + s))
        pairs.reverse()
    return [(j, i) for i, j in pairs] if swap else pairs
