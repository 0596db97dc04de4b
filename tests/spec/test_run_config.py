"""One ``RunConfig`` for a run's options: ``[run]``'s keys and ``Trainer``'s keywords are
its fields, and one rule set refuses a bad value from either side with the same words."""

from __future__ import annotations

import inspect
import math
from typing import Any

import attrs
import pytest
import torch
from config_helpers import python_problem as _python_problem
from config_helpers import toml_problem as _toml_problem
from hypothesis import given
from hypothesis import strategies as st

from schedtrain.checkpoints import Checkpoints
from schedtrain.errors import ArgumentError, SpecError
from schedtrain.spec import dump_spec, loads_spec
from schedtrain.spec.run import PYTHON_ONLY, CheckpointOptions, RunConfig
from schedtrain.training import Trainer

#: ``Trainer`` arguments that are the user's runtime objects, not options (``sinks`` are
#: sink objects there; ``[run] sinks`` names them).
RUNTIME_OBJECTS = {"model", "optimizer", "train_data", "loss_fn", "step_fn", "callbacks",
                   "schedule", "bindings", "val_data", "sinks", "predicates", "clock", "config",
                   "prepared"}
#: ``[run]`` keys that only ``schedtrain train`` reads (the task, the sinks by name).
SPEC_ONLY = {"task", "sinks", "sink_every"}


def test_trainer_keywords_are_the_config_fields() -> None:
    """Every option ``Trainer`` takes is a ``RunConfig`` field and every field but the
    spec-only ones is a keyword: a new option is one field, taken by both."""
    keywords = set(inspect.signature(Trainer.__init__).parameters) - {"self"}
    fields = {a.name for a in attrs.fields(RunConfig)}
    assert keywords - RUNTIME_OBJECTS == fields - SPEC_ONLY


#: key, the bad value in TOML, the same in Python.
BAD = [
    ("max_epochs", "0", 0), ("max_steps", "-1", -1), ("grad_accum", "0", 0),
    ("max_epochs", "true", True), ("precision", '"fp64"', "fp64"), ("grad_clip", "0.0", 0.0),
    ("grad_clip", "nan", math.nan), ("grad_clip", "inf", math.inf),
    ("device", '"tpu"', "tpu"), ("seed", "-1", -1), ("seed", "9223372036854775808", 2**63),
    ("strategy", '"horovod"', "horovod"), ("shard_data", '"yes"', "yes"),
    ("reduce", '{ "val/loss" = "median" }', {"val/loss": "median"}),
    ("sanity_eval_batches", "-1", -1), ("checkpoint_mode", '"later"', "later"),
    ("checkpoint_busy", '"queue"', "queue"), ("checkpoint_staging", '"pinned"', "pinned"),
    ("checkpoint_write_share", "1.5", 1.5), ("checkpoint_write_share", '"half"', "half"),
    ("export", '["onnx"]', ["onnx"]), ("export", '["safetensors", "safetensors"]',
                                       ["safetensors", "safetensors"]),
    ("deadline", '"soon"', "soon"), ("preempt_signals", '["SIGFOO"]', ["SIGFOO"]),
    ("storage_options", "{ anon = true }", {"anon": True}),
    ("checkpoint_dir", '""', ""),
]


@pytest.mark.parametrize(("key", "toml_value", "value"), BAD)
def test_a_bad_option_gets_the_same_words_from_toml_and_python(
        key: str, toml_value: str, value: Any) -> None:
    """The same bad value is refused by ``[run]`` (at its key path) and by ``Trainer``
    (naming the keyword), with the same message: one rule set."""
    toml = _toml_problem(key, toml_value)
    python = _python_problem(key, value)
    assert toml is not None
    assert python == toml


#: ``BAD``'s values of the right type and out of range (a wrong type is the converter's to
#: refuse: ``run_config`` and the spec reader).
OUT_OF_RANGE = [(k, v) for k, _, v in BAD
                if not (v is True or k == "shard_data" or (k, v) == ("checkpoint_write_share",
                                                                    "half"))]


@pytest.mark.parametrize(("key", "value"), OUT_OF_RANGE)
def test_a_run_config_is_checked_when_built(key: str, value: Any) -> None:
    """``RunConfig(...)`` and ``attrs.evolve`` refuse a bad value with ``Trainer``'s words:
    a ``RunConfig`` that exists keeps the rules, so nothing checks it again."""
    expected = _python_problem(key, value)
    with pytest.raises(ArgumentError) as made:
        RunConfig(**{"max_epochs": 1, key: value})
    with pytest.raises(ArgumentError) as evolved:
        attrs.evolve(RunConfig(max_epochs=1), **{key: value})
    assert str(made.value) == str(evolved.value) == expected


@given(st.fixed_dictionaries({
    "checkpoint_mode": st.sampled_from(["async", "sync"]),
    "checkpoint_busy": st.sampled_from(["wait", "skip"]),
    "checkpoint_staging": st.sampled_from(["reuse", "fresh"]),
    "checkpoint_write_share": st.none() | st.floats(0.01, 1.0),
    "export": st.sampled_from([(), ("safetensors",)]),
    "run_dir": st.none() | st.sampled_from(["r", "runs/x"]),
    "checkpoint_dir": st.none() | st.sampled_from(["ckpts", "memory://bucket/c"])}))
def test_the_checkpoint_section_is_the_flat_keys(options: dict[str, Any]) -> None:
    """``Checkpoints`` takes its section, ``config.checkpoint_options``: each of its fields
    is the flat ``[run]`` key of the same name (``run_dir`` as a path), so the TOML keys
    stay flat and the owner reads nothing else of the run's options."""
    config = RunConfig(**options)
    section = config.checkpoint_options
    fields = {a.name for a in attrs.fields(CheckpointOptions)}
    assert {k: getattr(section, k) for k in fields - {"run_dir"}} == {
        k: getattr(config, k) for k in fields - {"run_dir"}}
    assert section.run_dir == config.run_path
    params = list(inspect.signature(Checkpoints).parameters.values())
    assert params[1].annotation in ("CheckpointOptions", CheckpointOptions)


@pytest.mark.parametrize("key", sorted(PYTHON_ONLY))
def test_python_only_options_are_not_run_keys(key: str) -> None:
    """``overwrite``, ``handle_signals``... are refused in ``[run]`` with what to do."""
    with pytest.raises(SpecError, match=f"run.{key}: '{key}' is not a \\[run\\] key"):
        loads_spec(f'[run]\n{key} = true\n[callbacks.a]\ntrigger = {{ every = "1 step" }}\n')


def test_a_spec_writes_back_without_python_only_options() -> None:
    """``dump_spec`` writes ``[run]``'s keys only, so its text loads again."""
    spec = loads_spec('[run]\ntask = "m:f"\nmax_epochs = 2\n'
                      '[callbacks.a]\ntrigger = { every = "1 step" }\n')
    text = dump_spec(spec)
    assert not any(f"{key} =" in text for key in PYTHON_ONLY)
    assert loads_spec(text).run == spec.run


def _tiny(**kw: Any) -> Trainer:
    model = torch.nn.Linear(1, 1)
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                   [(torch.zeros(1, 1), torch.zeros(1, 1))], torch.nn.functional.mse_loss,
                   **kw)


def test_trainer_takes_a_config() -> None:
    """``Trainer(config=RunConfig(...))`` runs as the same keywords would, and
    ``trainer.config`` is what it runs with."""
    config = RunConfig(max_epochs=2, device="cpu", grad_clip=1.0, handle_signals=False)
    by_config, by_keywords = _tiny(config=config), _tiny(max_epochs=2, device="cpu",
                                                          grad_clip=1.0, handle_signals=False)
    assert by_config.config == by_keywords.config == config
    by_config.fit()
    assert by_config.clock.step == 2


def test_a_config_is_checked_and_not_mixed_with_keywords() -> None:
    """A ``RunConfig`` made directly is checked by the same rules; options given both in
    ``config`` and as keywords are refused, naming them."""
    with pytest.raises(ValueError, match="`grad_accum`: expected a whole number >= 1"):
        _tiny(config=RunConfig(max_epochs=1, grad_accum=0))
    with pytest.raises(TypeError, match="not both: max_steps"):
        _tiny(config=RunConfig(max_epochs=1), max_steps=3)


def test_run_spec_is_an_alias_that_warns() -> None:
    """The old name keeps working for one minor version, with a warning."""
    import schedtrain.spec

    with pytest.warns(DeprecationWarning, match="RunConfig"):
        assert schedtrain.spec.RunSpec is RunConfig  # type: ignore[attr-defined]
