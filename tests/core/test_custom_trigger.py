"""A user's own trigger goes through the same protocol as the built-ins, everywhere."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedtrain import Schedule, Time, Timestamp, simulate
from schedtrain.events import EventSet
from schedtrain.triggers import NEVER, Due, Point, Trigger, due_on, every

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from examples.custom_trigger import (  # noqa: E402 - the repository root is on sys.path now
    in_plan,
    in_simulation,
    in_training,
)


class TestExample:
    """``examples/custom_trigger.py``: simulate(), plan --import and a Trainer agree."""

    def test_all_three_agree(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The log-spaced trigger fires at 1, 2, 4, ..., 64 in all three."""
        monkeypatch.chdir(ROOT)
        assert in_simulation() == in_plan() == in_training() == [1, 2, 4, 8, 16, 32, 64]

    def test_the_script_runs(self) -> None:
        """``python -m examples.custom_trigger`` runs and says they agree."""
        result = subprocess.run([sys.executable, "-m", "examples.custom_trigger"], cwd=ROOT,
                                capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr
        assert "all three agree" in result.stdout

    def test_plan_without_import_refuses(self) -> None:
        """Planning it needs --import (which runs the module): exit 2 and how to fix it."""
        result = subprocess.run([sys.executable, "-m", "schedtrain", "plan",
                                 "specs/custom_trigger.toml"], cwd=ROOT, capture_output=True,
                                text=True, check=False)
        assert result.returncode == 2
        assert "plan it with --import" in result.stderr


@attrs.frozen
class EveryCrossing(Trigger):
    """``every`` re-implemented through the public protocol only, for any counter."""

    period: Time

    def events(self) -> EventSet:
        return EventSet.of(self.period.unit.event)

    def _next(self, value: int) -> int:
        return (value // self.period.base + 1) * self.period.base

    def bound(self, event: str, last: Timestamp) -> Due:
        if event != self.period.unit.event:
            return NEVER
        return due_on(self.period.counter, self._next(last.get(self.period.counter)))

    def evaluate(self, pt: Point) -> bool:
        c = self.period.counter
        return pt.event == self.period.unit.event and self._next(pt.prev.get(c)) <= pt.now.get(c)


@attrs.frozen
class Countdown(Trigger):
    """A stateful trigger: fires at the first ``n`` step ends, then never again."""

    n: int

    def events(self) -> EventSet:
        return EventSet.of("step_end")

    def compile(self) -> Any:
        return _CountdownNode(self.n)


class _CountdownNode:
    def __init__(self, n: int) -> None:
        self.left = n

    def evaluate(self, pt: Point) -> bool:
        if pt.event != "step_end" or self.left <= 0:
            return False
        self.left -= 1
        return True

    def bound(self, event: str, last: Timestamp) -> Due:
        return due_on("step", last.step + 1) if self.left > 0 and event == "step_end" else NEVER

    def explain(self, pt: Point) -> Any:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {"left": self.left}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.left = state["left"]


class TestProtocol:
    """Built-in and user triggers go through one protocol."""

    @settings(deadline=None)
    @given(st.sampled_from(["step", "batch", "epoch", "sample", "token"]), st.integers(1, 9),
           st.lists(st.integers(1, 7), min_size=1, max_size=4), st.integers(1, 3))
    def test_a_user_every_fires_as_the_built_in(self, unit: str, k: int, lengths: list[int],
                                                 accum: int) -> None:
        """The same rule written by a user fires exactly where the built-in does."""
        t = Time(k, unit)
        shape = {"epoch_lengths": lengths, "batches_per_step": accum, "samples_per_batch": 2,
                 "tokens_per_batch": 5}
        mine = simulate(Schedule({"x": EveryCrossing(t)}), **shape)
        theirs = simulate(Schedule({"x": every(t)}), **shape)
        assert [(f.event, f.timestamp) for f in mine] == [(f.event, f.timestamp)
                                                          for f in theirs]

    def test_composes_and_keeps_state_across_resume(self) -> None:
        """A stateful user trigger composes with built-ins and resumes from its state."""
        from schedtrain.simulation import RunShape, Simulation

        schedule = Schedule({"x": Countdown(3) | every("5 steps")})
        whole = Simulation(schedule, RunShape.build(epochs=1, steps_per_epoch=12)).run()
        first = Simulation(schedule, RunShape.build(epochs=1, steps_per_epoch=12))
        head = first.run(until_step=2)
        rest = Simulation(schedule, RunShape.build(epochs=1, steps_per_epoch=12))
        rest.load_state_dict(first.state_dict())
        assert whole.steps("x") == [1, 2, 3, 5, 10] == (head + rest.run()).steps("x")

    @pytest.mark.parametrize("module", ["schedule/table.py", "schedule/dues.py",
                                        "simulation/simulate.py", "simulation/simclock.py"])
    def test_table_and_simulator_name_no_built_in_trigger(self, module: str) -> None:
        """No built-in trigger class appears in the table's or the simulator's code."""
        from schedtrain import triggers

        built_in = {n for n in triggers.__all__ if isinstance(getattr(triggers, n), type)
                    and issubclass(getattr(triggers, n), Trigger) and n != "Trigger"}
        tree = ast.parse((ROOT / "schedtrain" / module).read_text())
        named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        named |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert named & built_in == set()
