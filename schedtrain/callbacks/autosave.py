"""``AutoPacing``: what a saver whose trigger is ``every("auto")`` measures and decides.

A save's cost ``C`` is what it takes from training: the time from the firing to the
checkpoint's landing (committed), less the steps trained meanwhile at the step time
measured outside saves. In ``"sync"`` mode no step runs meanwhile, so it is the loop's
stall; in ``"async"`` mode it is the stall for the host copy plus what the background
write slowed the steps it overlapped by. The step time is measured from the previous
landing (or the start of training) to this firing. Each landing feeds the trigger's
``Decider`` (Young/Daly), whose interval places the next firing.

Each decision is three metrics of the saver, lines of ``events.jsonl``: ``NAME/interval``
(steps), ``NAME/save_cost`` and ``NAME/step_time`` (seconds, what was measured). The
checkpoint of a save holds the decisions before it: the one its own landing made comes
after it was written. A run resumed from it replays that decision from the log the
killed run wrote (``replay_from_log``), so it places its firings as the killed run did;
a decision the killed run had not yet written is made by the resumed run's next save.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Final

import attrs

from schedtrain.errors import ScheduleError
from schedtrain.readback import DamagedFile, between, structure
from schedtrain.spec.failures import mtbf_seconds, overhead_fraction
from schedtrain.triggers import Trigger
from schedtrain.triggers.auto import MAX_INTERVAL, MAX_SECONDS, Decider, auto_parts

__all__ = ["AutoPacing", "LoggedValue", "auto_deciders", "deciders_of", "logged_decisions",
           "read_decisions"]

_KEYS = ("interval", "save_cost", "step_time")
#: Each logged metric's bounds (what a decision records: ``Decision``'s).
_BOUNDS: Final = {"interval": (1, MAX_INTERVAL), "save_cost": (-MAX_SECONDS, MAX_SECONDS),
                  "step_time": (0, MAX_SECONDS)}


@attrs.frozen
class LoggedValue:
    """A decision's metric line of ``events.jsonl``, as a resume replays it."""

    step: int = attrs.field(validator=between(0, 2**62))
    value: float


def auto_deciders(trigger: Trigger) -> list[Decider]:
    """The deciders of the ``AutoEvery`` parts of ``trigger``."""
    return [part.decider for part in auto_parts(trigger)]


def logged_decisions(events: Path, saver: str) -> list[tuple[int, float, float]]:
    """``(landing step, save cost, step time)`` of each decision ``saver`` logged in
    ``events`` (``events.jsonl``), in order; a line cut short by a kill ends the list."""
    got: dict[str, list[Any]] = {k: [] for k in _KEYS}
    names = {f"{saver}/{k}": k for k in _KEYS}
    try:
        for number, line in _lines(events):
            if not any(n in line for n in names):
                continue  # most lines: no JSON to parse
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                break
            key = names.get(str(row.get("name"))) if isinstance(row, dict) else None
            if key is not None and row.get("kind") == "scalar":
                got[key].append(_checked(row, key, events, f"line {number}"))
    except OSError:
        return []
    n = min(len(v) for v in got.values())
    return [(got["interval"][i][0], got["save_cost"][i][1], got["step_time"][i][1])
            for i in range(n)]


def _lines(events: Path) -> Iterator[tuple[int, str]]:
    """The numbered lines of ``events``: a regular file only (a FIFO in its place would
    block the resume for ever; it yields nothing, the run's writer refuses it by name)."""
    fd = os.open(events, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return
    with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
        yield from enumerate(f, 1)


def _checked(row: dict[str, Any], key: str, events: Path, where: str) -> tuple[int, float]:
    """A decision's line as ``(step, value)``, its value within its metric's bounds.

    Raises:
        DamagedFile: a field of another type or out of bounds (``where.value``).
    """
    line = structure(row, LoggedValue, events, where)
    low, high = _BOUNDS[key]
    if not low <= line.value <= high:
        raise DamagedFile(events, f"{where}.value", f"expected a value from {low:,} to "
                          f"{high:,} for a decision's {key}, found {line.value!r}")
    return line.step, line.value


class AutoPacing:
    """Measures a saver's saves and feeds its ``every("auto")`` deciders."""

    def __init__(self, deciders: list[Decider], clock: Any = time.monotonic,
                 share: Callable[[Any], Any] | None = None, *,
                 at_firing: bool = False) -> None:
        self.deciders = deciders
        self.clock = clock  # the seconds the measurements read
        #: on several processes: the chief's value of what it is given, on every rank
        self.share = share
        #: several processes, background saves: decide at the next firing, not the landing
        self.at_firing = at_firing and share is not None
        self._since: tuple[float, int] | None = None  # the last landing (or the start)
        self._fired: tuple[float, int] | None = None  # the firing in flight
        #: at_firing: the newest landing's (cost, step time), not yet decided on
        self._measured: tuple[float, float] | None = None
        #: at_firing, resumed: the decisions the killed run logged after the checkpoint,
        #: by the step of the firing that made them
        self._logged: dict[int, tuple[float, float]] = {}

    @classmethod
    def of(cls, callback: Any) -> AutoPacing | None:
        """For ``callback`` (a saver) when its trigger has ``every("auto")``, configured
        from its trainer's ``[run] mtbf`` and ``max_checkpoint_overhead``; else ``None``.

        Raises:
            ScheduleError: the run declares no failure rate.
        """
        trainer = callback.trainer
        deciders = deciders_of(callback)
        if not deciders:
            return None
        name = callback.name
        config = trainer.config
        mtbf = mtbf_seconds(config)
        if mtbf is None:
            raise ScheduleError(f"callback {name!r}: every('auto') picks the interval from "
                                "the failure rate: give the run mtbf ('6 h') or failure_rate")
        for d in deciders:
            d.configure(mtbf, overhead_fraction(config))
        comm = trainer.comm
        if comm is None or config is None:
            return cls(deciders)
        # Every rank decides alike, on the chief's measurement. A "sync" save lands on
        # every rank in one call, which shares it; a background one lands on the chief
        # alone, at a step of its own, so the next firing (every rank's) shares it.
        background = config.checkpoint_mode != "sync"
        return cls(deciders, share=comm.broadcast, at_firing=background)

    def started(self, step: int) -> None:
        """Training starts (or resumes) at ``step``: step times count from now."""
        self._since = (self.clock(), step)

    def fired(self, step: int) -> list[dict[str, Any]]:
        """The saver fired at ``step``: its save is asked for now. With ``at_firing``,
        the decisions made now: on the chief's newest measured save (one still being
        written there waits for a later firing), or, resumed, on what the killed run
        logged at this step; every rank alike."""
        made = []
        if self.at_firing:
            assert self.share is not None
            measured, self._measured = self._measured, None
            got = self.share(self._logged.pop(step, measured))
            if got is not None:
                made = [d.decide(step, got[0], got[1]) for d in self.deciders]
        self._fired = (self.clock(), step)
        return made

    def landed(self, step: int) -> list[dict[str, Any]]:
        """The save landed with the clock at ``step``: the decisions it leads to."""
        now = self.clock()
        fired, since = self._fired, self._since
        self._fired, self._since = None, (now, step)
        if fired is None or since is None or fired[1] <= since[1]:
            return []  # no step between the last landing and this firing to time
        step_s = (fired[0] - since[0]) / (fired[1] - since[1])
        cost = (now - fired[0]) - (step - fired[1]) * step_s
        if self.at_firing:  # the chief's is shared at the next firing
            self._measured = (cost, step_s)
            return []
        if self.share is not None:  # every rank lands here in one call: the chief's
            cost, step_s = self.share((cost, step_s))
        return [d.decide(fired[1], cost, step_s) for d in self.deciders]

    def replay(self, logged: list[tuple[int, float, float]]) -> list[dict[str, Any]]:
        """The decision the landing of the checkpoint resumed from made (the log's next
        one after those the deciders' state knows), made again from its measurements;
        none where the killed run had not written it."""
        if self.share is not None:  # the chief read the log (its run directory has it)
            logged = self.share(logged)
        if self.at_firing:  # made again at the firings that made them
            known = min(d.measured[0] for d in self.deciders)
            self._logged = {step: (cost, step_s) for step, cost, step_s in logged[known:]}
            return []
        made: list[dict[str, Any]] = []
        for d in self.deciders:
            known = d.measured[0]
            if len(logged) > known:
                step, cost, step_s = logged[known]
                made.append(d.decide(step, cost, step_s))
        return made


def deciders_of(callback: Any) -> list[Decider]:
    """The ``every("auto")`` deciders of ``callback``'s trigger in its trainer's schedule."""
    schedule = callback.trainer.schedule
    name = callback.name
    if schedule is None or name is None or name not in schedule.names:
        return []
    return auto_deciders(schedule[name])


def read_decisions(callbacks: Iterable[Any], schedule: Any, events: Path) -> None:
    """On a resume, before ``events`` (``events.jsonl``) is cut back to the checkpoint:
    each saver with ``every("auto")`` reads the decisions logged (``read_log``)."""
    for cb in callbacks:
        name = getattr(cb, "name", None)
        if hasattr(cb, "read_log") and name in schedule.names \
                and auto_deciders(schedule[name]):
            cb.read_log(events)
