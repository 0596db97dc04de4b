"""``assert_resumes_exactly``: a trigger saved and restored anywhere fires as if never cut.

The helper runs a simulated run straight through, then again cut at random step ends:
at each cut the run's state (the clock and every trigger's ``state_dict()``) goes
through the round trip a checkpoint gives it (plain data only, pickled and read back)
into a fresh ``Simulation`` with freshly compiled triggers, which runs on. The two
firing logs must be equal; the first difference is named.
"""

from __future__ import annotations

import pickle
import random
from collections.abc import Iterable, Mapping
from typing import Any

from schedtrain.nesting import check_plain
from schedtrain.schedule.firings import Firing
from schedtrain.schedule.schedule import Schedule
from schedtrain.simulation.simclock import RunShape
from schedtrain.simulation.simulate import SHAPE_DEFAULTS, Simulation, shape_of
from schedtrain.time import Time
from schedtrain.triggers.base import Trigger
from schedtrain.triggers.protocol import Predicate

__all__ = ["assert_resumes_exactly", "checkpoint_round_trip"]

def checkpoint_round_trip(state: Mapping[str, Any], where: str = "state") -> dict[str, Any]:
    """``state`` as a checkpoint gives it back: plain data checked (naming the key path of
    anything else), then a copy sharing nothing with the original."""
    check_plain(dict(state), where, error=AssertionError)
    copy: dict[str, Any] = pickle.loads(pickle.dumps(dict(state)))  # our own plain data
    return copy


#: Events at a step's counter that come after that step's end, so after a cut there.
_AFTER_STEP_END = frozenset({"batch_start", "batch_end", "epoch_end", "epoch_start",
                             "train_end"})


def _show(f: Firing | None) -> str:
    if f is None:
        return "no more firings"
    cond = ", conditional" if f.conditional else ""
    return f"{f.callback!r} at {f.event}, step {f.step}, epoch {f.epoch}{cond}"


def assert_resumes_exactly(
    trigger: Trigger | Schedule,
    *,
    shape: RunShape | None = None,
    points: int = 5,
    seed: int = 0,
    metrics: Any = None,
    predicates: Mapping[str, Predicate] | None = None,
    events: Mapping[str, Iterable[int]] | None = None,
    deadline: Time | str | None = None,
    **run_shape: Any,
) -> None:
    """Fail unless ``trigger`` fires the same when its state is saved and restored.

    Args:
        trigger: your trigger (or a whole ``Schedule``).
        shape: the run's ``RunShape``; or the keywords of ``simulate`` that shape a run
            (``epochs=``, ``steps_per_epoch=``, ``samples_per_batch=``...).
        points: how many random step ends to cut the run at (one resume each).
        seed: picks the cut points; the failure message names it.
        metrics, predicates, events, deadline: as for ``simulate``.

    Raises:
        AssertionError: naming the cut points and the first firing that differs, or
            the key path of state a checkpoint cannot hold.
    """
    schedule = trigger if isinstance(trigger, Schedule) else Schedule({"trigger": trigger})
    if metrics is not None and not isinstance(metrics, Mapping):
        metrics = list(metrics)  # each fresh run reads the stream from its start
    unknown = sorted(set(run_shape) - set(SHAPE_DEFAULTS))
    if unknown:
        raise TypeError(f"assert_resumes_exactly() got unexpected keywords {unknown}; the "
                        f"run is shaped by {sorted(SHAPE_DEFAULTS)} or shape=")
    if isinstance(points, bool) or not isinstance(points, int) or points < 1:
        raise ValueError(f"assert_resumes_exactly(points={points!r}): expected a whole "
                         "number >= 1 of cut points")
    run = shape_of(shape, {**SHAPE_DEFAULTS, **run_shape})

    def fresh() -> Simulation:
        return Simulation(schedule, run, metrics=metrics, predicates=predicates,
                          events=events, deadline=deadline)

    straight = list(fresh().run())
    steps = range(1, run.total_steps)
    cuts = sorted(random.Random(seed).sample(steps, min(points, len(steps))))
    resumed: list[Firing] = []
    sim = fresh()
    for cut in cuts:
        resumed.extend(sim.run(until_step=cut))
        state = checkpoint_round_trip(sim.state_dict(), f"state at step {cut}")
        sim = fresh()
        sim.load_state_dict(state)
    resumed.extend(sim.run())
    if resumed == straight:
        return
    i = next((k for k, (a, b) in enumerate(zip(straight, resumed, strict=False)) if a != b),
             min(len(straight), len(resumed)))
    first = min((f for f in (_at(straight, i), _at(resumed, i)) if f is not None),
                key=lambda f: f.step)
    before = [c for c in cuts if c < first.step
              or (c == first.step and first.event not in _AFTER_STEP_END)]
    after = f"after the resume at step {before[-1]}" if before else "before any resume"
    what = "the schedule" if isinstance(trigger, Schedule) else repr(trigger)
    raise AssertionError(
        f"{what} does not resume exactly (cut at steps {cuts}, seed={seed}): firing "
        f"#{i + 1}, {after}, differs: uninterrupted {_show(_at(straight, i))}; resumed "
        f"{_show(_at(resumed, i))}")


def _at(firings: list[Firing], i: int) -> Firing | None:
    return firings[i] if i < len(firings) else None
