"""HF's own cadence flags and the schedule's: a bound ``"evaluate"``, ``"save"`` or ``"log"``
replaces ``eval_strategy``, ``save_strategy`` or ``logging_strategy``, as Lightning's
callback switches Lightning's validation cadence off."""

from __future__ import annotations

import dataclasses

from transformers import TrainingArguments

__all__ = ["STRATEGIES", "switch_off_strategies"]

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
