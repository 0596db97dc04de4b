"""Hugging Face ``Trainer``: schedtrain ``Callback`` objects fire where ``simulate()`` says
on HF's clock, see the Trainer's model and optimizer, stop training through
``should_training_stop`` and keep their state in ``trainer_state.json`` across a resume."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from hosted_helpers import fired, recorded, simulated_fired
from test_integrations_transformers import SEQ, dataset, model
from transformers import Trainer, TrainerCallback, TrainingArguments

from schedtrain import Schedule, Scheduled, ScheduleWarning, StopTraining, every, simulate
from schedtrain.callbacks import Callback, TerminateOnNaN
from schedtrain.integrations.context import HostError
from schedtrain.integrations.transformers import ScheduleCallback

quiet = pytest.mark.filterwarnings("ignore")


def train(out: Path, cb: ScheduleCallback, *, epochs: int = 2, steps: int = 3, accum: int = 2,
          callbacks: tuple[Any, ...] = (), resume: str | None = None, **extra: Any) -> Trainer:
    args = TrainingArguments(
        output_dir=str(out), use_cpu=True, report_to="none", disable_tqdm=True,
        per_device_train_batch_size=1, gradient_accumulation_steps=accum,
        num_train_epochs=epochs, logging_strategy="no", eval_strategy="no",
        include_num_input_tokens_seen=True, seed=0, **({"save_strategy": "no"} | extra))
    trainer = Trainer(model=model(), args=args, train_dataset=dataset(steps * accum),
                      callbacks=[cb, *callbacks])
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def hosted(schedule: Schedule, actions: dict[str, Any] | None = None) -> ScheduleCallback:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        return ScheduleCallback(schedule, actions)


SCHEDULE = Schedule({"steps": every("2 steps"), "epochs": every("1 epoch"),
                     "tokens": every(f"{3 * SEQ} tokens")})


@quiet
class TestCallbacksFireAsSimulated:
    """A user's ``Callback`` subclass runs where ``simulate()`` says."""

    def test_trigger_and_epoch_hooks_under_accumulation(self, tmp_path: Path) -> None:
        """Optimizer steps (2 micro-batches each), epochs and ``num_input_tokens_seen``:
        ``_trigger`` as simulated, the epoch hooks once per epoch."""
        bound, recorders = recorded(SCHEDULE)
        train(tmp_path, hosted(bound))
        log = simulate(SCHEDULE, epochs=2, steps_per_epoch=3, batches_per_step=2,
                       tokens_per_batch=SEQ)
        assert fired(recorders) == simulated_fired(log)
        assert recorders["steps"].epochs == [("before", 1), ("after", 1), ("before", 2),
                                             ("after", 2)]

    def test_sees_model_and_optimizer(self, tmp_path: Path) -> None:
        """``self.model`` is the Trainer's model and ``self.optimizer`` its optimizer."""
        seen: list[tuple[str, int]] = []

        class Peek(Callback):
            def _trigger(self) -> None:
                seen.append((type(self.model).__name__, len(self.optimizer.param_groups)))

        train(tmp_path, hosted(Schedule({"peek": every("3 steps")}), {"peek": Peek()}))
        assert seen[0][0] == "GPT2LMHeadModel" and len(seen) == 2


@quiet
class TestStopping:
    """A callback's stop ends HF's training after the event."""

    def test_stop_training_raised_by_a_callback(self, tmp_path: Path) -> None:
        """tensorpack's way, ``raise StopTraining`` in ``_trigger``: HF ends at that step."""

        class Enough(Callback):
            def _trigger(self) -> None:
                if self.global_step == 4:
                    raise StopTraining("enough")

        trainer = train(tmp_path, hosted(Schedule({"s": every("2 steps")}), {"s": Enough()}),
                        epochs=3)
        assert trainer.state.global_step == 4


@quiet
class TestResume:
    """A callback's state rides in the checkpoint's ``trainer_state.json``."""

    @pytest.mark.parametrize("cut", [2, 3, 4])
    def test_kill_and_resume_keeps_state(self, tmp_path: Path, cut: int) -> None:
        """Killed after step ``cut`` and resumed from HF's checkpoint there: the resumed
        callbacks' counts and firings continue the uninterrupted run's."""
        whole, whole_rec = recorded(SCHEDULE)
        train(tmp_path / "whole", hosted(whole))
        first, first_rec = recorded(SCHEDULE)
        before: list[int] = []

        class Kill(TrainerCallback):
            def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                if state.global_step == cut and not before:
                    before.append(len(fired(first_rec)))

            def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                if state.global_step == cut:
                    raise KeyError("killed")

        out = tmp_path / "cut"
        with pytest.raises(KeyError):
            train(out, hosted(first), callbacks=(Kill(),), save_strategy="steps",
                  save_steps=1)
        second, second_rec = recorded(SCHEDULE)
        train(out, hosted(second), resume=str(out / f"checkpoint-{cut}"))
        assert fired(first_rec)[:before[0]] + fired(second_rec) == fired(whole_rec)
        assert {n: r.count for n, r in second_rec.items()} == {
            n: r.count for n, r in whole_rec.items()}


class TestRefused:
    """What the HF Trainer cannot give is refused when the callback is added."""

    def test_terminate_on_nan(self) -> None:
        """HF does not show its callbacks each step's loss."""
        with pytest.raises(HostError, match=r"callback 'nan' \(TerminateOnNaN\) reads each "
                                            "step's training loss, which the HF Trainer"):
            ScheduleCallback(Schedule([Scheduled(every("2 steps"), TerminateOnNaN(), "nan")]))

    def test_on_exception(self) -> None:
        """HF does not tell its callbacks that training failed."""

        class Cleanup(Callback):
            def _on_exception(self, exc: BaseException) -> None:
                return None

        with pytest.raises(HostError, match="overrides _on_exception"):
            ScheduleCallback(Schedule({"c": every("2 steps")}), {"c": Cleanup()})

    def test_state_that_is_not_json(self, tmp_path: Path) -> None:
        """A callback keeping a tensor in its state is named when HF saves a checkpoint."""

        class Tensorful(Callback):
            def state_dict(self) -> dict[str, Any]:
                return {"t": torch.zeros(1)}

        with pytest.raises(HostError, match=r"callback 't': its state_dict is not JSON "
                                            "data .* trainer_state.json"):
            train(tmp_path, hosted(Schedule({"t": every("2 steps")}), {"t": Tensorful()}),
                  save_strategy="steps", save_steps=2)
