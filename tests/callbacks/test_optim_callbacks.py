"""LearningRateMonitor and LRScheduler: what they log, what they step, and exact resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import UnevenData

from schedtrain import Schedule, SpecError, at, every, on
from schedtrain.callbacks import (
    Callback,
    LearningRateMonitor,
    LRScheduler,
    ModelSaver,
    ScheduledHyperParamSetter,
)
from schedtrain.spec import loads_spec
from schedtrain.training import Trainer
from schedtrain.training.from_spec import build_callbacks

EPOCHS, STEPS = 3, 5


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1)


def _fit(opt_fn: Any, scheduler: Any, run_dir: Path, *, save_at: int | None = None,
         resume: Path | None = None) -> Trainer:
    model = _model()
    opt = opt_fn(model)
    sched = scheduler(opt) if callable(scheduler) and not isinstance(scheduler, str) else scheduler
    cb = (LRScheduler(sched, args={"T_max": 7}) if isinstance(sched, str)
          else LRScheduler(sched))
    schedule = Schedule({"sched": every("1 step"), "lr": every("1 step"),
                         "save": at(f"{save_at} steps") if save_at else on("never")},
                        events=("never",))
    trainer = Trainer(model, opt, UnevenData([STEPS] * EPOCHS), torch.nn.functional.mse_loss,
                      schedule=schedule, max_epochs=EPOCHS, run_dir=run_dir,
                      bindings={"sched": cb, "lr": LearningRateMonitor(),
                                "save": ModelSaver(keep=None)})
    if resume is not None:
        trainer.resume(resume)
    trainer.fit()
    return trainer


def _sgd(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


SCHEDULERS: dict[str, Any] = {
    "cosine by name": "CosineAnnealingLR",
    "one-cycle": lambda opt: torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=0.5, total_steps=EPOCHS * STEPS),
    "warm-up then cosine": lambda opt: torch.optim.lr_scheduler.SequentialLR(opt, [
        torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=4),
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=11)], milestones=[4]),
}


class TestLearningRateMonitor:
    """The logged values are the optimizer's, per param group."""

    def test_single_group_logs_lr_and_momentum(self, tmp_path: Path) -> None:
        """One group: lr/group0 and lr agree with what the scheduler computed, every step."""
        sched: list[Any] = []

        def make(opt: torch.optim.Optimizer) -> Any:
            sched.append(torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5))
            return sched[0]
        trainer = _fit(_sgd, make, tmp_path)
        lrs = [v for _, v in trainer.metrics.history("lr/group0")]
        assert lrs == [v for _, v in trainer.metrics.history("lr")]
        # the lr step s used, though the scheduler (declared first) stepped at step s
        assert lrs == [0.1 * 0.5 ** ((s - 1) // 4) for s in range(1, EPOCHS * STEPS + 1)]
        assert {v for _, v in trainer.metrics.history("momentum/group0")} == {0.9}

    def test_several_groups_log_each_and_adam_betas(self) -> None:
        """Two groups: lr/group0, lr/group1 and betas[0] as momentum; no bare 'lr'."""
        model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
        opt = torch.optim.Adam([{"params": model[0].parameters(), "lr": 0.1},
                                {"params": model[1].parameters(), "lr": 0.01,
                                 "betas": (0.5, 0.9)}])
        trainer = Trainer(model, opt, UnevenData([2]), torch.nn.functional.mse_loss,
                          callbacks=[LearningRateMonitor()], max_epochs=1)
        trainer.fit()
        got = {n: trainer.metrics.value(n) for n in trainer.metrics.names()}
        assert {k: v for k, v in got.items() if "/group" in k} == {
            "lr/group0": 0.1, "lr/group1": 0.01, "momentum/group0": 0.9,
            "momentum/group1": 0.5}
        assert "lr" not in got


class TestLRScheduler:
    """Any torch scheduler, stepped on its trigger, resumed exactly."""

    @pytest.mark.parametrize("kind", list(SCHEDULERS))
    def test_steps_like_a_plain_loop(self, kind: str, tmp_path: Path) -> None:
        """The lr of every step is what stepping the scheduler by hand gives."""
        trainer = _fit(_sgd, SCHEDULERS[kind], tmp_path)
        opt = _sgd(_model())
        s = SCHEDULERS[kind]
        sched = (torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=7) if isinstance(s, str)
                 else s(opt))
        expected = []
        for _ in range(EPOCHS * STEPS):
            expected.append(opt.param_groups[0]["lr"])  # what this step uses
            opt.step()
            sched.step()
        assert [v for _, v in trainer.metrics.history("lr")] == pytest.approx(expected, rel=0,
                                                                                abs=0)

    @settings(max_examples=6, deadline=None)
    @given(st.sampled_from(list(SCHEDULERS)), st.integers(1, EPOCHS * STEPS - 1))
    def test_resume_mid_run_equals_uninterrupted(self, tmp_path_factory: pytest.TempPathFactory,
                                                 kind: str, cut: int) -> None:
        """Resumed from a checkpoint at any step: same lr at every later step, same weights."""
        full = _fit(_sgd, SCHEDULERS[kind], tmp_path_factory.mktemp("full"), save_at=cut)
        ckpt = full.run_dir / "checkpoints" / f"step-{cut:08d}.pt"
        resumed = _fit(_sgd, SCHEDULERS[kind], tmp_path_factory.mktemp("resumed"),
                       save_at=cut, resume=ckpt)  # the same schedule: its `at` has passed
        assert resumed.metrics.history("lr")[-(EPOCHS * STEPS - cut):] == \
            full.metrics.history("lr")[cut:]
        for a, b in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
            assert torch.equal(a, b)


def _toml(body: str) -> str:
    return f'[callbacks.lr]\ntype = "LRScheduler"\n{body}\ntrigger = {{ every = "1 step" }}\n'


class TestLRSchedulerFromToml:
    """A scheduler named in TOML is checked, name and arguments, before it is built."""

    def test_named_scheduler_is_built_at_setup(self) -> None:
        """`scheduler` and `args` build the torch class against the trainer's optimizer."""
        cbs = build_callbacks(loads_spec(_toml('scheduler = "StepLR"\n'
                                               'args = { step_size = 2, gamma = 0.5 }')))
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        Trainer(model, opt, UnevenData([4]), torch.nn.functional.mse_loss,
                schedule=Schedule({"lr": every("1 step")}), bindings=cbs, max_epochs=1).fit()
        assert opt.param_groups[0]["lr"] == 0.25

    def test_check_knows_the_scheduler_names_without_torch(self) -> None:
        """A misspelt class is refused when the spec loads, at callbacks.lr.scheduler, and
        the names it knows are exactly those torch can build from TOML values."""
        from schedtrain.callbacks.optim import _NEED_OBJECTS
        from schedtrain.spec.registry import TORCH_SCHEDULERS

        with pytest.raises(SpecError, match=r"callbacks\.lr\.scheduler: expected one of "
                                            r"ConstantLR, CosineAnnealingLR"):
            loads_spec(_toml('scheduler = "CosineAnnealing"'))
        lr_scheduler = torch.optim.lr_scheduler
        buildable = {n for n, c in vars(lr_scheduler).items()
                     if isinstance(c, type) and issubclass(c, lr_scheduler.LRScheduler)
                     and n != "LRScheduler" and not n.startswith("_")} - _NEED_OBJECTS
        assert buildable == TORCH_SCHEDULERS

    @pytest.mark.parametrize(("body", "message"), [
        ('scheduler = "CosineAnnealingLR"\nargs = { T_max = 10, tmax = 3 }',
         r"`args.tmax`: CosineAnnealingLR takes no argument 'tmax'"),
        ('scheduler = "CosineAnnealingLR"', r"`args`: CosineAnnealingLR needs 'T_max'"),
        ('scheduler = "os:system"', r"is not a scheduler class"),
    ])
    def test_bad_scheduler_is_refused_with_its_path(self, body: str, message: str) -> None:
        """Unknown class, unknown or missing argument: a SpecError at callbacks.lr."""
        with pytest.raises(SpecError, match=message) as info:
            build_callbacks(loads_spec(_toml(body)))
        assert "callbacks.lr" in str(info.value)

    def test_python_names_are_checked_too(self) -> None:
        """By name from Python: an unknown class names the choices; one that takes
        functions says to pass an object."""
        with pytest.raises(ValueError, match=r"'CosineAnnealing' is not a class of "
                                             r"torch.optim.lr_scheduler; expected one of "):
            LRScheduler("CosineAnnealing")
        with pytest.raises(ValueError, match="takes functions or schedulers"):
            LRScheduler("LambdaLR", args={})

    def test_check_refuses_a_bad_shape_without_torch(self) -> None:
        """`args` must be a table: the spec check says so at callbacks.lr.args."""
        with pytest.raises(SpecError, match=r"callbacks\.lr\.args.*a table"):
            loads_spec(_toml('scheduler = "StepLR"\nargs = [1]'))


class Flat(Callback):
    """Puts the same val/loss at every epoch's end: a plateau."""

    produces = ("val/loss",)

    def _trigger(self) -> None:
        self.metrics.put("val/loss", 1.0)


def test_monitor_steps_reduce_on_plateau_with_the_metric() -> None:
    """With `monitor`, the metric's latest value goes to step(): ReduceLROnPlateau named in
    TOML halves the lr once the loss has not improved for `patience` epochs."""
    cbs = build_callbacks(loads_spec(_toml(
        'scheduler = "ReduceLROnPlateau"\nargs = { patience = 1, factor = 0.5 }\n'
        'monitor = "val/loss"').replace('every = "1 step"', 'every = "1 epoch"')))
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    lrs: list[float] = []
    trainer = Trainer(model, opt, UnevenData([2] * 5), torch.nn.functional.mse_loss,
                      schedule=Schedule({"flat": every("1 epoch"), "lr": every("1 epoch"),
                                         "watch": every("1 epoch")}),
                      bindings={"flat": Flat(), **cbs,
                                "watch": lambda t: lrs.append(t.optimizer.param_groups[0]["lr"])},
                      max_epochs=5)
    trainer.fit()
    # best at epoch 1; epochs 2 and 3 without improvement exceed patience 1 at epoch 3
    assert lrs == [1.0, 1.0, 0.5, 0.5, 0.25]


#: Who changes the lr, and when: a scheduler each step or each epoch, or tensorpack's setter.
CHANGERS: dict[str, Any] = {
    "StepLR every step": (lambda: LRScheduler(lambda o: torch.optim.lr_scheduler.StepLR(
        o, step_size=2, gamma=0.5)), every("1 step")),
    "StepLR every 3 steps": (lambda: LRScheduler(lambda o: torch.optim.lr_scheduler.StepLR(
        o, step_size=1, gamma=0.5)), every("3 steps")),
    "one-cycle": (lambda: LRScheduler(lambda o: torch.optim.lr_scheduler.OneCycleLR(
        o, max_lr=0.5, total_steps=EPOCHS * STEPS + 1)), every("1 step")),
    "epoch setter": (lambda: ScheduledHyperParamSetter("lr", [(0, 0.3), (1, 0.2), (2, 0.05)]),
                     on("train_start") | every("1 epoch")),
}


def _monitored(changer: str, when: str, monitor_first: bool) -> tuple[
        list[tuple[int, float]], list[tuple[int, float]], dict[int, tuple[float, float]]]:
    """The monitor's lr and momentum logs, and (lr, momentum) at each optimizer.step()."""
    model = _model()
    opt = _sgd(model)
    used: dict[int, tuple[float, float]] = {}
    opt.register_step_pre_hook(lambda o, *_: used.__setitem__(
        len(used) + 1, (o.param_groups[0]["lr"], o.param_groups[0]["momentum"])))
    make, trigger = CHANGERS[changer]
    entries = ({"lr": every(when), "change": trigger} if monitor_first
               else {"change": trigger, "lr": every(when)})
    trainer = Trainer(model, opt, UnevenData([STEPS] * EPOCHS), torch.nn.functional.mse_loss,
                      schedule=Schedule(entries),
                      bindings={"lr": LearningRateMonitor(), "change": make()},
                      max_epochs=EPOCHS)
    trainer.fit()
    return trainer.metrics.history("lr"), trainer.metrics.history("momentum"), used


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(sorted(CHANGERS)), st.sampled_from(["1 step", "2 steps", "1 epoch"]))
def test_monitor_logs_the_rate_each_step_used_wherever_it_is_declared(
        changer: str, when: str) -> None:
    """Declared before or after the callback that changes the lr, the monitor logs the
    same values: at each firing, the lr and momentum the optimizer had when the last
    step's optimizer.step() ran (recorded here by an optimizer step pre-hook)."""
    logs = []
    for monitor_first in (True, False):
        lrs, momenta, used = _monitored(changer, when, monitor_first)
        assert lrs and [v for _, v in lrs] == [used[s][0] for s, _ in lrs]
        assert [v for _, v in momenta] == [used[s][1] for s, _ in momenta]
        logs.append(lrs)
    assert logs[0] == logs[1]


def test_monitor_resumed_at_an_event_after_the_change_logs_the_used_rate(
        tmp_path: Path) -> None:
    """Resumed from a checkpoint of a step_end where the scheduler stepped, the monitor's
    epoch_end firing at that step still logs the rate the step used."""
    def fit(resume: Path | None) -> Trainer:
        model = _model()
        opt = _sgd(model)
        trainer = Trainer(model, opt, UnevenData([STEPS] * EPOCHS),
                          torch.nn.functional.mse_loss,
                          schedule=Schedule({"change": every("1 step"),
                                             "save": at(f"{STEPS} steps"),
                                             "lr": every("1 epoch")}),
                          bindings={"change": LRScheduler(
                              lambda o: torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5)),
                              "save": ModelSaver(keep=None), "lr": LearningRateMonitor()},
                          max_epochs=EPOCHS, run_dir=tmp_path / ("b" if resume else "a"))
        if resume is not None:
            trainer.resume(resume)
        trainer.fit()
        return trainer

    full = fit(None)
    resumed = fit(tmp_path / "a" / "checkpoints" / f"step-{STEPS:08d}.pt")
    assert full.metrics.history("lr")[0] == (STEPS, 0.1 * 0.5 ** (STEPS - 1))
    assert resumed.metrics.history("lr") == full.metrics.history("lr")
