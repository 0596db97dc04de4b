"""The lineage's callback hooks that schedtrain never calls, and what to write instead.

One table, used three ways: ``Callback.__init_subclass__`` warns (``PortingWarning``) when a
class defines one of these names, ``schedtrain check --import`` reports them for a spec's
callback classes, and docs/migrating.md quotes it (a test keeps the two equal). A name
schedtrain calls (``_before_epoch``, ``state_dict``...) is never in it. Plain data: no torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Final

import attrs

__all__ = ["LINEAGE_HOOKS", "LineageHook", "markdown_rows", "porting_message", "uncalled"]

TP, PA, PL, KS = "tensorpack", "pytorch-accelerated", "Lightning", "Keras"
PA_PL, KS_PL = "pytorch-accelerated and Lightning", "Keras and Lightning"


@attrs.frozen
class LineageHook:
    """A hook of the lineage that schedtrain never calls.

    Args:
        name: the method name (``on_train_start``).
        library: the libraries that call it, in words.
        instead: what to write in schedtrain, as a phrase.
    """

    name: str
    library: str
    instead: str
    #: For a name schedtrain *does* call (``setup``, ``on_exception``): how many arguments
    #: it passes; a definition needing more has the lineage's signature and would fail.
    passes: int | None = None

    def clashes(self, function: object) -> bool:
        """Whether ``function``, defined under this name, is the lineage's hook: any
        definition when schedtrain never calls the name, else one needing more positional
        arguments than schedtrain passes."""
        if self.passes is None:
            return True
        if not callable(function):
            return False
        try:
            params = list(inspect.signature(function).parameters.values())[1:]  # self
        except (TypeError, ValueError):
            return False
        required = [p for p in params if p.default is p.empty
                    and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return len(required) > self.passes


def _on(event: str, hook: str | None = None) -> str:
    trigger = f'the trigger `on = "{event}"` with `_trigger`'
    return f"`{hook}`, or {trigger}" if hook else trigger


_EVAL_START, _EVAL_STEP_START = _on("eval_start"), _on("eval_step_start")
_EVAL_STEP_END = _on("eval_step_end") + " (the batch in `self.trainer.payload`)"
_EVAL_END = _on("eval_end")
_TEST = ('`InferenceRunner(data=test_loader, prefix="test")` with `on = "train_end"`; its '
         "`eval_*` events")
_BEFORE_TRAIN, _AFTER_TRAIN = _on("train_start", "_before_train(self)"), \
    _on("train_end", "_after_train(self)")
_BEFORE_EPOCH = _on("epoch_start", "_before_epoch(self)")
_AFTER_EPOCH = '`_after_epoch(self)`, or the trigger `every = "1 epoch"` with `_trigger`'
_SETUP = "`_setup(self)`: once, with `self.trainer` bound"
_BEFORE_BATCH = _on("batch_start", "_before_batch(self, info)")
_AFTER_BATCH = _on("batch_end", "_after_batch(self, info)")
_SANITY = _on("sanity_eval") + " (the sanity evaluation before training)"
# Keras calls its test hooks for fit's validation too; Lightning for its test loop.
_KS_TEST_BATCH = f"for fit's validation (Keras) {_EVAL_STEP_END}; for a test: {_TEST}"
_KS_TEST_END = f"for fit's validation (Keras) {_EVAL_END}; for a test: {_TEST}"

_TABLE: Final[tuple[tuple[str, str, str], ...]] = (
    # tensorpack: the rest of its hooks (_before_train, _trigger_epoch...) are schedtrain's
    ("_setup_graph", TP, _SETUP),
    ("_before_run", TP, "`_before_step(self, step, batch)`, returning fetches `{name: fn}`"),
    ("_after_run", TP, "`_after_step(self, step, outputs)`, the fetched values in "
                       "`outputs.fetched`"),
    # pytorch-accelerated (and Lightning where both have the name)
    ("on_init_end", PA_PL, _SETUP),
    ("on_training_run_start", PA, _BEFORE_TRAIN),
    ("on_train_epoch_start", PA_PL, _BEFORE_EPOCH),
    ("on_train_step_start", PA, "`_before_step(self, step, batch)`"),
    ("on_train_step_end", PA, '`_after_step(self, step, outputs)`, or the trigger '
                              '`every = "1 step"` with `_trigger`'),
    ("on_train_epoch_end", PA_PL, _AFTER_EPOCH),
    ("on_evaluation_run_start", PA, _EVAL_START),
    ("on_eval_epoch_start", PA, _EVAL_START),
    ("on_eval_step_start", PA, _EVAL_STEP_START),
    ("on_eval_step_end", PA, _EVAL_STEP_END),
    ("on_eval_epoch_end", PA, _EVAL_END),
    ("on_evaluation_run_end", PA, _EVAL_END),
    ("on_training_run_end", PA, _AFTER_TRAIN),
    ("on_stop_training_error", PA, "`_after_train(self)`: it runs after `StopTraining` too"),
    # Lightning
    ("on_init_start", PL, _SETUP),
    ("teardown", PL, "`_after_train(self)`"),
    ("on_fit_start", PL, "`_before_train(self)`"),
    ("on_fit_end", PL, "`_after_train(self)`"),
    ("on_pretrain_routine_start", PL, "`_before_train(self)`"),
    ("on_pretrain_routine_end", PL, "`_before_train(self)`"),
    ("on_configure_sharded_model", PL, _SETUP),
    ("on_before_accelerator_backend_setup", PL, _SETUP),
    ("on_sanity_check_start", PL, _SANITY),
    ("on_sanity_check_end", PL, _SANITY),
    ("on_train_start", PL, _BEFORE_TRAIN),
    ("on_train_end", KS_PL, _AFTER_TRAIN),
    ("on_epoch_start", PL, _BEFORE_EPOCH),
    ("on_epoch_end", KS_PL, _AFTER_EPOCH),
    ("on_train_batch_start", PL, _BEFORE_BATCH),
    ("on_batch_start", PL, _BEFORE_BATCH),
    ("on_train_batch_end", KS_PL, _AFTER_BATCH),
    ("on_batch_end", KS_PL, _AFTER_BATCH),
    ("on_before_backward", PL, "`_before_backward(self, info)`"),
    ("on_after_backward", PL, "`_after_backward(self, step)`: the step's gradients, as "
                              "accumulated"),
    ("on_before_optimizer_step", PL, "`_before_optimizer_step(self, step)`: gradients "
                                     "unscaled, before clipping"),
    ("on_before_zero_grad", PL, "`_after_step(self, step, outputs)` (read gradients in "
                                "`_before_optimizer_step`: they are cleared by then)"),
    ("on_validation_start", PL, _EVAL_START),
    ("on_validation_epoch_start", PL, _EVAL_START),
    ("on_validation_batch_start", PL, _EVAL_STEP_START),
    ("on_validation_batch_end", PL, _EVAL_STEP_END),
    ("on_validation_epoch_end", PL, _EVAL_END),
    ("on_validation_end", PL, _EVAL_END),
    *((f"on_{loop}_{when}", PL, _TEST) for loop in ("test", "predict")
      for when in ("start", "epoch_start", "batch_start", "epoch_end")),
    ("on_test_batch_end", KS_PL, _KS_TEST_BATCH),
    ("on_test_end", KS_PL, _KS_TEST_END),
    ("on_predict_batch_end", KS_PL, _TEST),
    ("on_predict_end", KS_PL, _TEST),
    ("on_keyboard_interrupt", PL, '`_on_exception(self, exc)`, or the trigger '
                                  '`on = "preempt"` with `_trigger`'),
    ("on_save_checkpoint", PL, "`state_dict(self)`, returning plain data"),
    ("on_load_checkpoint", PL, "`load_state_dict(self, state)`"),
    # Keras (its other hooks are Lightning's names, above)
    ("on_train_begin", KS, _BEFORE_TRAIN),
    ("on_epoch_begin", KS, _BEFORE_EPOCH),
    ("on_train_batch_begin", KS, _BEFORE_BATCH),
    ("on_batch_begin", KS, _BEFORE_BATCH),
    ("on_test_begin", KS, _EVAL_START + " (Keras calls it for fit's validation)"),
    ("on_test_batch_begin", KS, _EVAL_STEP_START + " (Keras calls it for fit's validation)"),
    ("on_predict_begin", KS, _TEST),
    ("on_predict_batch_begin", KS, _TEST),
)

#: Names schedtrain calls with fewer arguments than Lightning: (name, arguments passed,
#: what to write).
_CALLED: Final[tuple[tuple[str, int, str], ...]] = (
    ("setup", 1, "`_setup(self)` (schedtrain calls `setup(trainer)` to bind the callback)"),
    ("on_exception", 1, "`_on_exception(self, exc)` (schedtrain calls `on_exception(exc)`)"),
)

#: Hook name -> what it is and what to write instead, in the order above.
LINEAGE_HOOKS: Final[Mapping[str, LineageHook]] = {
    **{name: LineageHook(name, library, instead) for name, library, instead in _TABLE},
    **{name: LineageHook(name, PL, instead, passes) for name, passes, instead in _CALLED}}


def porting_message(class_name: str, hook: LineageHook) -> str:
    """One line: the class, the hook and its library, and what to write instead."""
    article = "an" if hook.library[0] in "aeiou" else "a"
    instead = hook.instead.replace("`", "")
    if hook.passes is not None:
        return (f"{class_name} defines {hook.name} with {hook.library}'s arguments, which "
                f"schedtrain does not pass: write {instead}")
    return (f"{class_name} defines {hook.name}, {article} {hook.library} hook that "
            f"schedtrain never calls: write {instead}")


def uncalled(classes: Iterable[type]) -> list[LineageHook]:
    """The lineage hooks defined in ``classes``' own bodies (the first definition of each
    name counts), each once, in table order."""
    found: dict[str, object] = {}
    for klass in classes:
        for name, value in vars(klass).items():
            found.setdefault(name, value)
    return [h for name, h in LINEAGE_HOOKS.items() if name in found and h.clashes(found[name])]


def markdown_rows() -> list[str]:
    """The table as docs/migrating.md quotes it, one row a hook."""
    return [f"| `{h.name}` | {h.library} | {h.instead}"
            f"{'; only when defined with its arguments' if h.passes is not None else ''} |"
            for h in LINEAGE_HOOKS.values()]
