"""``ScheduleDriver``: a schedule inside a training loop you wrote yourself (no torch).

The loop tells the driver what happened, in loop order; each call returns the names of
the callbacks due at that event, in declared order, and runs their bound actions::

    driver = ScheduleDriver(schedule, actions={"checkpoint": save})
    driver.train_start()
    for epoch in range(epochs):
        driver.epoch_start()
        for batch in data:
            ...                                   # forward, backward, optimizer step
            driver.step(samples=len(batch))       # batch_end + step_end
        driver.epoch_end()
    driver.train_end()

Under gradient accumulation call ``batch_end(samples, tokens)`` after each micro-batch
and ``step_end()`` after each optimizer step. A step on which nothing can fire costs the
clock's update and one integer comparison (``TriggerTable.step_due``). ``state_dict`` /
``load_state_dict`` carry the clock, the triggers' state and the latest metric values,
so a resumed loop fires exactly what the uninterrupted one would have.

With ``control=HostControl(...)`` the driver takes signals, cloud notices and live
retimes (``driver_control``); a preemption asked for waits in ``preempt_requested``.

Under ``torch.distributed`` (more than one rank when training starts) the driver agrees
with the other ranks wherever the table evaluates something: samples and tokens summed,
time the chief's, the metrics the schedule reads reduced (``ranks.py``); a quiet step runs
no collective.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterable, Mapping
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, Final

from schedtrain.clock import LoopClock
from schedtrain.distributed.vocabulary import REDUCE_OPS
from schedtrain.integrations.driver_control import Control, ControlledSteps, refuse_auto
from schedtrain.integrations.driver_state import check_driver_state, check_seen, load_part
from schedtrain.integrations.values import HOST, LatestValues
from schedtrain.schedule.firings import Firing
from schedtrain.schedule.schedule import Schedule
from schedtrain.schedule.table import Runner, TriggerTable
from schedtrain.time import Timestamp
from schedtrain.triggers.protocol import Predicate

if TYPE_CHECKING:
    from schedtrain.integrations.ranks import RankAgreement

__all__ = ["Action", "Control", "LatestValues", "ScheduleDriver", "refuse_unknown_actions",
           "takes_event"]

_FREQUENT: Final = ("batch_end", "step_end", "epoch_end")

Action = Callable[[], object]
"""What runs when a callback of the schedule fires (its return value is ignored)."""


def takes_event(fn: Callable[..., object]) -> bool:
    """Whether ``fn`` declares a parameter ``event`` (it is then told which event fired it)."""
    try:
        found = inspect.signature(fn).parameters.get("event")
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    return found is not None and found.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                inspect.Parameter.KEYWORD_ONLY)


def refuse_unknown_actions(names: Iterable[str], actions: Iterable[str]) -> None:
    """Refuse actions bound to names the schedule does not have, naming them and the
    schedule's (every host's constructor checks its actions so)."""
    known = list(names)
    unknown = sorted(set(actions) - set(known))
    if unknown:
        raise ValueError(f"actions name callbacks that are not in the schedule: {unknown} "
                         f"(the schedule has {known})")


def _actions(table: TriggerTable, schedule: Schedule | TriggerTable,
             actions: Mapping[str, Action] | None) -> dict[str, Action]:
    found: dict[str, Action] = {}
    if isinstance(schedule, Schedule):
        found = {e.default_name(): e.callback for e in schedule.entries
                 if e.callback is not None and callable(e.callback)}
    given = dict(actions or {})
    refuse_unknown_actions(table.names, given)
    for name, action in given.items():
        if not callable(action):
            hint = ("; a schedtrain Callback runs through schedtrain.integrations.hosted."
                    "CallbackDriver" if hasattr(action, "setup") and hasattr(action, "trigger")
                    else "")
            raise TypeError(f"actions[{name!r}] must be callable, got {action!r}{hint}")
    found.update(given)
    return found


class ScheduleDriver(ControlledSteps):
    """Evaluate a schedule at the events of a loop you wrote; see the module docstring.

    Args:
        schedule: a ``Schedule`` (compiled here) or a compiled ``TriggerTable``.
        actions: name -> a function of no arguments, run when that callback fires (as it
            fires: a metric it puts is seen by the triggers of callbacks declared after
            it); one that declares a parameter ``event`` gets the event that fired it.
            Entries of a ``Schedule`` whose callback object is callable run too.
        predicates: predicates registered by name, for ``when(name)`` conditions.
        time_source: monotonic nanoseconds (default ``time.perf_counter_ns``) for time
            triggers; a test passes a fake one.
        record: keep every firing in ``firings`` (a ``Firing`` with the clock's counters).
        reduce: on several processes, metric name -> "mean" (default), "sum", "max",
            "min", or "host" (the host agrees it across ranks itself); one of them alone
            applies to every metric.
        global_counts: on several processes, the samples and tokens reported are already
            summed over ranks (not summed again).
        control: run control (``HostControl``): signals, notices, deadline, live retime.
        host: the host's name, for messages (a host module passes its own).
    """

    def __init__(
        self,
        schedule: Schedule | TriggerTable,
        *,
        actions: Mapping[str, Action] | None = None,
        predicates: Mapping[str, Predicate] | None = None,
        time_source: Callable[[], int] = perf_counter_ns,
        record: bool = False,
        reduce: Mapping[str, str] | str | None = None,
        global_counts: bool = False,
        control: Control | None = None,
        host: str = "your loop",
    ) -> None:
        ops = {"": reduce} if isinstance(reduce, str) else (reduce or {})
        for name, op in ops.items():
            if op not in (*REDUCE_OPS, HOST):
                where = f"[{name!r}]" if name else ""
                raise ValueError(f"reduce{where} must be one of {[*REDUCE_OPS, HOST]}, "
                                 f"got {op!r}")
        if isinstance(schedule, Schedule):
            self.table = schedule.compile(predicates=predicates)
        elif isinstance(schedule, TriggerTable):
            self.table = schedule
        else:
            raise TypeError(f"expected a Schedule or a TriggerTable, got {schedule!r}")
        refuse_auto(self.table, host)
        self.clock = LoopClock(time_source)
        self.metrics = LatestValues()
        self.firings: list[Firing] = []
        self._actions = {n: self.telling_event(a)
                         for n, a in _actions(self.table, schedule, actions).items()}
        self._record = record
        self._event = ""
        self._run: Runner | None = self._runner if (self._actions or record) else None
        self.table.attach(self.clock, self.metrics,
                          predicates if predicates is not None else self.table.predicates)
        self._started = False
        self._in_epoch = False
        # (batch, sample, token) at the last step end: a state saved between the micro-batches
        # of a step is the clock at that step end plus the batches since (replayed on load).
        self._at_step = (0, 0, 0)
        self._reduce = reduce if isinstance(reduce, str) else dict(reduce or {})
        self._global_counts = global_counts
        #: the agreement with the other ranks (``None``: one process), set at train start
        self.ranks: RankAgreement | None = None
        self._agreed: tuple[int, int] | None = None  # a resumed state's agreed counters
        self._held: list[str] | None = None  # events reported under ``held``, not decided
        self.bind_control(control, schedule if isinstance(schedule, Schedule) else None,
                          self.metric_names if control is not None else frozenset())

    # -- what the loop reports -----------------------------------------------------------
    def train_start(self) -> tuple[str, ...]:
        """Training starts; on a resumed driver only the wall-time count restarts."""
        self.clock.start_train()
        if self.ranks is None and "torch.distributed" in sys.modules:  # torch-free else
            from schedtrain.integrations.ranks import RankAgreement, reads_time

            clock = self.clock
            names, ops = self.metric_names, self._reduce
            self.ranks = RankAgreement.detect(
                names, dict.fromkeys(names, ops) if isinstance(ops, str) else ops,
                global_counts=self._global_counts,
                reads_time=reads_time(self.table),
                agreed=self._agreed or (clock.sample, clock.token))
        self.open_control()
        if self._started:
            return ()
        self._started = True
        return self.fire("train_start")

    def epoch_start(self) -> tuple[str, ...]:
        """An epoch starts; nothing fires when resuming inside the epoch it was saved in."""
        if self._in_epoch:
            return ()
        self._in_epoch = True
        self.clock.start_epoch()
        return self.fire("epoch_start")

    def batch_end(self, samples: int = 0, tokens: int = 0) -> tuple[str, ...]:
        """A micro-batch ended, having seen ``samples`` samples and ``tokens`` tokens."""
        self.clock.end_batch(samples, tokens)
        if self.table.needs_batch_end:
            return self.fire("batch_end")
        return ()

    def step_end(self) -> tuple[str, ...]:
        """An optimizer step ended (after the ``batch_end`` of each of its micro-batches)."""
        clock = self.clock
        clock.end_step()
        self._at_step = (clock.batch, clock.sample, clock.token)
        # the quiet step: one comparison (and with run control, its next step's)
        if clock.step < self.table.step_due and (self._inbox is None
                                                 or clock.step < self._inbox.limit):
            return ()
        return self.slow_step_end()

    def step(self, samples: int = 0, tokens: int = 0) -> tuple[str, ...]:
        """One micro-batch that is one optimizer step: ``batch_end`` then ``step_end``."""
        clock = self.clock
        clock.end_batch(samples, tokens)
        fired = self.fire("batch_end") if self.table.needs_batch_end else ()
        clock.end_step()
        self._at_step = (clock.batch, clock.sample, clock.token)
        if clock.step < self.table.step_due and (self._inbox is None
                                                 or clock.step < self._inbox.limit):
            return fired
        return fired + self.slow_step_end()

    def skip_to(self, step: int) -> None:
        """Count the one-micro-batch steps up to ``step`` that the host counted itself,
        seeing no samples or tokens, without evaluating them: only for steps that cannot
        fire (``step < table.step_due``) of a schedule that reads no wall time."""
        clock = self.clock
        k = step - clock.step
        if k <= 0:
            return
        t = clock.time_source()
        sample, token = clock.sample, clock.token
        clock.catch_up(step, batch=clock.batch + k, sample=sample, token=token,
                       prev_sample=sample, prev_token=token, prev_time=t if k > 1 else None,
                       time=t)
        self._at_step = (clock.batch, sample, token)

    def epoch_end(self) -> tuple[str, ...]:
        """The epoch ended (not for an epoch cut short: a run stopped inside it has none)."""
        self._in_epoch = False
        self.clock.end_epoch()
        return self.fire("epoch_end")

    def train_end(self) -> tuple[str, ...]:
        """Training ended (run control, if any, is closed after its firings)."""
        self.clock.stop_train()
        fired = self.fire("train_end")
        self.close_control()
        return fired

    def fire(self, event: str) -> tuple[str, ...]:
        """Evaluate the schedule at ``event`` now (a custom event declared on the schedule,
        or ``eval_start``...); the names that fire, their actions run."""
        if self._held is not None:
            self._held.append(event)
            return ()
        self._event = event
        ranks = self.ranks
        # Every rank settles at the same events: the frequent ones once the driver reports
        # them (a step end only past step_due), the others where a trigger listens.
        if ranks is not None and (event in _FREQUENT or self.table.listeners(event)):
            clock = self.clock
            ranks.settle(clock, self.metrics, step_end=event == "step_end")
            if event == "step_end":
                self._at_step = (clock.batch, clock.sample, clock.token)
        return self.table.decide(event, self._run)

    def held(self, report: Callable[[], object]) -> tuple[str, ...]:
        """Run ``report`` (a loop event: the clock moves, hooks run) without deciding: the
        events it would have evaluated, for ``fire`` later. A host whose metrics for this
        point arrive after its callbacks ran (the HF Trainer evaluates after on_step_end)
        decides once they have arrived."""
        self._held = []
        try:
            report()
        finally:
            events, self._held = self._held, None
        return tuple(events)

    def put(self, name: str, value: Any, *, agreed: bool = False) -> None:
        """Record a metric value for conditions and metric triggers; ``agreed``: the host
        has made it the same on every rank (else, on several processes, it is reduced)."""
        if self.ranks is None:
            self.metrics.put(name, value)
        else:
            self.ranks.put(self.metrics, name, value, agreed)

    def _runner(self, name: str, now: Timestamp) -> None:
        if self._record:
            self.firings.append(Firing(name, self._event, now))
        action = self._actions.get(name)
        if action is not None:
            action()
            if self.ranks is not None:  # what it put, reduced before later triggers read
                self.ranks.settle_metrics(self.metrics)

    def telling_event(self, action: Callable[..., object]) -> Action:
        """``action`` as a function of no arguments; one that declares ``event`` is called
        with ``event=`` the event that fired it (``"step_end"``, ``"epoch_end"``...)."""
        if takes_event(action):
            return lambda: action(event=self._event)
        return action

    # -- introspection and state ---------------------------------------------------------
    @property
    def event(self) -> str:
        """The event being evaluated (or last evaluated): what fired an action running now."""
        return self._event

    @property
    def now(self) -> Timestamp:
        """The clock's counters at this moment."""
        return self.clock.now()

    @property
    def metric_names(self) -> frozenset[str]:
        """Metrics that the schedule's conditions and metric triggers read."""
        found: set[str] = set()
        todo = list(self.table.triggers)
        while todo:
            t = todo.pop()
            found |= t.metrics()
            todo.extend(t.children())
        return frozenset(found)

    @property
    def pending_batches(self) -> int:
        """The micro-batches of the optimizer step under way (since the last step end)."""
        return self.clock.batch - self._at_step[0]

    @property
    def in_epoch(self) -> bool:
        """Whether an epoch has started and not ended (a state saved now resumes inside it)."""
        return self._in_epoch

    def state_dict(self) -> dict[str, Any]:
        """Clock, trigger state, latest metrics and loop position, as plain data."""
        clock = self.clock.state_dict()
        batch, sample, token = self._at_step
        now = clock["now"]
        pending = [now["batch"] - batch, now["sample"] - sample, now["token"] - token]
        now.update(batch=batch, sample=sample, token=token)
        state = {"clock": clock, "pending": pending, "table": self.table.state_dict(),
                 "metrics": self.metrics.state_dict(), "started": self._started,
                 "in_epoch": self._in_epoch}
        if self.ranks is not None:  # the counters the ranks last agreed on
            state["agreed"] = list(self.ranks.agreed)
        if self.control is not None:  # the schedule it runs, retimes included
            state["schedule"] = self.control.schedule_text
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict`` (before ``train_start`` of the resumed loop); a damaged
        state raises ``DriverStateError`` (a ``ValueError``) naming its key path."""
        # a damaged or crafted one is refused in one line
        store = not isinstance(self.metrics, LatestValues)
        if self.control is not None and "schedule" in state:
            # the schedule it was saved with first: the triggers' states are that one's
            check_driver_state(state, store=store)
            self.replay_control(state)
        check_driver_state(state, store=store, stateful=self.table.state_dict()["triggers"])
        self._resumed = True
        clock = self.clock
        clock.load_state_dict(dict(state["clock"]))
        step_end = clock.now()  # the last step end, evaluated before the state was saved
        self._at_step = (clock.batch, clock.sample, clock.token)
        # The micro-batches of the step under way: counted at once (none fires), not
        # replayed one by one.
        batches, samples, tokens = state["pending"]
        if batches:
            clock.batch += batches
            clock.sample += samples
            clock.token += tokens
        load_part("metrics", self.metrics.load_state_dict, state["metrics"])
        self._started = bool(state["started"])
        self._in_epoch = bool(state["in_epoch"])
        agreed = state.get("agreed")
        self._agreed = None if agreed is None else (int(agreed[0]), int(agreed[1]))
        load_part("table", self.table.load_state_dict, state["table"])
        check_seen(self.table, self.metrics)
        self.table.attach(self.clock, self.metrics, self.table.predicates,
                          last_step_end=step_end)
