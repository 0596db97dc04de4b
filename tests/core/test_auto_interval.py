"""``every("auto")``: Young/Daly's interval, its bounds, and a resume that keeps its firings."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedtrain import Schedule
from schedtrain.errors import ArgumentError
from schedtrain.simulation import simulate
from schedtrain.time import Timestamp
from schedtrain.triggers import AutoEvery, Point, auto_every
from schedtrain.triggers.auto import MAX_INTERVAL, Decider, auto_interval, young_daly_seconds

_cost = st.floats(1e-3, 1e3)
_mtbf = st.floats(1.0, 1e6)
_step = st.floats(1e-3, 1e2)


@given(_cost, _mtbf, _step)
def test_interval_is_young_daly_in_steps(cost: float, mtbf: float, step_s: float) -> None:
    """Without a bound: the whole number of steps nearest sqrt(2 C MTBF), at least 1 and
    at most ``MAX_INTERVAL`` (the longest a checkpoint's state may hold)."""
    steps = auto_interval(cost, mtbf, step_s)
    ideal = math.sqrt(2 * cost * mtbf) / step_s
    assert isinstance(steps, int) and 1 <= steps <= MAX_INTERVAL
    assert steps in (1, MAX_INTERVAL) or abs(steps - ideal) <= 0.5 + 1e-9
    assert steps == min(MAX_INTERVAL, max(1, round(ideal)))


@given(_cost, _mtbf, _step, st.floats(1e-4, 1.0))
def test_overhead_bound_raises_the_interval_to_keep_it(cost: float, mtbf: float,
                                                       step_s: float, share: float) -> None:
    """With ``max_overhead``: never below Young/Daly's, and the smallest interval at or
    above it whose overhead C / (steps * step_s) keeps to the bound."""
    free = auto_interval(cost, mtbf, step_s)
    steps = auto_interval(cost, mtbf, step_s, share)
    assert steps >= free
    assert steps == MAX_INTERVAL or cost / (steps * step_s) <= share * (1 + 1e-9)
    if steps > free:  # raised: one step fewer would break the bound
        assert cost / ((steps - 1) * step_s) > share * (1 - 1e-9)


@given(_cost, _cost, _mtbf, _step)
def test_a_dearer_save_never_shortens_the_interval(a: float, b: float, mtbf: float,
                                                   step_s: float) -> None:
    lo, hi = sorted((a, b))
    assert auto_interval(lo, mtbf, step_s) <= auto_interval(hi, mtbf, step_s)
    assert auto_interval(lo, mtbf, step_s, 0.01) <= auto_interval(hi, mtbf, step_s, 0.01)


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, True, "1"])
def test_bad_inputs_are_refused_by_name(bad: object) -> None:
    with pytest.raises(ArgumentError, match="`mtbf_s` must be a finite number > 0"):
        young_daly_seconds(1.0, bad)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="`step_s`"):
        auto_interval(1.0, 10.0, bad)  # type: ignore[arg-type]


def _point(step: int) -> Point:
    return Point("step_end", Timestamp(step=step), Timestamp(step=step - 1))


def _cost_of(seed: int, k: int) -> tuple[float, float]:
    """A save's measured cost and step time, as a function of the save (deterministic)."""
    return 0.2 + ((seed * 7 + k * 13) % 11) / 5, 0.05 + ((seed + k) % 3) / 50


def _run(first: int, seed: int, steps: range, node: object = None) -> tuple[list[int], dict]:
    """Drive an auto trigger over ``steps``; each firing's save lands at once and its
    measurement decides. Returns the firings and the state a checkpoint of each took
    (captured after the firing, before its landing decided: as the loop writes it)."""
    trig = AutoEvery(first)
    trig.decider.configure(20.0, 0.05)
    n = node if node is not None else trig.compile()
    fired, saved = [], {}
    for step in steps:
        if n.evaluate(_point(step)):  # type: ignore[attr-defined]
            fired.append(step)
            saved[step] = json.loads(json.dumps(n.state_dict()))  # type: ignore[attr-defined]
            cost, step_s = _cost_of(seed, n.decider.measured[0])  # type: ignore[attr-defined]
            n.decider.decide(step, cost, step_s)  # type: ignore[attr-defined]
    return fired, saved


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 30), st.integers(0, 50), st.integers(1, 400))
def test_resume_from_the_last_checkpoint_fires_as_the_uninterrupted_run(
        first: int, seed: int, kill: int) -> None:
    """Killed at any step and resumed from the newest checkpoint before it, with the
    decision that checkpoint's own save made replayed (from the log): the same firings."""
    whole, saved = _run(first, seed, range(1, 401))
    before = [s for s in saved if s <= kill]
    trig = AutoEvery(first)
    trig.decider.configure(20.0, 0.05)
    node = trig.compile()
    start = 1
    if before:
        at = before[-1]
        node.load_state_dict(saved[at])
        k = node.decider.measured[0]
        node.decider.decide(at, *_cost_of(seed, k))  # replayed from the log
        start = at + 1
    rest, _ = _run(first, seed, range(start, 401), node)
    assert [s for s in whole if s < start] + rest == whole


def test_the_decided_interval_places_the_next_firing() -> None:
    """First at ``first``; after each save the interval its decision says."""
    trig = auto_every(5)
    trig.decider.configure(50.0)
    node = trig.compile()
    fired = []
    for step in range(1, 200):
        if node.evaluate(_point(step)):
            fired.append(step)
            node.decider.decide(step, 1.0, 1.0)  # sqrt(2 * 1 * 50) = 10 steps
    assert fired[:4] == [5, 10, 20, 30]  # the second placed before the first decision


def test_simulate_uses_the_declared_interval() -> None:
    """Before any save is measured (``simulate``, ``plan``): the interval a declared cost
    gives, after the first save at ``first``."""
    trig = auto_every(3)
    trig.decider.configure(200.0)
    assert trig.decider.declare(1.0, 2.0) == 10  # sqrt(400) = 20 s = 10 steps
    log = simulate(Schedule({"save": trig}), epochs=1, steps_per_epoch=40)
    assert [f.step for f in log] == [3, 13, 23, 33]


def test_decider_state_round_trips() -> None:
    d = Decider()
    d.configure(100.0, 0.1)
    d.decide(4, 2.0, 0.5)
    e = Decider()
    e.load_state_dict(json.loads(json.dumps(d.state_dict())))
    assert (e.interval, e.measured, e.decisions) == (d.interval, d.measured, d.decisions)
