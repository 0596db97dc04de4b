"""Hugging Face ``Trainer``: HF's own strategies give way to the schedule's flags, HF
evaluates and saves at most once a step, and a save gated on an evaluation's metric is
decided at the evaluation's own step, as ``simulate()`` with the natural metric stream
predicts. A tiny BERT is built from a config: nothing is downloaded."""

from __future__ import annotations

import json
import logging
import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.utils import logging as hf_logging

from schedtrain import Schedule, ScheduleWarning, every, improved, simulate
from schedtrain.integrations.transformers import ScheduleCallback

hf_logging.set_verbosity_error()
logging.getLogger("accelerate").setLevel(logging.ERROR)
ROWS_PER_BATCH = 2
quiet = pytest.mark.filterwarnings("ignore")


def bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(
        vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
        intermediate_size=8, max_position_embeddings=8, num_labels=2))


def rows(n: int) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 20, (n, 6), generator=g)
    return [{"input_ids": r, "attention_mask": torch.ones(6, dtype=torch.long),
             "labels": int(r.sum() % 2)} for r in ids]


class Seen(TrainerCallback):
    """The steps HF evaluated and saved at, and at which event each evaluation came."""

    def __init__(self) -> None:
        self.evaluated: list[tuple[str, int, int]] = []  # (event, step, epochs ended)
        self.saved: list[int] = []
        self.where = "step_end"

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.where = "step_end"

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.where = "epoch_end"

    def on_evaluate(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.evaluated.append((self.where, state.global_step, round(float(state.epoch))))

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.saved.append(state.global_step)


def trainer(out: Path, callbacks: list[Any], *, batches: int, accum: int, epochs: int,
            metric: Iterator[float] | None = None, **strategies: Any) -> Trainer:
    """A Trainer with HF's default TrainingArguments but for ``strategies``."""
    args = TrainingArguments(
        output_dir=str(out), use_cpu=True, report_to="none", disable_tqdm=True,
        per_device_train_batch_size=ROWS_PER_BATCH, per_device_eval_batch_size=4,
        gradient_accumulation_steps=accum, num_train_epochs=epochs, seed=0,
        save_only_model=True, **strategies)
    score = None if metric is None else (lambda _pred: {"score": next(metric)})
    return Trainer(model=bert(), args=args, train_dataset=rows(batches * ROWS_PER_BATCH),
                   eval_dataset=rows(4), compute_metrics=score, callbacks=callbacks)


def once_a_step(steps: list[int]) -> list[int]:
    """``steps`` with a repeat at the same step dropped (a step end that ends an epoch)."""
    return [s for i, s in enumerate(steps) if i == 0 or steps[i - 1] != s]


@quiet
class TestStrategies:
    """HF's own cadence is switched off for each bound flag, or refused when set."""

    def test_default_arguments_give_way(self, tmp_path: Path) -> None:
        """Default TrainingArguments (save and log every 500 steps, and save at the end):
        with evaluate, save and log bound, HF evaluates, saves and logs only where the
        schedule fires, once a step; the strategies read "no" after the Trainer is built."""
        schedule = Schedule({"evaluate": every("2 steps"), "save": every("1 epoch"),
                             "log": every("1 step")})
        seen = Seen()
        cb = ScheduleCallback(schedule, {"evaluate": "evaluate", "save": "save", "log": "log"})
        t = trainer(tmp_path, [cb, seen], batches=10, accum=3, epochs=3)
        assert (t.args.eval_strategy, t.args.save_strategy, t.args.logging_strategy) == \
            ("no", "no", "no")
        t.train()
        log = simulate(schedule, epochs=3, steps_per_epoch=4)
        assert [s for _, s, _ in seen.evaluated] == log.steps("evaluate") == [2, 4, 6, 8, 10, 12]
        assert seen.saved == log.steps("save") == [4, 8, 12]

    @pytest.mark.parametrize(("flag", "arg", "value"), [
        ("evaluate", "eval_strategy", "epoch"), ("save", "save_strategy", "epoch"),
        ("save", "save_strategy", "best"), ("log", "logging_strategy", "epoch")])
    def test_a_strategy_set_besides_the_flag_is_refused(self, tmp_path: Path, flag: str,
                                                        arg: str, value: str) -> None:
        """A strategy the user set (not its default) next to the bound flag would act twice:
        refused in one line when the Trainer is built, naming the argument."""
        cb = ScheduleCallback(Schedule({"x": every("2 steps")}), {"x": flag})
        extra = {"metric_for_best_model": "loss"} if value == "best" else {}
        with pytest.raises(ValueError, match=rf"^TrainingArguments\({arg}='{value}'\) .*"
                                             rf"set {arg}=\"no\"[^\n]*$"):
            trainer(tmp_path, [cb], batches=2, accum=1, epochs=1, **{arg: value}, **extra)

    def test_unbound_strategies_are_left_alone(self, tmp_path: Path) -> None:
        """Only the bound flags' strategies change: HF's own eval cadence stays."""
        cb = ScheduleCallback(Schedule({"x": every("2 steps")}), {"x": "save"})
        t = trainer(tmp_path, [cb], batches=2, accum=1, epochs=1, eval_strategy="steps",
                    eval_steps=1)
        assert (t.args.eval_strategy, t.args.save_strategy, t.args.logging_strategy) == \
            ("steps", "no", "steps")

    @settings(max_examples=6, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(ev=st.integers(1, 3), sv=st.integers(1, 3), batches=st.integers(2, 5),
           accum=st.integers(1, 2), epochs=st.integers(1, 2), by_epoch=st.booleans())
    def test_at_most_once_a_step(self, tmp_path_factory: pytest.TempPathFactory, *, ev: int,
                                 sv: int, batches: int, accum: int, epochs: int,
                                 by_epoch: bool) -> None:
        """A flag whose trigger fires at a step end and at the epoch end of that same step
        evaluates or saves once there: HF's evaluations and saves are simulate()'s firings,
        a repeat at one step dropped."""
        extra = every("1 epoch") if by_epoch else every(f"{sv + 1} steps")
        schedule = Schedule({"evaluate": every(f"{ev} steps") | every("1 epoch"),
                             "save": every(f"{sv} steps") | extra})
        seen = Seen()
        cb = ScheduleCallback(schedule, {"evaluate": "evaluate", "save": "save"})
        trainer(tmp_path_factory.mktemp("hf"), [cb, seen], batches=batches, accum=accum,
                epochs=epochs).train()
        log = simulate(schedule, epochs=epochs, steps_per_epoch=math.ceil(batches / accum))
        assert [s for _, s, _ in seen.evaluated] == once_a_step(log.steps("evaluate"))
        assert seen.saved == once_a_step(log.steps("save"))


def natural_stream(seen: Seen, values: list[float]) -> list[tuple[str, str, float]]:
    """Each evaluation's metric stamped at its own point: the step it ran after, or the
    epoch whose end it ran at."""
    return [((f"{s} steps" if where == "step_end" else f"{e} epochs"), "eval_score", v)
            for (where, s, e), v in zip(seen.evaluated, values, strict=False)]


@quiet
class TestMetricTiming:
    """A save gated on an evaluation's metric is decided at the evaluation's step."""

    def test_the_report_case(self, tmp_path: Path) -> None:
        """``every("2 steps") & improved("eval_score")`` bound to save, evaluate every 2
        steps, the score improving each time: HF saves the weights it evaluated, at
        steps 2, 4, ..., 12, as simulate() says (it saved one evaluation late before)."""
        schedule = Schedule({"evaluate": every("2 steps"),
                             "save": every("2 steps") & improved("eval_score", mode="max")})
        values = [0.1 * k for k in range(1, 7)]
        seen = Seen()
        cb = ScheduleCallback(schedule, {"evaluate": "evaluate", "save": "save"})
        trainer(tmp_path, [cb, seen], batches=10, accum=3, epochs=3,
                metric=iter(values)).train()
        log = simulate(schedule, epochs=3, steps_per_epoch=4,
                       metrics=natural_stream(seen, values))
        assert seen.saved == log.steps("save") == [2, 4, 6, 8, 10, 12]

    @settings(max_examples=8, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(batches=st.integers(2, 5), accum=st.integers(1, 3), epochs=st.integers(1, 3),
           cadence=st.sampled_from(["schedule", "schedule+epoch", "hf-steps", "hf-epoch"]),
           k=st.integers(1, 3), m=st.integers(1, 3), mode=st.sampled_from(["min", "max"]),
           values=st.lists(st.sampled_from([0.1, 0.2, 0.3, 0.4]), min_size=40, max_size=40))
    def test_saves_equal_simulation(self, tmp_path_factory: pytest.TempPathFactory, *,
                                    batches: int, accum: int, epochs: int, cadence: str,
                                    k: int, m: int, mode: str, values: list[float]) -> None:
        """Random shapes (micro-batches, accumulation, epochs), evaluation cadences (the
        schedule's ``evaluate``, or HF's own eval_strategy by steps or epochs) and score
        streams: the saves of ``every(m steps) & improved`` (or ``every(1 epoch) &
        improved``) are simulate()'s with each score stamped at its evaluation."""
        save = every(f"{m} steps") if m < 3 else every("1 epoch")
        triggers: dict[str, Any] = {"save": save & improved("eval_score", mode=mode)}
        actions = {"save": "save"}
        strategies: dict[str, Any] = {}
        if cadence.startswith("schedule"):
            triggers = {"evaluate": every(f"{k} steps") | (every("1 epoch")
                        if cadence.endswith("epoch") else every(f"{k * 10} steps")),
                        **triggers}
            actions["evaluate"] = "evaluate"
        elif cadence == "hf-steps":
            strategies = {"eval_strategy": "steps", "eval_steps": k}
        else:
            strategies = {"eval_strategy": "epoch"}
        schedule = Schedule(triggers)
        seen = Seen()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ScheduleWarning)
            cb = ScheduleCallback(schedule, actions)
        trainer(tmp_path_factory.mktemp("hf"), [cb, seen], batches=batches, accum=accum,
                epochs=epochs, metric=iter(values), **strategies).train()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ScheduleWarning)
            log = simulate(schedule, epochs=epochs, steps_per_epoch=math.ceil(batches / accum),
                           metrics=natural_stream(seen, values))
        assert seen.saved == once_a_step(log.steps("save"))


@quiet
class TestKeep:
    """``keep=`` prunes the schedule's own saves by a retention policy; the best
    evaluated save becomes ``best_model_checkpoint``."""

    @settings(max_examples=5, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(batches=st.integers(3, 6), epochs=st.integers(1, 2), k=st.integers(1, 2),
           latest=st.integers(1, 3), grid=st.integers(2, 5),
           values=st.lists(st.sampled_from([0.1, 0.2, 0.3, 0.4]), min_size=40, max_size=40))
    def test_kept_files_are_the_policys(self, tmp_path_factory: pytest.TempPathFactory, *,
                                        batches: int, epochs: int, k: int, latest: int,
                                        grid: int, values: list[float]) -> None:
        """latest / every / best rules (any of them) over the ``"save"`` flag's
        checkpoints: after each save the output folder holds exactly what
        ``planned_files`` says the policy keeps after that firing; a folder another
        writer made there is never touched."""
        from schedtrain.retention import parse_keep
        from schedtrain.simulation.files import SaverFiles, planned_files

        keep = {"any": [{"latest": latest}, {"every": f"{grid} steps"},
                        {"best": 1, "monitor": "eval_score", "mode": "max"}]}
        schedule = Schedule({"evaluate": every(f"{k} steps"), "save": every(f"{k} steps")})
        out = tmp_path_factory.mktemp("hf")
        (out / "checkpoint-999").mkdir()  # not the schedule's
        seen = Seen()
        listed: list[list[str]] = []

        class Files(TrainerCallback):
            def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                listed.append(sorted(p.name for p in out.iterdir()
                                     if p.name != "checkpoint-999"))

        cb = ScheduleCallback(schedule, {"evaluate": "evaluate", "save": "save"}, keep=keep)
        trainer(out, [cb, seen, Files()], batches=batches, accum=1, epochs=epochs,
                metric=iter(values)).train()
        assert (out / "checkpoint-999").is_dir()
        log = simulate(schedule, epochs=epochs, steps_per_epoch=batches)
        scores = dict(zip([s for _, s, _ in seen.evaluated], values, strict=False))
        plan = planned_files(log, {"save": SaverFiles(keep=parse_keep(keep))},
                             lambda f: {"eval_score": scores[f.step]})
        want = [sorted(f"checkpoint-{int(n[5:13])}" for n in p.files) for p in plan]
        assert listed == want

    def test_best_model_is_loaded_at_end(self, tmp_path: Path) -> None:
        """metric_for_best_model + load_best_model_at_end with schedule-driven saves:
        best_model_checkpoint is the save right after the best evaluation (HF left it
        None before), it survives ``keep``, and its weights are loaded at the end."""
        values = [0.3, 0.1, 0.4, 0.2, 0.3, 0.2]  # the best, 0.4, at the third evaluation
        schedule = Schedule({"evaluate": every("1 step"), "save": every("1 step")})
        cb = ScheduleCallback(schedule, {"evaluate": "evaluate", "save": "save"}, keep=1)
        t = trainer(tmp_path, [cb], batches=6, accum=1, epochs=1, metric=iter(values),
                    metric_for_best_model="score", greater_is_better=True,
                    load_best_model_at_end=True, save_strategy="no")
        t.train()
        assert t.state.best_model_checkpoint == str(tmp_path / "checkpoint-3")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-3", "checkpoint-6"]
        last = json.loads((tmp_path / "checkpoint-6" / "trainer_state.json").read_text())
        assert last["best_model_checkpoint"] == str(tmp_path / "checkpoint-3")  # for a resume
        from safetensors.torch import load_file

        best = load_file(str(tmp_path / "checkpoint-3" / "model.safetensors"))
        here = t.model.state_dict()
        assert all(torch.equal(best[n], here[n]) for n in best if n in here)

    def test_keep_with_save_total_limit_is_refused(self, tmp_path: Path) -> None:
        """Two pruners of the same folder: refused at train start, naming the argument."""
        cb = ScheduleCallback(Schedule({"s": every("1 step")}), {"s": "save"}, keep=2)
        t = trainer(tmp_path, [cb], batches=2, accum=1, epochs=1, save_total_limit=2)
        with pytest.raises(ValueError, match=r"^TrainingArguments\(save_total_limit=2\)"):
            t.train()

    def test_keep_without_save_is_refused(self) -> None:
        """A policy with no callback bound to ``save``: refused at construction."""
        with pytest.raises(ValueError, match="bound to 'save'"):
            ScheduleCallback(Schedule({"s": every("1 step")}), {"s": "log"}, keep=2)


@quiet
def test_a_function_is_told_its_event(tmp_path: Path) -> None:
    """``fn(args, state, control, event, **kw)`` gets the event that fired it; at a
    step's batch_end HF's ``global_step`` is already one ahead of the clock's step."""
    schedule = Schedule({"f": every("2 steps") | every("1 epoch"), "b": every("2 batches")})
    told: list[tuple[str, str, int]] = []

    def tell(name: str) -> Any:
        def fn(args: Any, state: Any, control: Any, event: str, **kw: Any) -> None:
            told.append((name, event, state.global_step))
        return fn

    cb = ScheduleCallback(schedule, {"f": tell("f"), "b": tell("b")})
    trainer(tmp_path, [cb], batches=4, accum=2, epochs=2, save_strategy="no").train()
    log = simulate(schedule, epochs=2, steps_per_epoch=2, batches_per_step=2)
    want = [(f.callback, f.event, f.step + (f.event == "batch_end" and f.timestamp.batch % 2 == 0))
            for f in log]
    assert told == want
