"""HF's control flags and its own cadence: which flags a schedule callback may be bound to,
and a bound ``"evaluate"``, ``"save"`` or ``"log"`` replacing ``eval_strategy``,
``save_strategy`` or ``logging_strategy``, as Lightning's callback switches Lightning's
validation cadence off."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import TrainerState, TrainingArguments

from schedtrain.integrations.driver import refuse_unknown_actions
from schedtrain.schedule.schedule import Schedule

__all__ = ["FLAGS", "STRATEGIES", "check_flag_bindings", "mark_best", "switch_off_strategies"]

#: The control flags a callback of the schedule may be bound to.
FLAGS = {"evaluate": "should_evaluate", "save": "should_save", "log": "should_log",
         "stop": "should_training_stop"}
#: The TrainingArguments whose cadence a bound flag replaces.
STRATEGIES = {"evaluate": "eval_strategy", "save": "save_strategy", "log": "logging_strategy"}


def switch_off_strategies(args: TrainingArguments, flags: set[str]) -> None:
    """Set HF's own cadence for each bound flag to ``"no"``: one at its default (HF's
    ``save_strategy="steps"`` saves every 500 steps and at the end); one set to another
    value is refused, naming it (it would evaluate or save besides the schedule)."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    for flag in sorted(flags & set(STRATEGIES)):
        arg = STRATEGIES[flag]
        value = getattr(args, arg)
        text = str(getattr(value, "value", value))
        if text == "no":
            continue
        if text != str(getattr(defaults[arg], "value", defaults[arg])):
            raise ValueError(
                f"TrainingArguments({arg}={text!r}) makes the Trainer {flag} on its own "
                f"cadence, and the schedule binds {flag!r} too: set {arg}=\"no\" and let "
                f"the schedule decide (or bind {flag!r} to nothing)")
        setattr(args, arg, type(value)("no") if not isinstance(value, str) else "no")


def check_flag_bindings(schedule: Schedule, actions: Mapping[str, Any]) -> None:
    """Refuse an action that names no callback, an unknown flag, or a flag bound where the
    Trainer does not act on it, each in one line saying what to do instead."""
    refuse_unknown_actions(schedule.names, actions)
    for name, action in actions.items():
        if isinstance(action, str):
            if action not in FLAGS:
                raise ValueError(f"actions[{name!r}]: unknown flag {action!r}; expected a "
                                 f"function or one of {sorted(FLAGS)}")
            events = schedule[name].events()
            wrong = sorted(e for e in ("train_start", "epoch_start", "train_end",
                                       "batch_end") if e in events)
            if wrong:
                raise ValueError(
                    f"actions[{name!r}] = {action!r} sets control.{FLAGS[action]}, which "
                    f"the Trainer acts on only after step_end and epoch_end; the trigger "
                    f"{schedule[name]!r} can also fire at {wrong}: drop those parts (the "
                    "last epoch's end is where training ends, so every('1 epoch') covers "
                    "it), or bind a function fn(args, state, control, **kw) that acts "
                    "there itself (kw['model'].save_pretrained(args.output_dir))")
        elif not callable(action):
            raise TypeError(f"actions[{name!r}] must be a function or one of "
                            f"{sorted(FLAGS)}, got {action!r}")


def mark_best(args: TrainingArguments, state: TrainerState) -> None:
    """The save at this step holds the weights evaluated best so far: HF's
    ``load_best_model_at_end`` loads it (set before HF writes trainer_state.json)."""
    state.best_global_step = state.global_step
    state.best_model_checkpoint = str(Path(args.output_dir or "")
                                      / f"checkpoint-{state.global_step}")
