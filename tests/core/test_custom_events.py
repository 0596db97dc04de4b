"""Custom events: fired with a payload by a callback, named by triggers, declared in TOML."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import UnevenData, tiny_model

from schedtrain import Schedule, every, on, window
from schedtrain.callbacks import Callback
from schedtrain.spec import loads_spec
from schedtrain.training import Trainer


class Emitter(Callback):
    """Fires ``found`` with the step and a note when its trigger fires."""

    def _trigger(self) -> None:
        self.fire("found", step=self.now.step, note=f"at {self.now.step}")


class Listener(Callback):
    """Records the payload of each event it runs at, and the payload after it."""

    def __init__(self, log: list[dict[str, Any]]) -> None:
        self.log = log

    def _trigger(self) -> None:
        self.log.append(dict(self.trainer.payload))


def _fit(schedule: Schedule, bindings: dict[str, Any], steps: int) -> Trainer:
    model, opt = tiny_model()
    trainer = Trainer(model, opt, UnevenData([steps]), torch.nn.functional.mse_loss,
                      schedule=schedule, bindings=bindings, max_epochs=1)
    trainer.fit()
    return trainer


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 4), st.integers(1, 10))
def test_listeners_receive_the_payload_of_each_firing(k: int, steps: int) -> None:
    """Every `fire` of the event runs its listeners with its keyword arguments; a trigger
    that names the event combines with clock parts like any other."""
    every_one: list[dict[str, Any]] = []
    after_4: list[dict[str, Any]] = []
    schedule = Schedule({"emit": every(f"{k} steps"), "all": on("found"),
                         "late": on("found") & window(start="4 steps")},
                        events=["found"])
    trainer = _fit(schedule, {"emit": Emitter(), "all": Listener(every_one),
                              "late": Listener(after_4)}, steps)
    fired = [s for s in range(1, steps + 1) if s % k == 0]
    assert every_one == [{"step": s, "note": f"at {s}"} for s in fired]
    assert after_4 == [p for p in every_one if p["step"] >= 4]
    assert [f.step for f in trainer.firings if f.callback == "all"] == fired
    assert {f.event for f in trainer.firings if f.callback != "emit"} <= {"found"}


def test_payload_is_empty_outside_the_event() -> None:
    """At built-in events the payload is empty; after a nested fire the outer one is back."""
    seen: list[dict[str, Any]] = []

    class Both(Callback):
        def _trigger(self) -> None:
            seen.append(dict(self.trainer.payload))
            if not self.trainer.payload:
                self.fire("found", step=0)
                seen.append(dict(self.trainer.payload))

    _fit(Schedule({"both": every("1 step") | on("found")}, events=["found"]),
         {"both": Both()}, 1)
    assert seen == [{}, {"step": 0}, {}]


def test_an_undeclared_event_is_refused_by_name() -> None:
    """Firing an event the schedule does not declare names it and the declared ones."""
    with pytest.raises(ValueError, match="event 'found' is not declared on the schedule"):
        _fit(Schedule({"emit": every("1 step")}), {"emit": Emitter()}, 2)


def test_toml_declares_events_that_triggers_name() -> None:
    """`events = [...]` in a spec declares them; `on = "found"` listens."""
    spec = loads_spec('events = ["found"]\n'
                      '[callbacks.emit]\ntrigger = { every = "2 steps" }\n'
                      '[callbacks.listen]\ntrigger = { on = "found" }\n')
    log: list[dict[str, Any]] = []
    _fit(spec.schedule(), {"emit": Emitter(), "listen": Listener(log)}, 5)
    assert [p["step"] for p in log] == [2, 4]
