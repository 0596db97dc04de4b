"""Actions that declare a parameter ``event`` are told which event fired them: in your own
loop (``ScheduleDriver``) each call's event and clock are simulate()'s firing's."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from host_strategies import host_schedules
from hypothesis import given, settings
from hypothesis import strategies as st

from schedtrain import Schedule, ScheduleWarning, Unit, simulate
from schedtrain.integrations import ScheduleDriver
from schedtrain.integrations.driver import takes_event

UNITS = [Unit.STEP, Unit.BATCH, Unit.EPOCH]


def run(schedule: Schedule, epochs: int, steps: int, accum: int) -> list[tuple[Any, ...]]:
    told: list[tuple[Any, ...]] = []
    driver: ScheduleDriver

    def action(name: str) -> Any:
        return lambda event: told.append((name, event, driver.now.step, driver.now.epoch))

    driver = ScheduleDriver(schedule, actions={n: action(n) for n in schedule.names})
    driver.train_start()
    for _ in range(epochs):
        driver.epoch_start()
        for _ in range(steps):
            for _ in range(accum):
                driver.batch_end()
            driver.step_end()
        driver.epoch_end()
    driver.train_end()
    return told


@settings(max_examples=60, deadline=None)
@given(schedule=host_schedules(UNITS), epochs=st.integers(1, 3), steps=st.integers(1, 4),
       accum=st.integers(1, 3))
def test_each_action_is_told_its_event(schedule: Schedule, epochs: int, steps: int,
                                       accum: int) -> None:
    """Over random schedules (batch-, step- and epoch-unit, lifecycle events) and shapes:
    the (callback, event, step, epoch) each action is told are simulate()'s firings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        log = simulate(schedule, epochs=epochs, steps_per_epoch=steps, batches_per_step=accum)
    want = [(f.callback, f.event, f.step, f.timestamp.epoch) for f in log]
    assert run(schedule, epochs, steps, accum) == want


def test_only_a_declared_event_is_passed() -> None:
    """A function without ``event`` (or taking it only by ``**kwargs``) is called as before."""
    def plain() -> None: ...
    def keyword(*, event: str) -> None: ...
    def extra(**kwargs: Any) -> None: ...
    assert [takes_event(f) for f in (plain, keyword, extra, print)] == [False, True, False,
                                                                        False]


class TestHostKeepInSpec:
    """A callback without type may say which of a host verb's checkpoints to keep: checked
    like a saver's ``keep``, and ``plan`` lists the saves it leaves, as planned_files."""

    def test_plan_lists_a_host_verbs_files(self, tmp_path: Any) -> None:
        from schedtrain.planning.plan import plan_spec
        from schedtrain.retention import parse_keep
        from schedtrain.simulation.files import SaverFiles, planned_files
        from schedtrain.spec import load_spec

        keep = '{ any = [{ latest = 2 }, { every = "6 steps" }] }'
        path = tmp_path / "host.toml"
        path.write_text('[clock]\nepochs = 3\nsteps_per_epoch = 4\n[callbacks.save]\n'
                        f'trigger = {{ every = "2 steps" }}\nkeep = {keep}\n')
        spec = load_spec(path)
        plan = plan_spec(spec)
        policy = parse_keep({"any": [{"latest": 2}, {"every": "6 steps"}]})
        want = planned_files(simulate(spec.schedule(), epochs=3, steps_per_epoch=4),
                             {"save": SaverFiles("host", policy)})
        assert [p.files for p in plan.files] == [p.files for p in want]
        assert plan.files[-1].files == ("save-step=6", "save-step=10", "save-step=12")

    def test_a_bad_keep_is_named(self, tmp_path: Any) -> None:
        from schedtrain.errors import SpecError
        from schedtrain.spec import load_spec

        path = tmp_path / "host.toml"
        path.write_text('[callbacks.save]\ntrigger = { every = "2 steps" }\n'
                        "keep = { latest = 0 }\n")
        with pytest.raises(SpecError, match=r"callbacks\.save\.keep\.latest: expected a "
                                            r"whole number >= 1"):
            load_spec(path)
