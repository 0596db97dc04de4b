"""Every host binds every callback of its schedule: a spec's typed callbacks are built by
``from_spec`` (as ``schedtrain train`` builds them), a callback with neither a type nor an
action is refused in one line naming it, and a trigger on a counter the host is not given
(samples, tokens) is refused saying what to pass."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("lightning")
pytest.importorskip("ignite")
pytest.importorskip("transformers")
import lightning.pytorch as pl
import torch
from ignite.engine import Engine
from torch.utils.data import DataLoader
from transformers import TrainerControl, TrainerState, TrainingArguments

from schedtrain import Schedule, ScheduleWarning, at, every, on, window
from schedtrain.callbacks import EarlyStopping
from schedtrain.integrations import ignite as ig
from schedtrain.integrations import lightning as li
from schedtrain.integrations import transformers as hf
from schedtrain.integrations.hosted import CallbackDriver
from schedtrain.spec import load_spec, loads_spec

for _name in ("lightning", "lightning.pytorch", "lightning.fabric"):
    logging.getLogger(_name).setLevel(logging.ERROR)
quiet = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

SPEC = """
[callbacks.mark]
trigger = { every = "3 steps" }

[callbacks.stop]
type = "EarlyStopping"
monitor = "c"
patience = 2
trigger = { every = "2 steps" }
"""


def engine() -> Engine:
    return Engine(lambda e, b: 0.0)


def lightning(schedule: Schedule, actions: dict[str, Any], **kw: Any) -> object:
    return li.ScheduleCallback(schedule, {n: (lambda t, m: None) for n in actions}, **kw)


def transformers(schedule: Schedule, actions: dict[str, Any], **kw: Any) -> object:
    return hf.ScheduleCallback(schedule, {n: (lambda *a, **k: None) for n in actions}, **kw)


def ignite(schedule: Schedule, actions: dict[str, Any], **kw: Any) -> object:
    return ig.attach_schedule(engine(), schedule, {n: (lambda e: None) for n in actions}, **kw)


HOSTS = [lightning, transformers, ignite]


class TestUnboundRefused:
    """A schedule callback that nothing runs is refused, by every host."""

    @settings(max_examples=30, deadline=None)
    @given(names=st.lists(st.sampled_from("abcde"), min_size=1, max_size=5, unique=True),
           data=st.data(), host=st.sampled_from(HOSTS))
    def test_refused_iff_one_is_unbound(self, names: list[str], data: st.DataObject,
                                        host: Any) -> None:
        """Bound any subset of the callbacks: refused exactly when one is left, in one
        line naming every one left (in declared order); ``record=True`` keeps them."""
        bound = data.draw(st.lists(st.sampled_from(names), unique=True), label="bound")
        schedule = Schedule({n: every(f"{i + 1} steps") for i, n in enumerate(names)})
        loose = [n for n in names if n not in bound]
        if loose:
            with pytest.raises(ValueError) as caught:
                host(schedule, dict.fromkeys(bound))
            message = str(caught.value)
            assert "\n" not in message
            assert f"schedule callbacks {loose} have neither a type nor an action" in message
        else:
            host(schedule, dict.fromkeys(bound))
        host(schedule, dict.fromkeys(bound), record=True)

    def test_a_spec_schedule_with_its_typed_callback_left_out(self) -> None:
        """D3: ``load_spec(...).schedule()`` passed as it is drops the typed callback:
        refused, naming it and the way (``from_spec``)."""
        schedule = loads_spec(SPEC).schedule()
        with pytest.raises(ValueError, match=r"\['stop'\] have neither a type nor an action"
                                             r".*from_spec\(spec, actions\)"):
            li.ScheduleCallback(schedule, {"mark": lambda t, m: None})


class TestFromSpec:
    """``from_spec`` builds the spec's typed callbacks and binds the others to actions."""

    @quiet
    def test_lightning_early_stopping_from_toml(self, tmp_path: Path) -> None:
        """The TOML's ``EarlyStopping`` runs inside the fit and stops it (a constant ``c``:
        best at step 2, no better at 4 and 6); the untyped one runs its action."""
        path = tmp_path / "typed.toml"
        path.write_text(SPEC)
        marks: list[int] = []

        class Module(pl.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.layer = torch.nn.Linear(3, 1)

            def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
                self.log("c", 1.0, on_step=True)
                return self.layer(batch).pow(2).mean()

            def configure_optimizers(self) -> torch.optim.Optimizer:
                return torch.optim.SGD(self.parameters(), lr=0.01)

        cb = li.ScheduleCallback.from_spec(
            path, {"mark": lambda trainer, module: marks.append(trainer.global_step)})
        fit = pl.Trainer(max_epochs=5, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, accelerator="cpu", callbacks=[cb])
        fit.fit(Module(), DataLoader(torch.zeros(8, 3), batch_size=2))
        assert fit.global_step == 6
        assert marks == [3, 6]

    def test_every_host_builds_the_typed_callback(self, tmp_path: Path) -> None:
        """HF, Ignite and the own-loop driver build it from the spec or its path."""
        path = tmp_path / "typed.toml"
        path.write_text(SPEC)
        spec = load_spec(path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ScheduleWarning)
            built = [
                hf.ScheduleCallback.from_spec(spec, {"mark": "log"}).driver,
                ig.attach_spec(engine(), path, {"mark": lambda e: None}).driver,
                CallbackDriver.from_spec(spec, {"mark": lambda: None}),
            ]
        for driver in built:
            assert isinstance(driver, CallbackDriver)
            stop = driver.callbacks["stop"]
            assert isinstance(stop, EarlyStopping)
            assert (stop.monitor, stop.patience) == ("c", 2)

    def test_own_loop_driver_stops(self) -> None:
        """The driver built from a spec runs the typed callback: ``stop_reason`` is set
        after step 6 on a constant metric."""
        marks: list[int] = []
        driver = CallbackDriver.from_spec(loads_spec(SPEC),
                                          {"mark": lambda: marks.append(driver.now.step)})
        driver.train_start()
        driver.epoch_start()
        while driver.stop_reason is None and driver.now.step < 20:
            driver.put("c", 1.0)
            driver.step()
        assert driver.now.step == 6 and marks == [3, 6]

    def test_actions_binding_a_typed_callback_refused(self) -> None:
        """An action for a callback the spec builds from its type is refused, by name."""
        with pytest.raises(ValueError, match=r"actions bind \['stop'\], which the spec "
                                             "builds from their `type`"):
            li.ScheduleCallback.from_spec(loads_spec(SPEC), {"mark": lambda t, m: None,
                                                             "stop": "stop"})


SAMPLE_TRIGGERS = [every("64 samples"), every("2 steps") & window(start="8 samples"),
                   at("100 samples") | every("1 epoch")]
TOKEN_TRIGGERS = [every("96 tokens"), every("1 epoch") & window(stop="500 tokens")]


class TestUncountedRefused:
    """D6: a trigger on a counter the host is not given is refused, saying what to do."""

    @pytest.mark.parametrize("trigger", SAMPLE_TRIGGERS, ids=repr)
    def test_hf_samples_at_construction(self, trigger: Any) -> None:
        with pytest.raises(ValueError, match=r"callback 's': its trigger .* counts samples, "
                                             "which the HF Trainer does not count"):
            hf.ScheduleCallback(Schedule({"s": trigger}), {"s": "log"})

    @pytest.mark.parametrize("trigger", TOKEN_TRIGGERS, ids=repr)
    @pytest.mark.parametrize("flag", [False, True])
    def test_hf_tokens_at_train_begin(self, trigger: Any, flag: bool, tmp_path: Path) -> None:
        """Accepted at construction; at on_train_begin refused unless the Trainer counts
        tokens (``include_num_input_tokens_seen``)."""
        cb = hf.ScheduleCallback(Schedule({"t": trigger}), {"t": "log"})
        args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none",
                                 include_num_input_tokens_seen=flag)
        begin = lambda: cb.on_train_begin(args, TrainerState(), TrainerControl())  # noqa: E731
        if flag:
            begin()
        else:
            with pytest.raises(ValueError, match=r"callback 't': its trigger counts tokens, "
                                                 r".*include_num_input_tokens_seen=True"):
                begin()

    @pytest.mark.parametrize(("counter", "trigger"),
                             [("sample", t) for t in SAMPLE_TRIGGERS]
                             + [("token", t) for t in TOKEN_TRIGGERS])
    def test_lightning_and_ignite_counters(self, counter: str, trigger: Any) -> None:
        """Without ``samples=``/``tokens=`` refused, naming the argument; with it accepted."""
        schedule = Schedule({"c": trigger})
        message = rf"counts {counter}s, which nothing counts: pass {counter}s="
        given = {f"{counter}s": len}
        with pytest.raises(ValueError, match=message):
            li.ScheduleCallback(schedule, {"c": lambda t, m: None}, **{f"{counter}s": None})
        li.ScheduleCallback(schedule, {"c": lambda t, m: None}, **given)
        with pytest.raises(ValueError, match=message):
            ig.attach_schedule(engine(), schedule, {"c": lambda e: None})
        ig.attach_schedule(engine(), schedule, {"c": lambda e: None}, **given)
        with pytest.raises(ValueError, match=message):
            ig.trigger_event(trigger)
        ig.trigger_event(trigger, **given)


class TestHFFlagRefusalSaysWhatToDo:
    """D16: a flag bound to a trigger that can fire where the Trainer does not act on it
    is refused, saying what to do instead."""

    @pytest.mark.parametrize("flag", sorted(hf.FLAGS))
    def test_train_end(self, flag: str) -> None:
        with pytest.raises(ValueError, match=r"can also fire at \['train_end'\]: drop those "
                                             r"parts .*every\('1 epoch'\) covers it\), or "
                                             r"bind a function fn\(args, state, control"):
            hf.ScheduleCallback(Schedule({"s": every("1 epoch") | on("train_end")}),
                                {"s": flag})
