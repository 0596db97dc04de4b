"""The progress line's ETA counts the planned firings still to come, at their measured costs."""

from __future__ import annotations

import io
import re
import types
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import UnevenData, tiny_model

from schedtrain import Schedule, at, every, on, simulate
from schedtrain.callbacks import Callback, ProgressBar
from schedtrain.clock import LoopClock
from schedtrain.planning.costs import hms
from schedtrain.planning.eta import PlannedFirings
from schedtrain.training import Trainer

LINE = re.compile(r"epoch \d+ step \d+/\d+ \(\d+%\)  \[step (\d+)\]  eta (\d+):(\d\d):(\d\d).*")
STEP_S = 1  # each training step takes one fake second


class Fake:
    """One fake time, in nanoseconds, for the loop's clock and the firings' durations."""

    def __init__(self) -> None:
        self.ns = 0

    def advance(self, seconds: float) -> None:
        self.ns += round(seconds * 10**9)

    def seconds(self) -> float:
        return self.ns / 10**9


class Slow(Callback):
    """Takes ``cost`` fake seconds per firing."""

    def __init__(self, fake: Fake, cost: float) -> None:
        self.fake, self.cost = fake, cost

    def _trigger(self) -> None:
        self.fake.advance(self.cost)


def _run(monkeypatch: pytest.MonkeyPatch, slow: Any, cost: float,
         steps: int) -> tuple[Schedule, list[tuple[int, int]]]:
    """A run of ``steps`` steps with a callback costing ``cost`` s per firing; each
    progress line's step and ETA in seconds."""
    fake = Fake()
    monkeypatch.setattr("schedtrain.training.dispatch.time",
                        types.SimpleNamespace(time=fake.seconds, monotonic=fake.seconds))

    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        fake.advance(STEP_S)  # the step's own time
        return torch.nn.functional.mse_loss(out, y)

    schedule = Schedule({"slow": slow, "progress": every("5 steps")})
    stream = io.StringIO()
    model, opt = tiny_model()
    Trainer(model, opt, list(UnevenData([steps])), loss, schedule=schedule,
            bindings={"slow": Slow(fake, cost), "progress": ProgressBar(stream=stream)},
            max_epochs=1, clock=LoopClock(time_source=lambda: fake.ns),
            handle_signals=False).fit()
    found = [LINE.fullmatch(x) for x in stream.getvalue().splitlines()]
    return schedule, [(int(m[1]), int(m[2]) * 3600 + int(m[3]) * 60 + int(m[4]))
                      for m in found if m is not None]


def test_eta_is_the_documented_formula(monkeypatch: pytest.MonkeyPatch) -> None:
    """At step k: (steps left x the quiet step's seconds) + (the slow callback's planned
    firings after the line x its measured seconds per firing, once it has fired)."""
    steps, cost = 40, 7.0
    schedule, lines = _run(monkeypatch, every("10 steps"), cost, steps)
    planned = simulate(schedule, epochs=1, steps_per_epoch=steps).of("slow")
    assert [k for k, _ in lines] == [5, 10, 15, 20, 25, 30, 35, 40]
    for k, shown in lines:
        fired = [f for f in planned if f.step <= k]  # "slow" is declared first
        to_come = len(planned) - len(fired)
        expected = (steps - k) * STEP_S + (to_come * cost if fired else 0.0)
        assert hms(expected) == hms(shown), k


def test_a_late_expensive_firing_raises_the_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    """With costly firings still to come at steps 30 and 35, the ETA at step 20 exceeds
    a linear extrapolation of the time spent so far (which saw one such firing)."""
    steps, cost = 40, 30.0
    _, lines = _run(monkeypatch, at(["10 steps", "30 steps", "35 steps"]), cost, steps)
    shown = dict(lines)
    elapsed = 20 * STEP_S + cost  # steps 1-20 and the firing at step 10
    linear = elapsed / 20 * (steps - 20)
    assert shown[20] == (steps - 20) * STEP_S + 2 * cost
    assert shown[20] > linear


def test_no_eta_when_asked_not_to(monkeypatch: pytest.MonkeyPatch) -> None:
    """eta=False keeps the line as it was, and the store's sinks as they were."""
    stream = io.StringIO()
    model, opt = tiny_model()
    bar = ProgressBar(stream=stream, eta=False)
    t = Trainer(model, opt, list(UnevenData([10])), torch.nn.functional.mse_loss,
                schedule=Schedule({"progress": every("5 steps")}), bindings={"progress": bar},
                max_epochs=1, handle_signals=False)
    t.fit()
    assert stream.getvalue() and "eta" not in stream.getvalue()
    assert t.metrics.sinks == []


_triggers = st.sampled_from([every("1 step"), every("3 steps"), every("1 epoch"),
                             on("train_end"), on("epoch_start"), at(["4 steps", "9 steps"])])


@settings(max_examples=30, deadline=None)
@given(st.lists(_triggers, min_size=1, max_size=4), st.integers(1, 6), st.integers(1, 3))
def test_to_come_counts_the_rest_of_the_log(triggers: list[Any], length: int,
                                            epochs: int) -> None:
    """For every firing of the log, to_come counts, per callback, the firings after it."""
    schedule = Schedule({f"c{i}": t for i, t in enumerate(triggers)})
    log = list(simulate(schedule, epochs=epochs, steps_per_epoch=length))
    planned = PlannedFirings(log, epochs * length)
    for f in log:
        first = next(j for j, g in enumerate(log)
                     if (g.callback, g.event, g.step) == (f.callback, f.event, f.step))
        rest = log[first + 1:]
        got = planned.to_come(f.callback, f.event, f.step)
        assert got is not None
        assert {n: c for n, c in got.items() if c} == {
            name: n for name in schedule.names
            if (n := sum(g.callback == name for g in rest))}


def test_the_bar_shows_the_eta_too() -> None:
    """Drawn as a bar (tty_only=False), the ETA is in the bar's postfix."""
    stream = io.StringIO()
    model, opt = tiny_model()
    Trainer(model, opt, list(UnevenData([10])), torch.nn.functional.mse_loss,
            schedule=Schedule({"progress": every("5 steps")}),
            bindings={"progress": ProgressBar(stream=stream, tty_only=False)},
            max_epochs=1, handle_signals=False).fit()
    assert re.search(r"eta=\d+:\d\d:\d\d", stream.getvalue()), stream.getvalue()
