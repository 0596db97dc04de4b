"""TOML schedules: read -> validate -> build, and write back.

A spec file mirrors DESIGN §5::

    [clock]                      # the run's shape, for `plan` and simulation
    epochs = 10
    steps_per_epoch = 100

    [triggers.after_warmup]      # a named trigger, referenced by its name
    every = "1 epoch"
    start = "2 epochs"

    [callbacks.validate]
    type = "InferenceRunner"     # a built-in name or "package.module:Class"
    trigger = { any = ["after_warmup", { on = "train_end" }] }

``load_spec`` reads the TOML (``spec.document``), validates every table and builds
the triggers with the key path each was written at (``spec.triggers``,
``spec.callbacks``, one vocabulary in ``spec.vocabulary``), then runs the static
checks once (``spec.load``). Every problem is raised at once as a ``SpecError``.
This package never imports torch, nor anything a spec names unless asked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from schedtrain.lazy import LazyNames

#: Public name -> the module that defines it: loaded on first use (PEP 562), so a module
#: that needs one part of the spec (the trainer reads ``spec.failures``) does not import
#: the loader and every checker.
_EXPORTS: Final = {
    "load_spec": "schedtrain.spec.load",
    "loads_spec": "schedtrain.spec.load",
    "CallbackSpec": "schedtrain.spec.model",
    "ClockSpec": "schedtrain.spec.model",
    "Spec": "schedtrain.spec.model",
    "RunConfig": "schedtrain.spec.run",
    "TRIGGER_KEYS": "schedtrain.spec.vocabulary",
    "dump_spec": "schedtrain.spec.write",
    "schedule_to_toml": "schedtrain.spec.write",
    "toml_value": "schedtrain.spec.write",
    "trigger_to_toml": "schedtrain.spec.write",
}  # fmt: skip

__all__ = [
    "TRIGGER_KEYS", "CallbackSpec", "ClockSpec", "RunConfig", "Spec", "dump_spec", "load_spec",
    "loads_spec", "schedule_to_toml", "toml_value", "trigger_to_toml",
]  # fmt: skip


def _old_name(name: str) -> object:
    if name == "RunSpec":  # the old name of RunConfig: it warns (spec.model)
        from schedtrain.spec import model

        return model.__getattr__(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_NAMES = LazyNames(__name__, globals(), _EXPORTS, other=_old_name)
__getattr__ = _NAMES.load
__dir__ = _NAMES.names


if TYPE_CHECKING:  # what static tools see; at run time the names load on first use
    from schedtrain.spec.load import load_spec as load_spec
    from schedtrain.spec.load import loads_spec as loads_spec
    from schedtrain.spec.model import CallbackSpec as CallbackSpec
    from schedtrain.spec.model import ClockSpec as ClockSpec
    from schedtrain.spec.model import Spec as Spec
    from schedtrain.spec.run import RunConfig as RunConfig
    from schedtrain.spec.vocabulary import TRIGGER_KEYS as TRIGGER_KEYS
    from schedtrain.spec.write import dump_spec as dump_spec
    from schedtrain.spec.write import schedule_to_toml as schedule_to_toml
    from schedtrain.spec.write import toml_value as toml_value
    from schedtrain.spec.write import trigger_to_toml as trigger_to_toml
