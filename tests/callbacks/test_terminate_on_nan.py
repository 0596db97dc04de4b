"""TerminateOnNaN sees every step's loss (kept on the device, read at its firings), names
the first bad step, stops on a non-finite evaluation loss, and plan stops where it does."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import as_if_killed, tiny_model

from schedtrain import Schedule, every
from schedtrain.callbacks import InferenceRunner, TerminateOnNaN
from schedtrain.planning.plan import plan_spec
from schedtrain.simulation.metric_stream import read_metrics
from schedtrain.spec import loads_spec
from schedtrain.training import Trainer
from schedtrain.training.losses import FOLD

STEPS_PER_EPOCH = 10


class BadAt:
    """MSE, but the loss of step ``bad`` (1-based) is made NaN or infinite."""

    def __init__(self, bad: int, value: float = math.nan) -> None:
        self.bad, self.value, self.calls = bad, value, 0

    def __call__(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        loss = torch.nn.functional.mse_loss(out, target)
        return loss * self.value if self.calls == self.bad else loss


def _data(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, 3, generator=g)
    return [(x[i], x[i].sum(1, keepdim=True)) for i in range(n)]


def _fit(bad: int, steps: int, check: str | None, run_dir: Path | None = None,
         value: float = math.nan) -> tuple[Trainer, TerminateOnNaN]:
    model, opt = tiny_model()
    nan = TerminateOnNaN()
    schedule = Schedule({"nan": every(check)} if check else {"nan": nan.default_trigger},
                        events=())
    t = Trainer(model, opt, _data(STEPS_PER_EPOCH), BadAt(bad, value), schedule=schedule,
                bindings={"nan": nan}, max_steps=steps, run_dir=run_dir)
    t.fit()
    return t, nan


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 150), st.integers(2, 40), st.sampled_from([math.nan, math.inf]))
def test_any_bad_step_is_found_at_the_next_check_and_named(bad: int, every_k: int,
                                                           value: float) -> None:
    """Whatever the step (inside a fold of 64 losses or across two), the run stops at the
    first check at or after it, and the stop line names that exact step."""
    steps = 160
    t, nan = _fit(bad, steps, f"{every_k} steps", value=value)
    check = -(-bad // every_k) * every_k
    if check > steps:  # no check after it: the run ends, nothing stops it
        assert not t.stopped
        return
    assert t.stopped and t.clock.step == check
    assert nan.first_bad_step == bad and nan.triggered_at == check
    assert f"not finite at step {bad} (the first such step)" in t.stopped.reason


def test_default_trigger_checks_at_train_end() -> None:
    """By default it reads every 100 steps and at train_end: a NaN in a 30-step run is
    reported at the end with its step, though nothing is left to stop."""
    t, nan = _fit(7, 30, None)
    assert nan.first_bad_step == 7 and nan.triggered_at == 30
    assert t.outcome == "finished"


def test_watching_adds_nothing_per_step() -> None:
    """With it the loop stays on its quiet path: no per-step clock, the same due steps."""
    model, opt = tiny_model()
    t = Trainer(model, opt, _data(STEPS_PER_EPOCH), torch.nn.functional.mse_loss,
                callbacks=[TerminateOnNaN()], max_steps=5)
    assert t._parts.loop.exact is False and t._parts.losses.watch
    assert type(t._parts.loop.step).__name__ == "PlainStep"


def test_resumed_between_the_bad_step_and_the_check(tmp_path: Path) -> None:
    """The note is run state: a checkpoint taken after the bad step (before the check)
    resumes to the same stop, naming the same step."""
    from schedtrain.callbacks import ModelSaver

    # The bad step comes after a fold; the save after it, the check after that.
    bad, save, check = FOLD + 3, FOLD + 6, FOLD + 26

    def make() -> tuple[Trainer, TerminateOnNaN]:
        model, opt = tiny_model()
        nan = TerminateOnNaN()
        t = Trainer(model, opt, _data(STEPS_PER_EPOCH), BadAt(bad),
                    schedule=Schedule({"save": every(f"{save} steps"),
                                       "nan": every(f"{check} steps")}),
                    bindings={"save": ModelSaver(keep=None), "nan": nan},
                    max_steps=check + 10, run_dir=tmp_path / "run", overwrite=True)
        return t, nan

    full, _ = make()
    full.fit()
    assert full.stopped and full.clock.step == check
    as_if_killed(tmp_path / "run")
    resumed, nan = make()
    resumed.resume(tmp_path / "run" / "checkpoints" / f"step-{save:08d}-nonfinite.pt")
    resumed.fit()
    assert resumed.clock.step == check and nan.first_bad_step == bad


def test_non_finite_evaluation_loss_stops_naming_it() -> None:
    """At eval_end it reads the evaluation's loss: NaN stops the run, the line names it."""
    model, opt = tiny_model()
    val = _data(2)
    val[1] = (val[1][0] * math.nan, val[1][1])
    t = Trainer(model, opt, _data(STEPS_PER_EPOCH), torch.nn.functional.mse_loss,
                callbacks=[InferenceRunner(data=val), TerminateOnNaN()], max_epochs=3)
    t.fit()
    assert t.stopped and t.clock.epoch == 1
    assert "val/loss = nan after the evaluation 'InferenceRunner'" in t.stopped.reason


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 60), st.sampled_from(["7 steps", "1 epoch", "25 steps"]))
def test_plan_with_the_runs_metrics_stops_where_it_did(
        tmp_path_factory: pytest.TempPathFactory, bad: int, check: str) -> None:
    """plan --metrics events.jsonl of a run with a non-finite loss ends at the run's stop."""
    run_dir = tmp_path_factory.mktemp("run")
    t, _ = _fit(bad, 60, check, run_dir=run_dir)
    spec = loads_spec(textwrap.dedent(f"""
        [clock]
        epochs = 6
        steps_per_epoch = {STEPS_PER_EPOCH}
        [callbacks.nan]
        type = "TerminateOnNaN"
        trigger = {{ every = "{check}" }}
        """))
    plan = plan_spec(spec, read_metrics(run_dir / "events.jsonl"))
    if not t.stopped:
        assert plan.stopped is None
        return
    assert plan.stopped is not None and f"(step {t.clock.step})" in plan.stopped
    got: list[Any] = [(f.callback, f.event, f.step) for f in plan.log]
    assert got == [(f.callback, f.event, f.step) for f in t.firings]


@pytest.mark.skipif(not torch.distributed.is_available(),
                    reason="torch.distributed is not available")
def test_two_ranks_stop_together_naming_the_first_bad_step_over_ranks(tmp_path: Path) -> None:
    """A NaN loss on rank 1 only at step 5 (rank 0's loss goes NaN at step 6, through the
    averaged gradients): both ranks stop at the check at step 8, naming step 5."""
    import json

    from torchrun_helpers import forked_ranks

    spec = tmp_path / "nan.toml"
    spec.write_text('[run]\ntask = "jobs.ddp:make_nan_task"\nmax_epochs = 2\n\n'
                    '[callbacks.nan]\ntype = "TerminateOnNaN"\n'
                    'trigger = { every = "4 steps" }\n')
    result = forked_ranks(spec, tmp_path / "run", timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    status = json.loads((tmp_path / "run" / "run.json").read_text())
    assert (status["status"], status["step"]) == ("stopped", 8)
    assert "not finite at step 5 (the first such step)" in result.stdout
    assert "on rank" not in result.stdout  # every rank asked alike: no one rank's reason


def test_under_gradient_accumulation_the_step_is_named() -> None:
    """With two micro-batches a step (the loop's exact path), a NaN in the 9th micro-batch
    is step 5's loss: found at the check at step 6, named step 5."""
    model, opt = tiny_model()
    nan = TerminateOnNaN()
    t = Trainer(model, opt, _data(40), BadAt(9), schedule=Schedule({"nan": every("3 steps")}),
                bindings={"nan": nan}, max_steps=12, grad_accum=2)
    t.fit()
    assert t.stopped and t.clock.step == 6 and nan.first_bad_step == 5


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 2000), st.sets(st.integers(1, 2000), max_size=3),
       st.lists(st.integers(1, 2000), max_size=60), st.lists(st.integers(1, 2000), max_size=8))
def test_the_keeper_finds_the_first_bad_step_however_it_folds(
        steps: int, bad: set[int], folds: list[int], reads: list[int]) -> None:
    """The loss keeper, folded at any steps (the loop every 64, publications anywhere,
    past the batch of 16 unchecked folds) and read at any steps, gives the first step
    whose loss was not finite so far; a checkpoint of it anywhere gives the same."""
    from schedtrain.training.losses import LossKeeper

    keeper = LossKeeper()
    keeper.watch = True
    fold_at, read_at = set(folds), set(reads)
    for step in range(1, steps + 1):
        keeper.losses.append(torch.tensor(math.inf if step in bad else float(step)))
        if step in fold_at or len(keeper.losses) >= FOLD:
            keeper.fold(step)
        if step in read_at or step == steps:
            expected = min((b for b in bad if b <= step), default=None)
            assert keeper.first_nonfinite(step) == expected
            copy = LossKeeper()
            copy.watch = True
            copy.load_state_dict(keeper.state_dict())
            assert copy.first_nonfinite(step) == expected


@pytest.mark.skipif(not torch.distributed.is_available(),
                    reason="torch.distributed is not available")
def test_two_ranks_stop_together_on_one_ranks_nan_evaluation(tmp_path: Path) -> None:
    """A NaN validation loss on rank 1 only (read at eval_end, before the evaluation's
    metrics are reduced): the ranks agree, and both stop after that evaluation."""
    import json

    from torchrun_helpers import forked_ranks

    spec = tmp_path / "nan.toml"
    spec.write_text('[run]\ntask = "jobs.ddp:make_nan_eval_task"\nmax_epochs = 3\n\n'
                    '[callbacks.validate]\ntype = "InferenceRunner"\n'
                    'trigger = { every = "1 epoch" }\n\n'
                    '[callbacks.nan]\ntype = "TerminateOnNaN"\n'
                    'trigger = { on = "eval_end" }\n\n'
                    '[callbacks.save]\ntype = "ModelSaver"\ntrigger = { every = "1 epoch" }\n')
    result = forked_ranks(spec, tmp_path / "run", timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    status = json.loads((tmp_path / "run" / "run.json").read_text())
    assert (status["status"], status["epoch"]) == ("stopped", 1)
    assert "after the evaluation 'validate'" in result.stdout
