"""``schedtrain diff``'s ``moved`` firings: a removed and an added firing of one callback
at one event are paired by nearness, never across each other, with the least total
distance, and every firing is accounted for exactly once."""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from schedtrain import Schedule, Timestamp, every, simulate
from schedtrain.planning.changes import FiringChange, diff_texts, firing_changes
from schedtrain.planning.nearest import nearest_pairs
from schedtrain.schedule.firings import Firing
from schedtrain.simulation import RunShape


def _firing(name: str, event: str, step: int) -> Firing:
    return Firing(name, event, Timestamp(step=step, batch=2 * step, epoch=step // 10))


_ROWS = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["step_end",
                                                                         "epoch_end"]),
                           st.integers(0, 40)), max_size=9)


def _log(rows: list[tuple[str, str, int]]) -> list[Firing]:
    return [_firing(*row) for row in sorted(rows, key=lambda r: r[2])]


def _moved(changes: tuple[FiringChange, ...], name: str, event: str) -> list[tuple[int, int]]:
    out = []
    for c in changes:
        if c.kind == "moved" and c.callback == name and c.old and c.old.event == event:
            assert c.new is not None
            out.append((c.old.step, c.new.step))
    return out


def test_every_20_steps_to_every_30_pairs_each_with_its_neighbour() -> None:
    """The report's example: each new firing moved from the old one 10 steps before it
    (not 280 -> 330 beside a removed 300); the others removed."""
    old = simulate(Schedule({"v": every("20 steps")}), epochs=1, steps_per_epoch=400)
    new = simulate(Schedule({"v": every("30 steps")}), epochs=1, steps_per_epoch=400)
    changes = firing_changes(old, new)
    assert _moved(changes, "v", "step_end") == [(20, 30), (80, 90), (140, 150), (200, 210),
                                                (260, 270), (320, 330), (380, 390)]
    assert [c.old.step for c in changes if c.kind == "removed" and c.old] == [
        40, 100, 160, 220, 280, 340, 400]
    assert not [c for c in changes if c.kind == "added"]


def test_the_table_reads_the_nearest_moves() -> None:
    """``schedtrain diff``'s table shows the nearest pairs first."""
    old = '[callbacks.v]\ntrigger = { every = "20 steps" }\n'
    shape = RunShape.build(epochs=1, steps_per_epoch=400)
    table = diff_texts(old, old.replace("20 steps", "30 steps"), shape=shape).table()
    assert "moved   step_end step 20 (epoch 0) -> step_end step 30 (epoch 0)" in table
    assert "removed step_end step 40 (epoch 0)" in table


@settings(max_examples=300, deadline=None)
@given(_ROWS, _ROWS)
def test_moves_are_nearest_uncrossed_and_account_for_every_firing(
        old_rows: list[tuple[str, str, int]], new_rows: list[tuple[str, str, int]]) -> None:
    """Per callback and event: as many moves as the fewer side has; no two moves cross;
    their total distance in steps is the least of any pairing (brute force); and old's
    firings are each common, removed or moved from exactly once, new's each common,
    added or moved to exactly once."""
    old, new = _log(old_rows), _log(new_rows)
    changes = firing_changes(old, new)
    common = Counter(old) & Counter(new)
    assert Counter(c.old for c in changes if c.old) + common == Counter(old)
    assert Counter(c.new for c in changes if c.new) + common == Counter(new)
    for c in changes:
        assert (c.kind == "moved") == (c.old is not None and c.new is not None)
        for f in (c.old, c.new):
            assert f is None or f.callback == c.callback
    for name, event in itertools.product("ab", ("step_end", "epoch_end")):
        gone = sorted((Counter(f for f in old if (f.callback, f.event) == (name, event))
                       - common).elements(), key=lambda f: f.step)
        came = sorted((Counter(f for f in new if (f.callback, f.event) == (name, event))
                       - common).elements(), key=lambda f: f.step)
        moved = _moved(changes, name, event)
        assert len(moved) == min(len(gone), len(came))
        by_old = sorted(moved)
        assert [n for _, n in by_old] == sorted(n for _, n in by_old), "moves cross"
        few, many = sorted(([f.step for f in gone], [f.step for f in came]), key=len)
        least = min((sum(abs(x - y) for x, y in zip(few, pick, strict=True))
                     for pick in itertools.permutations(many, len(few))), default=0)
        assert sum(abs(o - n) for o, n in moved) == least


@given(st.lists(st.integers(0, 50), max_size=7), st.lists(st.integers(0, 50), max_size=7))
def test_nearest_pairs_prefers_the_earlier_partner_on_a_tie(a: list[int], b: list[int]) -> None:
    """Pairs are index pairs in order; of two partners at the same distance, the earlier."""
    xs, ys = [(v, 0, 0) for v in sorted(a)], [(v, 0, 0) for v in sorted(b)]
    pairs = nearest_pairs(xs, ys)
    assert [i for i, _ in pairs] == sorted({i for i, _ in pairs})
    assert [j for _, j in pairs] == sorted({j for _, j in pairs})
    assert nearest_pairs([(30, 0, 0)], [(20, 0, 0), (40, 0, 0)]) == [(0, 0)]
    assert nearest_pairs([(20, 0, 0), (40, 0, 0)], [(30, 0, 0)]) == [(0, 0)]
