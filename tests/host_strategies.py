"""Random schedules for the host integrations, and how their firings are compared.

Each host counts some of the clock's units (Ignite and Lightning no tokens unless told,
the HF Trainer no samples): ``host_schedules(units, metric)`` draws trigger trees in those
units, with windows, lifecycle events, and conditions or ``improved`` on a metric the
host logs. Firings are compared on every counter but wall time.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence

from hypothesis import assume
from hypothesis import strategies as st

from schedtrain import Firing, Schedule, ScheduleError, ScheduleWarning, Time, Unit
from schedtrain.triggers import Trigger, all_of, any_of, at, every, improved, not_, on, when
from schedtrain.triggers import window as window_

EVENTS = ["train_start", "epoch_start", "step_end", "epoch_end", "train_end"]


def _leaves(units: Sequence[Unit], metric: str | None) -> st.SearchStrategy[Trigger]:
    periodic = st.builds(lambda u, k, off: every(k, u, offset=off or None),
                         st.sampled_from(units), st.integers(1, 9), st.integers(0, 4))
    points = st.builds(lambda u, ps: at(*(Time(p, u) for p in ps)), st.sampled_from(units),
                       st.lists(st.integers(1, 40), min_size=1, max_size=3))
    windows = st.builds(lambda u, a, n: window_(Time(a, u) if a else None, Time(a + n, u)),
                        st.sampled_from(units), st.integers(0, 20), st.integers(1, 30))
    out = [periodic, periodic, points, st.sampled_from(EVENTS).map(on), windows]
    if metric is not None:
        cmp = st.builds(lambda op, x: when(f"{metric} {op} {x}"), st.sampled_from(["<", ">"]),
                        st.sampled_from([0.5, 1.0, 2.0, 3.5]))
        # bands of 0, 1 and 1.5 against values that move by whole numbers (quarters, as
        # two ranks' means): gains inside the band, at its edge and beyond it
        best = st.sampled_from([0.0, 1.0, 1.5]).map(lambda d: improved(metric, min_delta=d))
        out += [st.builds(lambda t, c: t & c, periodic, cmp), best]
    return st.one_of(*out)


def host_triggers(units: Sequence[Unit], metric: str | None = None) -> st.SearchStrategy[Trigger]:
    """Random trigger trees over ``units`` (and conditions on ``metric``)."""
    return st.recursive(
        _leaves(units, metric),
        lambda kids: st.one_of(
            st.lists(kids, min_size=2, max_size=3).map(lambda ts: all_of(*ts)),
            st.lists(kids, min_size=2, max_size=3).map(lambda ts: any_of(*ts)),
            kids.map(not_)),
        max_leaves=4)


@st.composite
def host_schedules(draw: st.DrawFn, units: Sequence[Unit], metric: str | None = None,
                   max_callbacks: int = 3) -> Schedule:
    """A schedule of 1..``max_callbacks`` random triggers that compiles."""
    n = draw(st.integers(1, max_callbacks))
    schedule = Schedule({f"cb{i}": draw(host_triggers(units, metric)) for i in range(n)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        try:
            schedule.compile()
        except ScheduleError:
            assume(False)
    return schedule


def counters(firings: Iterable[Firing]) -> list[tuple[object, ...]]:
    """Each firing as (callback, event, step, batch, epoch, step_in_epoch, sample, token)."""
    return [(f.callback, f.event, f.timestamp.step, f.timestamp.batch, f.timestamp.epoch,
             f.timestamp.step_in_epoch, f.timestamp.sample, f.timestamp.token)
            for f in firings]
