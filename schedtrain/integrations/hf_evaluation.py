"""Deciding after HF's evaluation: the HF Trainer evaluates after ``on_step_end`` and
``on_epoch_end``, so an event whose triggers read metrics is held there and decided in
``on_evaluate``, once the evaluation's metrics are in (the ``"evaluate"`` and ``"log"``
flags set before, since HF acts on them first); what ``on_log`` gave meanwhile is seen
after it. A mixin of ``transformers.ScheduleCallback``, which holds the state it reads."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from transformers import TrainerControl, TrainerState, TrainingArguments

from schedtrain.integrations.driver import ScheduleDriver
from schedtrain.integrations.hf_strategies import mark_best
from schedtrain.triggers.protocol import Point

__all__ = ["AfterEvaluation"]

Hook = tuple[TrainingArguments, TrainerState, TrainerControl, dict[str, Any]]


class AfterEvaluation:
    """``on_log``, ``on_evaluate`` and the held events of ``ScheduleCallback``."""

    driver: ScheduleDriver
    actions: dict[str, Any]
    _watched: set[str] | frozenset[str]
    _evaluated: tuple[int, bool] | None  # step, a new best_metric
    _hook: Hook | None
    _acted: dict[str, int]
    _early: tuple[int, ...]
    _late: bool
    _pending: list[str]  # events held for on_evaluate
    _logged: list[Mapping[str, Any]]  # what on_log gave while they wait

    def _act(self, name: str) -> None:
        raise NotImplementedError

    def _stop(self, control: TrainerControl) -> None:
        raise NotImplementedError

    def _drained(self) -> None:
        raise NotImplementedError

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        if self._pending:  # the step's own log: seen after the step, as without evaluation
            self._logged.append(dict(logs or {}))
        else:
            self._put(logs)

    def on_evaluate(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, metrics: Mapping[str, Any] | None = None,
                    **kwargs: Any) -> None:
        self._put(metrics)
        key = args.metric_for_best_model
        if key:  # a new best (as HF decides it, right after this hook)?
            value = (metrics or {}).get(key if key.startswith("eval_") else f"eval_{key}")
            old = state.best_metric
            better = value is not None and (old is None or (
                value > old if args.greater_is_better else value < old))
            self._evaluated = (state.global_step, better)
            if better and self._acted.get("save") == state.global_step:
                mark_best(args, state)
        if self._pending:
            self._hook = (args, state, control, kwargs)
            evaluated = set(metrics or {})
            logged, self._logged = self._logged, []
            self._decide_pending()
            for logs in logged:  # the training loss HF logged before evaluating
                self._put({k: v for k, v in logs.items() if k not in evaluated})

    def _hold(self, flags: TrainerControl, report: Callable[[], tuple[str, ...]]
              ) -> tuple[str, ...]:
        """Report an event HF acts on next; when HF evaluates then, decide it in on_evaluate
        (the flags HF acts on before evaluating are set now; ``flags``: HF's ``TrainerControl``)."""
        if not self._late:
            return report()
        d = self.driver
        for event in d.held(report):
            evaluates = self._evaluates(event)
            if evaluates or flags.should_evaluate:
                flags.should_evaluate = True
                self._pending.append(event)
            else:
                d.fire(event)
        if not self._pending:
            self._drained()
        return ()

    def _evaluates(self, event: str) -> bool:
        """Whether a callback bound to "evaluate" or "log" fires at ``event`` (looked at
        without changing any trigger's state): sets those flags now, says whether HF
        evaluates."""
        d = self.driver
        table = d.table
        clock = d.clock
        listening = set(table.listeners(event))
        pt = Point(event, clock.now(), clock.previous(event), d.metrics, table.predicates,
                   table.deadline_ns)
        evaluates = False
        for i in self._early:
            if i in listening and table.nodes[i].explain(pt).value:
                self._act(table.names[i])
                evaluates = evaluates or self.actions[table.names[i]] == "evaluate"
        return evaluates

    def _decide_pending(self) -> None:
        pending, self._pending = self._pending, []
        for event in pending:
            self.driver.fire(event)
        if pending:
            self._drained()
        if self._logged and not self._pending:
            logged, self._logged = self._logged, []
            for logs in logged:
                self._put(logs)
        if pending and self._hook is not None:
            self._stop(self._hook[2])

    def _put(self, values: Mapping[str, Any] | None) -> None:
        for name in self._watched:
            if values and name in values:
                self.driver.put(name, values[name], agreed=True)
