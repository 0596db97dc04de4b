"""A loop you wrote: ``CallbackDriver`` runs schedtrain ``Callback`` objects where
``simulate()`` says, with the model and optimizer you pass, and its ``state_dict`` carries
the callbacks' state so a resumed loop continues exactly."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
import torch
from host_strategies import host_schedules
from hosted_helpers import Recorder, fired, recorded, simulated_fired
from hypothesis import given, settings
from hypothesis import strategies as st

from schedtrain import Schedule, Scheduled, ScheduleWarning, Unit, every, simulate
from schedtrain.callbacks import Callback, EnableCallbackIf, ModelSaver
from schedtrain.integrations import ScheduleDriver
from schedtrain.integrations.context import HostError
from schedtrain.integrations.hosted import CallbackDriver

UNITS = [Unit.STEP, Unit.BATCH, Unit.EPOCH, Unit.SAMPLE, Unit.TOKEN]


def driver(schedule: Schedule, **kw: Any) -> CallbackDriver:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        return CallbackDriver(schedule, **kw)


def run(d: CallbackDriver, epochs: int, steps: int, accum: int, *, start: int = 0,
        stop_after: int | None = None) -> dict[str, Any] | None:
    """The loop: ``accum`` micro-batches of 2 samples and 6 tokens per step; returns the
    driver's state after optimizer step ``stop_after`` (and stops there)."""
    done = 0
    d.train_start()
    for epoch in range(epochs):
        if (epoch + 1) * steps < start:  # ended before the state was saved
            done += steps
            continue
        d.epoch_start()
        for _ in range(steps):
            done += 1
            if done <= start:
                continue
            for _ in range(accum):
                d.batch_end(samples=2, tokens=6)
            d.step_end()
            if done == stop_after:
                return json.loads(json.dumps(d.state_dict()))
        d.epoch_end()
    d.train_end()
    return None


shapes = st.tuples(st.integers(1, 3), st.integers(1, 5), st.integers(1, 3))


class TestCallbacksFireAsSimulated:
    """A user's ``Callback`` subclass runs where ``simulate()`` says."""

    @settings(max_examples=40, deadline=None)
    @given(schedule=host_schedules(UNITS), shape=shapes)
    def test_trigger_and_epoch_hooks(self, schedule: Schedule,
                                     shape: tuple[int, int, int]) -> None:
        """Steps, micro-batches, epochs, samples and tokens: as simulated; the epoch hooks
        once per epoch with tensorpack's 1-based ``epoch_num``."""
        epochs, steps, accum = shape
        bound, recorders = recorded(schedule)
        run(driver(bound), epochs, steps, accum)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ScheduleWarning)
            log = simulate(schedule, epochs=epochs, steps_per_epoch=steps,
                           batches_per_step=accum, samples_per_batch=2, tokens_per_batch=6)
        assert fired(recorders) == simulated_fired(log)
        for r in recorders.values():
            assert r.epochs == [(w, e) for e in range(1, epochs + 1)
                                for w in ("before", "after")]

    @settings(max_examples=40, deadline=None)
    @given(schedule=host_schedules(UNITS), shape=shapes, data=st.data())
    def test_resume_keeps_the_callbacks_state(self, schedule: Schedule,
                                              shape: tuple[int, int, int],
                                              data: st.DataObject) -> None:
        """Stopped after any step, its state through JSON into a new driver with new
        callbacks: the firings and the callbacks' counts continue exactly."""
        epochs, steps, accum = shape
        whole, whole_rec = recorded(schedule)
        run(driver(whole), epochs, steps, accum)
        cut = data.draw(st.integers(1, epochs * steps), label="stopped after step")
        first, first_rec = recorded(schedule)
        state = run(driver(first), epochs, steps, accum, stop_after=cut)
        assert state is not None
        second, second_rec = recorded(schedule)
        d = driver(second)
        d.load_state_dict(state)
        run(d, epochs, steps, accum, start=cut)
        assert sorted(fired(first_rec) + fired(second_rec)) == sorted(fired(whole_rec))
        assert ({n: r.count for n, r in second_rec.items()}
                == {n: r.count for n, r in whole_rec.items()})


class TestHooksAndGates:
    """The hooks a loop can call run in schedtrain's order, behind their gates."""

    def test_gate_holds_hooks_and_trigger(self) -> None:
        """``EnableCallbackIf`` runs the callback's trigger and epoch hooks only while its
        predicate holds (from epoch 2 on)."""
        rec = Recorder()
        schedule = Schedule([EnableCallbackIf(Scheduled(every("2 steps"), rec, "r"),
                                              lambda cb: cb.epoch_num >= 2)])
        run(driver(schedule), 3, 4, 1)
        assert [f[1] for f in rec.fired] == [6, 8, 10, 12]
        assert rec.epochs == [("before", 2), ("after", 2), ("before", 3), ("after", 3)]

    def test_trigger_step_setup_and_after_train(self) -> None:
        """``_setup`` once, ``_trigger_step`` after every step, ``_after_train`` with the
        outcome; the model and optimizer are the ones passed."""
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        calls: list[Any] = []

        class Hooks(Callback):
            def _setup(self) -> None:
                calls.append(("setup", self.model is model, self.optimizer is opt))

            def _trigger_step(self) -> None:
                calls.append(("step", self.global_step))

            def _after_train(self) -> None:
                calls.append(("after_train", self.trainer.outcome))

        run(driver(Schedule({"h": every("1 epoch")}), callbacks={"h": Hooks()}, model=model,
                   optimizer=opt), 1, 2, 1)
        assert calls == [("setup", True, True), ("step", 1), ("step", 2),
                         ("after_train", "finished")]


class TestRefused:
    """What a loop cannot give is refused, in one line naming the callback."""

    def test_saver(self) -> None:
        """A schedtrain saver needs schedtrain's checkpoints."""
        with pytest.raises(HostError, match=r"callback 'save' \(ModelSaver\) writes "
                                            "schedtrain checkpoints"):
            CallbackDriver(Schedule({"save": every("2 steps")}), {"save": ModelSaver()})

    def test_model_not_given(self) -> None:
        """A callback that reads the model when none was passed is told where to pass it."""

        class Peek(Callback):
            def _trigger(self) -> None:
                self.model.zero_grad()

        d = CallbackDriver(Schedule({"p": every("1 step")}), {"p": Peek()})
        d.train_start()
        d.epoch_start()
        with pytest.raises(HostError, match=r"pass model=\.\.\."):
            d.step()

    def test_failure_names_the_callback(self) -> None:
        """An exception from a callback says which callback raised it, at which event,
        step and epoch (a note on the traceback)."""

        class Broken(Callback):
            def _trigger(self) -> None:
                raise ZeroDivisionError("bad")

        d = CallbackDriver(Schedule({"b": every("2 steps")}), {"b": Broken()})
        d.train_start()
        d.epoch_start()
        d.step()
        with pytest.raises(ZeroDivisionError) as info:
            d.step()
        assert info.value.__notes__ == [
            "schedtrain: raised in callback 'b' at step_end (step 2, epoch 0) inside your loop"]

    def test_plain_driver_names_callback_driver(self) -> None:
        """Given a ``Callback`` as an action, ``ScheduleDriver`` says which driver runs it."""
        with pytest.raises(TypeError, match="CallbackDriver"):
            ScheduleDriver(Schedule({"r": every("1 step")}), actions={"r": Recorder()})


class TestBeforeFirings:
    """``_before_firings`` runs once per event where anything fires, before the first."""

    def test_before_the_first_firing_of_an_event(self) -> None:
        """A function action declared first still comes after ``before_firings``, which
        runs once at each event where anything fired, not at quiet ones."""
        calls: list[tuple[str, int]] = []

        class Watch(Callback):
            def _before_firings(self) -> None:
                calls.append(("before_firings", self.global_step))

            def _trigger(self) -> None:
                calls.append(("watch", self.global_step))

        d = CallbackDriver(Schedule({"f": every("2 steps"), "w": every("3 steps")}),
                           {"w": Watch()}, actions={"f": lambda: calls.append(("f", 0))})
        d.train_start()
        d.epoch_start()
        for _ in range(4):
            d.step()
        assert calls == [("before_firings", 2), ("f", 0), ("before_firings", 3),
                         ("watch", 3), ("before_firings", 4), ("f", 0)]
