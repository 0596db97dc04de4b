"""Hugging Face ``Trainer``: ``ScheduleCallback`` sets the control flags where ``simulate()``
predicts on HF's clock (optimizer steps under gradient accumulation, micro-batches, epochs,
``num_input_tokens_seen``, the loss HF logs), and resumes exactly from HF's checkpoints.
A tiny GPT-2 is built from a config: nothing is downloaded."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
import torch
from host_strategies import counters, host_schedules
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.utils import logging as hf_logging

from schedtrain import Schedule, ScheduleWarning, Unit, every, simulate, when
from schedtrain import on as on_
from schedtrain.integrations.transformers import ScheduleCallback

UNITS = [Unit.STEP, Unit.BATCH, Unit.EPOCH, Unit.TOKEN]
SEQ = 4
hf_logging.set_verbosity_error()
logging.getLogger("accelerate").setLevel(logging.ERROR)


def model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=1, n_embd=8, vocab_size=16,
                                      n_positions=SEQ, bos_token_id=0, eos_token_id=0))


def dataset(rows: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 16, (rows, SEQ), generator=g)
    return [{"input_ids": r, "labels": r} for r in ids]


class Logged(TrainerCallback):
    """Keeps each logged loss with the step it was logged after."""

    def __init__(self) -> None:
        self.losses: list[tuple[int, float]] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        if logs and "loss" in logs:
            self.losses.append((state.global_step, float(logs["loss"])))


Shape = tuple[int, int, int, int]
"""Epochs, optimizer steps per epoch, micro-batches per step, rows per micro-batch."""


def schedule_callback(schedule: Schedule) -> ScheduleCallback:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        return ScheduleCallback(schedule, {"log": "log"}, record=True)


def train(tmp: Path, cb: ScheduleCallback, shape: Shape, callbacks: list[Any],
          resume: str | None = None, **extra: Any) -> None:
    epochs, steps, accum, rows = shape
    args = TrainingArguments(
        output_dir=str(tmp), use_cpu=True, report_to="none", disable_tqdm=True,
        per_device_train_batch_size=rows, gradient_accumulation_steps=accum,
        num_train_epochs=epochs, logging_strategy="no", eval_strategy="no",
        include_num_input_tokens_seen=True, seed=0, **({"save_strategy": "no"} | extra))
    Trainer(model=model(), args=args, train_dataset=dataset(steps * accum * rows),
            callbacks=[cb, *callbacks]).train(resume_from_checkpoint=resume)


def simulated(schedule: Schedule, shape: Shape, losses: list[tuple[int, float]]
              ) -> list[tuple[object, ...]]:
    """simulate() with the losses HF logged: HF logs after ``on_step_end``, so a loss
    logged after step s is seen from the next micro-batch on (its ``batch_end``, and step
    s + 1's end), and at its epoch's end when s ended the epoch."""
    epochs, steps, accum, rows = shape
    stream = [((f"{s // steps} epochs" if s % steps == 0 else f"{s * accum + 1} batches"),
               "loss", v) for s, v in losses]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        log = simulate(schedule, epochs=epochs, steps_per_epoch=steps, batches_per_step=accum,
                       tokens_per_batch=rows * SEQ, metrics=stream)
    return counters(log)


def with_logging(schedule: Schedule) -> Schedule:
    """The schedule plus ``log`` every step (so the loss the conditions read is logged)."""
    return Schedule({**schedule.triggers(), "log": every("1 step")})


shapes = st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 2), st.integers(1, 2))
quiet = pytest.mark.filterwarnings("ignore")


@quiet
class TestAgainstSimulation:
    """The firing list inside the HF Trainer is simulate()'s on HF's clock."""

    @pytest.mark.parametrize("accum", [1, 2])
    def test_a_logged_loss_is_seen_from_the_next_micro_batch(self, tmp_path: Path,
                                                             accum: int) -> None:
        """HF logs after ``on_step_end``: the loss of step s is read at the next
        micro-batch's ``batch_end`` (before step s + 1 ends), as simulated."""
        schedule = with_logging(Schedule({"cb0": every("1 batch") & when("loss > 0")}))
        logged = Logged()
        cb = schedule_callback(schedule)
        train(tmp_path, cb, (1, 3, accum, 1), [logged])
        fired = counters(cb.firings)
        assert ("cb0", "batch_end") in {f[:2] for f in fired}
        assert fired == simulated(schedule, (1, 3, accum, 1), logged.losses)

    @settings(max_examples=8, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(schedule=host_schedules(UNITS, metric="loss"), shape=shapes)
    def test_firings_equal_simulation(self, schedule: Schedule, shape: Shape,
                                      tmp_path: Path) -> None:
        """global_step under gradient accumulation, micro-batches, epochs, tokens seen,
        windows, conditions and ``improved`` on the logged loss: as simulated."""
        schedule = with_logging(schedule)
        logged = Logged()
        cb = schedule_callback(schedule)
        train(tmp_path, cb, shape, [logged])
        assert counters(cb.firings) == simulated(schedule, shape, logged.losses)

    @settings(max_examples=5, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(schedule=host_schedules(UNITS, metric="loss"), shape=shapes, data=st.data())
    def test_resume_fires_as_the_uninterrupted_run(self, schedule: Schedule, shape: Shape,
                                                   data: st.DataObject,
                                                   tmp_path_factory: pytest.TempPathFactory
                                                   ) -> None:
        """Killed after any step, resumed with ``resume_from_checkpoint`` from the checkpoint
        HF saved there: what fired up to it and what the resumed run fires are the
        uninterrupted run's firings."""
        schedule = with_logging(schedule)
        epochs, steps, _, _ = shape
        assume(epochs * steps > 1)
        cut = data.draw(st.integers(1, epochs * steps - 1), label="killed after step")
        out = tmp_path_factory.mktemp("hf")
        first = schedule_callback(schedule)
        logged = Logged()
        saved_after: list[int] = []  # firings made when the checkpoint at `cut` was written

        class Kill(TrainerCallback):
            def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                if state.global_step == cut and not saved_after:
                    saved_after.append(len(first.firings))

            def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                if state.global_step == cut:
                    raise KeyError("killed")

        with pytest.raises(KeyError):
            train(out, first, shape, [logged, Kill()], save_strategy="steps", save_steps=1)
        second = schedule_callback(schedule)
        resumed = Logged()
        train(out, second, shape, [resumed], resume=str(out / f"checkpoint-{cut}"))
        losses = [x for x in logged.losses if x[0] <= cut] + resumed.losses
        before = first.firings[:saved_after[0]]
        assert counters(before + second.firings) == simulated(schedule, shape, losses)


@quiet
class TestFlags:
    """Callbacks bound to control flags steer the Trainer."""

    def test_evaluate_save_stop_under_accumulation(self, tmp_path: Path) -> None:
        """With gradient_accumulation_steps=3, ``evaluate`` every 2 optimizer steps, ``save``
        at each epoch's end and ``stop`` at step 5: HF evaluates after steps 2 and 4, saves
        checkpoint-3 and ends at global_step 5 (its own *_steps flags all off)."""
        schedule = Schedule({"eval": every("2 steps"), "save": every("1 epoch"),
                             "halt": every("5 steps")})
        evaluated: list[int] = []

        class Evaluated(TrainerCallback):
            def on_evaluate(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                evaluated.append(state.global_step)

        cb = ScheduleCallback(schedule, {"eval": "evaluate", "save": "save", "halt": "stop"})
        args = TrainingArguments(
            output_dir=str(tmp_path), use_cpu=True, report_to="none", disable_tqdm=True,
            per_device_train_batch_size=1, gradient_accumulation_steps=3, num_train_epochs=4,
            logging_strategy="no", eval_strategy="no", save_strategy="no")
        trainer = Trainer(model=model(), args=args, train_dataset=dataset(9),
                          eval_dataset=dataset(2), callbacks=[cb, Evaluated()])
        trainer.train()
        assert evaluated == [2, 4]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-3"]
        assert trainer.state.global_step == 5


class TestBadInput:
    """Mistakes are named before training starts."""

    def test_flag_at_train_start(self) -> None:
        """A flag whose trigger can fire where HF does not act on it is refused."""
        with pytest.raises(ValueError, match=r"can also fire at \['train_end'\]"):
            ScheduleCallback(Schedule({"s": every("2 steps") | on_("train_end")}), {"s": "save"})

    def test_unknown_flag(self) -> None:
        """A flag HF does not have is refused, with the ones it has."""
        with pytest.raises(ValueError, match="unknown flag 'checkpoint'"):
            ScheduleCallback(Schedule({"s": every("2 steps")}), {"s": "checkpoint"})

    def test_rebuilt_without_schedule(self) -> None:
        """Rebuilt with no schedule (restore_callback_states_from_checkpoint=True), it says
        to leave that option off."""
        with pytest.raises(TypeError, match="restore_callback_states_from_checkpoint"):
            ScheduleCallback()
