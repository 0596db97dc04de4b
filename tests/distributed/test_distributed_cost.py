"""What agreement costs on two real processes: the collectives schedtrain calls, counted.

The rule (docs/distributed.md): no collective on a step where no trigger is due; one
at a step where one is (the counters, the chief's time, the loss and pending signals in
one collective), one at an epoch's end not already agreed at its last step; then one per
firing of a callback that produces metrics, which also carries the stop flags; and a
stop flag after an event only where a callback that may stop alone ran.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch
from torchrun_helpers import torchrun

from schedtrain.callbacks import Callback
from schedtrain.callbacks.base import stops_alone

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed is not available")

EPOCHS, STEPS_PER_EPOCH = 3, 8  # tests/jobs/ddp.py: 256 samples, 16 a rank and step
STEPS = EPOCHS * STEPS_PER_EPOCH

SPEC = """\
[run]
task = "jobs.ddp:make_task"
max_epochs = {epochs}
seed = 1

[callbacks.tick]
type = "jobs.ddp:Quiet"
trigger = {{ every = "{every} steps" }}
{extra}
[callbacks.count]
type = "jobs.ddp:CountCollectives"
trigger = {{ on = "train_end" }}
"""


def train(folder: Path, every: int, extra: str = "") -> subprocess.CompletedProcess[str]:
    """A 2-rank run of ``SPEC`` in ``folder / "run"``, which must succeed."""
    folder.mkdir(parents=True)
    spec = folder / "cost.toml"
    spec.write_text(SPEC.format(epochs=EPOCHS, every=every, extra=extra))
    result = torchrun(spec, folder / "run", timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def collectives(folder: Path, every: int, extra: str = "") -> int:
    """The collectives each rank called in a 2-rank run (the same on both)."""
    train(folder, every, extra)
    counts = [json.loads((folder / f"collectives-rank{r}.json").read_text()) for r in (0, 1)]
    assert counts[0] == counts[1]
    return int(counts[0])


def agreements(every: int) -> int:
    """One per step where ``every`` is due, plus one per epoch end not due."""
    due = set(range(every, STEPS + 1, every))
    ends = {STEPS_PER_EPOCH * e for e in range(1, EPOCHS + 1)}
    return len(due) + len(ends - due)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> int:
    """Setup, teardown and the epoch ends: a run whose callback never fires."""
    return collectives(tmp_path_factory.mktemp("cost") / "never", 1000) - agreements(1000)


@pytest.mark.parametrize("every", [2, 3, 5])
def test_one_collective_per_step_where_a_trigger_is_due_none_elsewhere(
        tmp_path: Path, baseline: int, every: int) -> None:
    assert collectives(tmp_path / "run", every) == baseline + agreements(every)


def test_a_producing_callback_adds_one_reduction_per_firing_which_carries_the_stop_flag(
        tmp_path: Path, baseline: int) -> None:
    extra = '[callbacks.rank]\ntype = "jobs.ddp:RankMetric"\ntrigger = { every = "4 steps" }\n'
    got = collectives(tmp_path / "run", 2, extra)
    assert got == baseline + agreements(2) + STEPS // 4


def test_a_callback_that_may_stop_alone_adds_one_stop_flag_per_event(
        tmp_path: Path, baseline: int) -> None:
    extra = '[callbacks.maybe]\ntype = "jobs.ddp:MayStop"\ntrigger = { every = "4 steps" }\n'
    got = collectives(tmp_path / "run", 2, extra)
    assert got == baseline + agreements(2) + STEPS // 4


def test_stop_training_raised_on_one_rank_stops_both_at_that_step(tmp_path: Path) -> None:
    extra = ('[callbacks.stop]\ntype = "jobs.ddp:RaiseStopOnRank"\nrank = 1\nstep = 6\n'
             'trigger = { every = "3 steps" }\n')
    result = train(tmp_path / "run", 2, extra)
    status = json.loads((tmp_path / "run" / "run" / "run.json").read_text())
    assert (status["status"], status["step"]) == ("stopped", 6)
    assert "rank 1 raised at step 6 (on rank 1)" in result.stdout


def test_stop_training_raised_by_a_hook_on_one_rank_stops_both_at_the_next_event(
        tmp_path: Path) -> None:
    extra = ('[callbacks.stop]\ntype = "jobs.ddp:RaiseStopInHookOnRank"\nrank = 1\n'
             'step = 5\ntrigger = { on = "train_end" }\n')
    result = train(tmp_path / "run", 2, extra)
    status = json.loads((tmp_path / "run" / "run" / "run.json").read_text())
    assert (status["status"], status["step"]) == ("stopped", 6)  # tick's next firing
    assert "rank 1's hook raised at step 5 (on rank 1)" in result.stdout


@pytest.mark.parametrize(("values", "op", "expected"), [
    ([1.0, 3.0], "mean", 2.0), ([1.0, 3.0], "sum", 4.0), ([1.0, 3.0], "max", 3.0),
    ([1.0, 3.0], "min", 1.0), ([math.inf, -math.inf], "mean", math.nan),
    ([math.inf, 1.0], "sum", math.inf), ([math.nan, 1.0], "max", math.nan),
    ([1.0, math.nan], "min", math.nan), ([1e16, 1.0, -1e16], "sum", 1.0)])
def test_a_reduction_is_exact_and_a_nan_on_any_rank_is_seen(
        values: list[float], op: str, expected: float) -> None:
    from schedtrain.distributed.comm import reduce_column

    got = reduce_column([[v, 1.0] for v in values] + [[123.0, 0.0]], 0, 1, op)
    assert got is not None
    assert got == expected or (math.isnan(got) and math.isnan(expected))


class _Base(Callback):
    pass


class _Declared(Callback):
    may_stop_alone = False

    def _trigger(self) -> None:
        pass


class _Overrides(_Declared):
    def _trigger(self) -> None:  # may stop: it does not restate the promise
        pass


class _Restates(_Declared):
    may_stop_alone = False

    def _after_step(self, step: int, outputs: object) -> None:  # type: ignore[override]
        pass


class _Inherits(_Declared):
    pass


class _Resumes(_Declared):
    def load_state_dict(self, state: dict[str, object]) -> None:  # may stop from it
        pass


class _SetsUp(_Declared):
    def _setup(self) -> None:
        pass


def _instance(alone: bool) -> Callback:
    cb = _Base()
    cb.may_stop_alone = alone  # type: ignore[misc]
    return cb


@pytest.mark.parametrize(("callback", "alone"), [
    (_Base(), True), (_Declared(), False), (_Overrides(), True), (_Restates(), False),
    (_Inherits(), False), (_Resumes(), True), (_SetsUp(), True), (_instance(False), False),
    (object(), True)])
def test_may_stop_alone_is_the_most_derived_class_that_says_it_or_overrides(
        callback: object, alone: bool) -> None:
    assert stops_alone(callback) is alone


def test_built_in_callbacks_that_never_stop_alone_say_so() -> None:
    from schedtrain import callbacks as built_in

    alone = {name for name in built_in.__all__
             if isinstance(cls := getattr(built_in, name), type)
             and issubclass(cls, Callback) and cls is not Callback
             and stops_alone(cls.__new__(cls))}
    # reads its rank's own loss; a human at the chief's shell; user functions
    assert alone <= {"TerminateOnNaN", "InjectShell", "FunctionCallback"}, alone
