"""The schedule in the Hugging Face ``Trainer``: a ``TrainerCallback`` that sets
``TrainerControl``'s flags from a schedtrain ``Schedule``.

HF's counters map to schedtrain's clock so (docs/integrations.md)::

    step   = state.global_step          optimizer steps (on_step_end runs after the
                                        optimizer step and global_step += 1)
    batch  = on_substep_end + on_step_end calls: each micro-batch of gradient accumulation
    epoch  = epochs completed (on_epoch_end of an epoch that ran all its steps)
    token  = state.num_input_tokens_seen (needs include_num_input_tokens_seen)
    sample = not counted (stays 0): no callback sees the batch; use steps or tokens

Each callback of the schedule is bound to a function ``fn(args, state, control, **kw)``
or to a flag: ``"evaluate"``, ``"save"``, ``"log"``, ``"stop"`` (``should_evaluate``,
``should_save``, ``should_log``, ``should_training_stop``), which the Trainer acts on right
after on_step_end and on_epoch_end: so a flag's trigger may fire only at step_end and
epoch_end. A bound flag turns HF's own cadence for it off (``eval_strategy``,
``save_strategy``, ``logging_strategy`` left at their defaults become ``"no"``; one set to
anything else is refused), and HF evaluates or saves at most once per step.

Metrics the schedule reads come from ``on_log`` and ``on_evaluate``: a value logged after
step ``s`` is seen from step ``s + 1`` (and at the end of the epoch when ``s`` was its last
step); an evaluation's, at its own step: an event HF evaluates after is decided in
``on_evaluate``, before HF saves (the ``"evaluate"`` and ``"log"`` flags before it). The
state is kept in ``trainer_state.json`` (``ExportableState``) and restored on resume.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, cast

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_callback import ExportableState
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("schedtrain.integrations.transformers needs transformers: "
                      "pip install 'schedtrain[transformers]'") from exc

from schedtrain.checkpoints.files import remove
from schedtrain.integrations.context import HostError
from schedtrain.integrations.driver import takes_event
from schedtrain.integrations.hf_control import Preemption
from schedtrain.integrations.hf_evaluation import AfterEvaluation
from schedtrain.integrations.hf_strategies import (
    FLAGS,
    STRATEGIES,
    check_flag_bindings,
    mark_best,
    switch_off_strategies,
)
from schedtrain.integrations.host_control import HostControl
from schedtrain.integrations.hosted import (
    CallbackDriver,
    check_bound,
    counters_read,
    driver_for,
    refuse_uncounted,
    spec_bindings,
    split_actions,
)
from schedtrain.integrations.keeping import HostKeep, KeepArg
from schedtrain.retention import parse_keep
from schedtrain.schedule.schedule import Schedule
from schedtrain.triggers.protocol import Predicate

if TYPE_CHECKING:
    from schedtrain.spec import Spec
    from schedtrain.training.control.retime import Retimer

__all__ = ["FLAGS", "ScheduleCallback"]

_ACTED_ON = ("step_end", "epoch_end")
_BEFORE_EVALUATION = ("evaluate", "log")  # flags HF acts on before its metrics arrive


class ScheduleCallback(AfterEvaluation, TrainerCallback, ExportableState):
    """Fire ``schedule`` inside ``transformers.Trainer.train``.

    Args:
        schedule: the schedule (Python, or ``load_spec(path).schedule()``).
        actions: callback name -> a flag of ``FLAGS``, ``fn(args, state, control, **kw)``
            (given ``event=`` the event that fired it when it declares ``event``),
            or a schedtrain ``Callback`` (it sees the Trainer's model and optimizer, and
            stops training through ``should_training_stop``; its state must be JSON data,
            as ``trainer_state.json`` keeps it).
        predicates: predicates registered by name for ``when(name)`` conditions.
        time_source: monotonic nanoseconds for time triggers (tests pass a fake one).
        record: keep every firing in ``firings``.
        keep: which of the ``"save"`` flag's checkpoints (``checkpoint-STEP``) to keep: a
            retention policy (``schedtrain.retention``), ``N`` (the newest N) or its TOML
            table (``{"any": [{"latest": 2}, {"best": 1, "monitor": "eval_loss"}]}``);
            ``None``: all (or HF's ``save_total_limit``). Only those saves are pruned,
            never ``state.best_model_checkpoint``.
        control: run control (``HostControl``): SIGTERM/SIGINT and a cloud's notice save
            HF's checkpoint and end ``train()`` with exit 75 (``HostPreempted``), the
            deadline reaches ``before_deadline``, and the schedule is retimed live
            (``retimer.retime``, or ``schedtrain retime`` on its folder) (``hf_control``).

    With ``metric_for_best_model`` set, a save right after an evaluation that gave a new
    ``best_metric`` becomes ``state.best_model_checkpoint``, so ``load_best_model_at_end``
    loads it (HF sets it only for its own save strategies).
    """

    def __init__(
        self,
        schedule: Schedule | None = None,
        actions: Mapping[str, str | Callable[..., Any]] | None = None,
        *,
        predicates: Mapping[str, Predicate] | None = None,
        time_source: Callable[[], int] = perf_counter_ns,
        record: bool = False,
        keep: KeepArg | None = None,
        control: HostControl | None = None,
    ) -> None:
        if not isinstance(schedule, Schedule):
            raise TypeError(
                f"ScheduleCallback needs a schedtrain Schedule, got {schedule!r}; with "
                "restore_callback_states_from_checkpoint=True the Trainer rebuilds callbacks "
                "from saved arguments, which a schedule cannot be: leave it False, this "
                "callback restores its own state when training resumes")
        self.actions, callbacks = split_actions(actions)
        check_flag_bindings(schedule, self.actions)
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
            record=record, global_counts=True, reduce="host", control=control)
        #: the driver, when it runs schedtrain callbacks
        self._hosted = self.driver if isinstance(self.driver, CallbackDriver) else None
        policy = parse_keep(keep)
        if policy is not None and "save" not in self.actions.values():
            raise ValueError(f"keep={keep!r}: only the checkpoints of a callback bound to "
                             "'save' are kept by it, and none is")
        #: the "save" flag's checkpoints and which to keep (``None``: HF's own rules)
        self.keep = None if policy is None else HostKeep(policy)
        self._watched = self.driver.metric_names | set(self.keep.monitors if self.keep else ())
        self._evaluated: tuple[int, bool] | None = None  # step, a new best_metric
        self._hook: tuple[TrainingArguments, TrainerState, TrainerControl, dict[str, Any]] | None
        self._hook = None
        #: flag -> the global step it was last set at (HF evaluates or saves once a step)
        self._acted: dict[str, int] = {}
        self._flags = {a for a in self.actions.values() if isinstance(a, str)}
        #: functions that declare ``event``: told which event fired them
        self._told = {n for n, a in self.actions.items() if callable(a) and takes_event(a)}
        #: indexes of callbacks bound to the flags HF acts on before evaluating
        self._early = tuple(i for i, n in enumerate(self.driver.table.names)
                            if self.actions.get(n) in _BEFORE_EVALUATION)
        #: decide an event HF evaluates after once the evaluation's metrics are in: only
        #: when a trigger reads metrics (else nothing an evaluation puts changes a firing)
        self._late = bool(self._watched)
        self._pending: list[str] = []  # events held for on_evaluate
        self._logged: list[Mapping[str, Any]] = []  # what on_log gave while they wait
        #: a preemption on its way through HF's save (``hf_control``)
        self._preemption = Preemption(self.driver)
        self.driver.on_retime = self._retimed
        if control is not None:  # on_substep_end and on_step_end report every micro-batch
            control.reports_every_batch()

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
    def retimer(self) -> Retimer:
        """Live retime's Python API: ``retimer.retime(schedule)`` while ``train()`` runs
        (needs ``control=``)."""
        if self.driver.control is None:
            raise ValueError("live retime needs run control: ScheduleCallback(schedule, "
                             "actions, control=HostControl(run_dir))")
        return cast(HostControl, self.driver.control).retimer

    def close(self) -> None:
        """Close the run control a ``train()`` that raised left open (signal handlers,
        notice poller, the folder's lock); the next ``train()`` does it too."""
        self._preemption.reopen()

    def _drained(self) -> None:
        """The held events are decided: run control drained after them (a retime, a
        preemption: HF saves after its evaluation)."""
        d = self.driver
        d.drain_held()
        if d.preempt_requested is not None and self._hook is not None:
            self._preemption.step_end(self._hook[1], self._hook[2])

    def _retimed(self) -> None:
        """A retime changed the triggers: the metrics they read are watched from now."""
        self._watched = self.driver.metric_names | set(self.keep.monitors if self.keep else ())
        self._late = self._late or bool(self._watched)

    @property
    def firings(self) -> list[Any]:
        """What fired, with the clock's counters (with ``record=True``)."""
        return self.driver.firings

    # -- the Trainer's events ----------------------------------------------------------------
    def on_init_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        switch_off_strategies(args, self._flags)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        name = self._counts_tokens
        if name is not None and args.include_num_input_tokens_seen in ("no", False):
            raise ValueError(
                f"callback {name!r}: its trigger counts tokens, which the HF Trainer counts "
                "only with TrainingArguments(include_num_input_tokens_seen=True)")
        # again: a callback added after the Trainer was built had no on_init_end
        switch_off_strategies(args, self._flags)
        self._preemption.reopen()
        stored: Any = state.stateful_callbacks or {}  # typed as a list, loaded as a dict
        saved = stored.get(type(self).__name__)
        if isinstance(saved, list):
            saved = saved[0] if saved else None
        mine = (saved or {}).get("attributes", {}).get("schedule_state")
        if state.global_step > 0 and mine is not None:  # resuming from a checkpoint
            self.driver.load_state_dict(mine)
            if self.keep is not None:
                self.keep.load(saved["attributes"].get("keep"))
        if self.keep is not None and args.save_total_limit:
            raise ValueError(f"TrainingArguments(save_total_limit={args.save_total_limit}) "
                             "and ScheduleCallback(keep=...) both prune checkpoints: set "
                             "save_total_limit=None, or leave keep out")
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
        self._decide_pending()
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

    def on_step_begin(self, args: TrainingArguments, state: TrainerState,
                      control: TrainerControl, **kwargs: Any) -> None:
        if self._pending:  # the evaluation they waited for did not come
            self._decide_pending()

    def on_substep_end(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        self._event(args, state, control, kwargs, lambda: self.driver.batch_end(
            0, state.num_input_tokens_seen - self.driver.clock.token))

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        # Runs every step: one call into the driver (batch_end + step_end), the stop inlined.
        d = self.driver
        self._hook = (args, state, control, kwargs)
        tokens = state.num_input_tokens_seen - d.clock.token
        if self._late:
            d.batch_end(0, tokens)
            self._hold(control, d.step_end)
        else:
            d.step(0, tokens)
            if d.preempt_requested is not None:
                self._preemption.step_end(state, control)
        hosted = self._hosted
        if hosted is not None and hosted.stop_reason is not None:
            control.should_training_stop = True

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        self._decide_pending()
        self._preemption.leave(args)  # preempted: exit 75 here, its checkpoint saved
        if self._ran_out(state):
            self._event(args, state, control, kwargs,
                        lambda: self._hold(control, self.driver.epoch_end))

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        self._decide_pending()
        self._preemption.saved(args, state)
        if self._acted.get("save") != state.global_step:
            return  # not the schedule's save
        folder = Path(args.output_dir or "")
        if self.keep is not None and args.should_save:
            spare = Path(state.best_model_checkpoint or "").name
            self.keep.prune(folder, remove, [spare])

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        self._decide_pending()
        self._preemption.leave(args)
        if self.driver.in_epoch and self._ran_out(state):  # resumed from the last step's
            self._event(args, state, control, kwargs, self.driver.epoch_end)  # checkpoint
        self._event(args, state, control, kwargs, self.driver.train_end)

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
            if action in STRATEGIES:  # once a step (a step end that ends an epoch too)
                if self._acted.get(action) == state.global_step:
                    return
                self._acted[action] = state.global_step
                if action == "save" and self.keep is not None:  # before HF writes its state
                    got = {m: self.driver.metrics.latest(m) for m in self.keep.monitors}
                    self.keep.record(f"checkpoint-{state.global_step}", self.driver.now,
                                     {m: v and v.value for m, v in got.items()})
                if action == "save" and self._evaluated == (state.global_step, True):
                    mark_best(args, state)
            setattr(control, FLAGS[action], True)
        elif name in self._told:
            action(args, state, control, **kwargs, event=self.driver.event)
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
        kept = {} if self.keep is None else {"keep": self.keep.state()}
        return {"args": {}, "attributes": {"schedule_state": mine, **kept}}
