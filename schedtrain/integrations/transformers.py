"""The schedule in the Hugging Face ``Trainer``: a ``TrainerCallback`` that sets
``TrainerControl``'s flags from a schedtrain ``Schedule``.

HF's counters map to schedtrain's clock so (docs/integrations.md)::

    step   = state.global_step          optimizer steps (on_step_end runs after the
                                        optimizer step and global_step += 1)
    batch  = on_substep_end + on_step_end calls: each micro-batch of gradient accumulation
    epoch  = epochs completed (on_epoch_end of an epoch that ran all its steps)
    token  = state.num_input_tokens_seen (needs include_num_input_tokens_seen)
    sample = not counted (stays 0): no callback sees the batch; use steps or tokens

Events: on_train_begin -> train_start, on_epoch_begin -> epoch_start, on_substep_end ->
batch_end, on_step_end -> batch_end + step_end, on_epoch_end -> epoch_end (not for an
epoch cut by max_steps or a stop), on_train_end -> train_end.

Each callback of the schedule is bound to a function ``fn(args, state, control, **kw)``
or to a flag: ``"evaluate"``, ``"save"``, ``"log"``, ``"stop"`` (``should_evaluate``,
``should_save``, ``should_log``, ``should_training_stop``), which the Trainer acts on right
after on_step_end and on_epoch_end: so a flag's trigger may fire only at step_end and
epoch_end. Turn HF's own cadence off (``eval_strategy``, ``save_strategy``,
``logging_strategy`` = ``"no"``) and the schedule decides. Metrics the schedule reads come
from ``on_log`` and ``on_evaluate``: a value logged after step ``s`` is seen from step
``s + 1`` (and at the end of the epoch when ``s`` was its last step). The schedule's state
is kept in ``trainer_state.json`` through ``ExportableState`` and restored when training
resumes from a checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_callback import ExportableState
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("schedtrain.integrations.transformers needs transformers: "
                      "pip install 'schedtrain[transformers]'") from exc

from schedtrain.integrations.context import HostError
from schedtrain.integrations.hosted import (
    CallbackDriver,
    check_bound,
    counters_read,
    driver_for,
    refuse_uncounted,
    spec_bindings,
    split_actions,
)
from schedtrain.schedule.schedule import Schedule
from schedtrain.triggers.protocol import Predicate

if TYPE_CHECKING:
    from schedtrain.spec import Spec

__all__ = ["FLAGS", "ScheduleCallback"]

#: The control flags a callback of the schedule may be bound to.
FLAGS = {"evaluate": "should_evaluate", "save": "should_save", "log": "should_log",
         "stop": "should_training_stop"}
_ACTED_ON = ("step_end", "epoch_end")


def _check_bindings(schedule: Schedule, actions: Mapping[str, Any]) -> None:
    unknown = sorted(set(actions) - set(schedule.names))
    if unknown:
        raise ValueError(f"actions name callbacks that are not in the schedule: {unknown} "
                         f"(the schedule has {list(schedule.names)})")
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


class ScheduleCallback(TrainerCallback, ExportableState):
    """Fire ``schedule`` inside ``transformers.Trainer.train``.

    Args:
        schedule: the schedule (Python, or ``load_spec(path).schedule()``).
        actions: callback name -> a flag of ``FLAGS``, ``fn(args, state, control, **kw)``,
            or a schedtrain ``Callback`` (it sees the Trainer's model and optimizer, and
            stops training through ``should_training_stop``; its state must be JSON data,
            as ``trainer_state.json`` keeps it).
        predicates: predicates registered by name for ``when(name)`` conditions.
        time_source: monotonic nanoseconds for time triggers (tests pass a fake one).
        record: keep every firing in ``firings``.
    """

    def __init__(
        self,
        schedule: Schedule | None = None,
        actions: Mapping[str, str | Callable[..., Any]] | None = None,
        *,
        predicates: Mapping[str, Predicate] | None = None,
        time_source: Callable[[], int] = perf_counter_ns,
        record: bool = False,
    ) -> None:
        if not isinstance(schedule, Schedule):
            raise TypeError(
                f"ScheduleCallback needs a schedtrain Schedule, got {schedule!r}; with "
                "restore_callback_states_from_checkpoint=True the Trainer rebuilds callbacks "
                "from saved arguments, which a schedule cannot be: leave it False, this "
                "callback restores its own state when training resumes")
        self.actions, callbacks = split_actions(actions)
        _check_bindings(schedule, self.actions)
        check_bound(schedule, [*self.actions, *callbacks], record=record)
        refuse_uncounted(schedule, "sample", "the HF Trainer does not count (no callback "
                         "sees the batch): count steps or tokens instead")
        #: the callback whose trigger counts tokens (checked against the Trainer's args)
        self._counts_tokens = counters_read(schedule).get("token")
        # On several processes the Trainer gathers what it logs and evaluates (and
        # num_input_tokens_seen) over the ranks itself: the driver takes them as they are
        # (a collective runs only where a trigger reads time).
        self.driver = driver_for(
            schedule, {n: self._bound(n) for n in self.actions}, callbacks,
            host="the HF Trainer", predicates=predicates, time_source=time_source,
            record=record, global_counts=True, reduce="host")
        #: the driver, when it runs schedtrain callbacks
        self._hosted = self.driver if isinstance(self.driver, CallbackDriver) else None
        self._watched = self.driver.metric_names
        self._hook: tuple[TrainingArguments, TrainerState, TrainerControl, dict[str, Any]] | None
        self._hook = None

    @classmethod
    def from_spec(cls, spec: Spec | str | Path,
                  actions: Mapping[str, str | Callable[..., Any] | Any] | None = None,
                  **kwargs: Any) -> ScheduleCallback:
        """The callback for a spec (or its path): its typed callbacks (``type =
        "EarlyStopping"``) built as ``schedtrain train`` builds them, ``actions`` binding
        the others; ``kwargs`` as the constructor's."""
        schedule, bound = spec_bindings(spec, actions)
        return cls(schedule, bound, **kwargs)

    def _bound(self, name: str) -> Callable[[], None]:
        return lambda: self._act(name)

    @property
    def firings(self) -> list[Any]:
        """What fired, with the clock's counters (with ``record=True``)."""
        return self.driver.firings

    # -- the Trainer's events ----------------------------------------------------------------
    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        name = self._counts_tokens
        if name is not None and args.include_num_input_tokens_seen in ("no", False):
            raise ValueError(
                f"callback {name!r}: its trigger counts tokens, which the HF Trainer counts "
                "only with TrainingArguments(include_num_input_tokens_seen=True)")
        stored: Any = state.stateful_callbacks or {}  # typed as a list, loaded as a dict
        saved = stored.get(type(self).__name__)
        if isinstance(saved, list):
            saved = saved[0] if saved else None
        mine = (saved or {}).get("attributes", {}).get("schedule_state")
        if state.global_step > 0 and mine is not None:  # resuming from a checkpoint
            self.driver.load_state_dict(mine)
        if self._hosted is not None:
            loader = kwargs.get("train_dataloader")
            accumulate = max(int(args.gradient_accumulation_steps), 1)
            batches = len(loader) if loader is not None and hasattr(loader, "__len__") else None
            self._hosted.context.bind(
                model=kwargs.get("model"), optimizer=kwargs.get("optimizer"),
                precision="bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
                rank=args.process_index,
                steps_in_epoch=None if batches is None else -(-batches // accumulate))
        self._event(args, state, control, kwargs, self.driver.train_start)

    def on_epoch_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        self._event(args, state, control, kwargs, lambda: self._catch_up(state))

    def _ran_out(self, state: TrainerState) -> bool:
        """Whether the epoch after the clock's has run all its steps: ``state.epoch`` is
        epoch + (micro-batches run) / (micro-batches in the epoch), whole only then (not
        for an epoch cut by max_steps or a stop)."""
        epoch = float(state.epoch or 0)
        return epoch.is_integer() and int(epoch) > self.driver.clock.epoch

    def _catch_up(self, state: TrainerState) -> tuple[str, ...]:
        """Start the epoch. Resumed from a checkpoint of an epoch's last step (saved before
        its on_epoch_end), HF starts the next epoch: the saved one ends first, as it did
        in the uninterrupted run."""
        d = self.driver
        late = d.epoch_end() if d.in_epoch and self._ran_out(state) else ()
        return late + d.epoch_start()

    def on_substep_end(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        self._event(args, state, control, kwargs, lambda: self.driver.batch_end(
            0, state.num_input_tokens_seen - self.driver.clock.token))

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        # Runs every step: one call into the driver (batch_end + step_end), the stop inlined.
        d = self.driver
        self._hook = (args, state, control, kwargs)
        d.step(0, state.num_input_tokens_seen - d.clock.token)
        hosted = self._hosted
        if hosted is not None and hosted.stop_reason is not None:
            control.should_training_stop = True

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        if self._ran_out(state):
            self._event(args, state, control, kwargs, self.driver.epoch_end)

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        self._event(args, state, control, kwargs, self.driver.train_end)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self._put(logs)

    def on_evaluate(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, metrics: Mapping[str, Any] | None = None,
                    **kwargs: Any) -> None:
        self._put(metrics)

    def _put(self, values: Mapping[str, Any] | None) -> None:
        for name in self._watched:
            if values and name in values:
                self.driver.put(name, values[name], agreed=True)

    def _event(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               kwargs: dict[str, Any], report: Callable[[], tuple[str, ...]]) -> None:
        self._hook = (args, state, control, kwargs)
        report()
        self._stop(control)

    def _stop(self, control: TrainerControl) -> None:
        if self._hosted is not None and self._hosted.stop_reason is not None:
            control.should_training_stop = True

    def _act(self, name: str) -> None:
        assert self._hook is not None
        args, state, control, kwargs = self._hook
        action = self.actions[name]
        if isinstance(action, str):
            setattr(control, FLAGS[action], True)
        else:
            action(args, state, control, **kwargs)

    # -- state (ExportableState: kept in trainer_state.json) -----------------------------------
    def state(self) -> dict[str, Any]:
        mine = self.driver.state_dict()
        for name, kept in mine.get("callbacks", {}).items():
            try:  # trainer_state.json would fail later, naming nothing
                json.dumps(kept)
            except (TypeError, ValueError) as exc:
                raise HostError(f"callback {name!r}: its state_dict is not JSON data ({exc}), "
                                "and the HF Trainer keeps it in trainer_state.json") from None
        return {"args": {}, "attributes": {"schedule_state": mine}}
