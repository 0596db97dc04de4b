"""Live retime: a running job takes a new schedule at its next slow-path step.

How the run notices a request: it looks for ``RUN_DIR/retime.json`` (or a request made
in this process, ``Retimer.retime``) only on the loop's slow path - a step where a
trigger is due, the kept losses are folded or training ends - there at most once per
``POLL_NS`` of wall time, except at a fold and every ``LOOK_STEPS`` steps (the loop
comes to its slow path there), where one process always looks: a request waits at most
``LOOK_STEPS`` steps, however fast they are; a quiet step pays nothing, not even a
comparison. A signal was not chosen: a process
without the handler (an earlier version, ``handle_signals=False``, a run in a thread)
would be killed by SIGUSR2's default action. On several processes the chief's "a request is waiting"
rides in the agreement the ranks already make where a trigger is due (no collective of
its own); there the chief reads the request and broadcasts it, and every rank applies it
after the same step's ``step_end``.

The change is applied by the rules of ``--schedule-change apply``
(``planning.changes.carry``; what a running job cannot do is refused,
``planning.retime.live_refusal``), written to ``events.jsonl`` as a ``schedule_change``
line (``"rule": "retime"``), kept in every later checkpoint (``run.schedule``) and in
``RUN_DIR/retimes.json``, from which a resumed run applies each retime again at its step
(``control.journal``).
"""

from __future__ import annotations

import copy
import math
import os
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, Protocol

import attrs

from schedtrain.callbacks.base import Callback
from schedtrain.distributed.comm import Comm
from schedtrain.errors import RunDirError, ScheduleWarning, one_line
from schedtrain.monitors.jsonl import JsonlWriter
from schedtrain.planning.changes import (
    ScheduleDiff,
    StoredSchedule,
    canonical,
    carry,
    diff_texts,
    spec_changes,
)
from schedtrain.planning.requests import (
    LOOK_STEPS,
    REQUEST_FILE,
    Answer,
    Applied,
    BadRequest,
    History,
    Request,
    ScheduleChangeRefused,
    live_refusal,
    read_request,
    write_answer,
    write_history,
)
from schedtrain.planning.stored import stored
from schedtrain.schedule.schedule import Schedule
from schedtrain.schedule.table import TriggerTable
from schedtrain.training.control.schedule_change import ScheduleChange
from schedtrain.triggers.auto import auto_parts

__all__ = ["POLL_NS", "Retimer", "RunFolder", "adopt"]

#: The run looks for a request at most this often (on slow-path steps only).
POLL_NS: Final = 500_000_000


class RunFolder(Protocol):
    """What run control asks of the chief's run directory (``training.run_dir``, a layer
    above: run control is handed it)."""

    def record(self, status: str, **fields: Any) -> None:
        """Write ``run.json`` with ``status`` and ``fields``."""

    def remove_file(self, name: str) -> None:
        """Remove the run's own file ``name`` (refused, one line, for a directory)."""


def adopt(table: TriggerTable, new: TriggerTable, kept: tuple[str, ...]) -> None:
    """Make ``table`` (the object every part of the run holds) fire as ``new`` does,
    its triggers' states kept for the callbacks in ``kept`` and fresh for the others;
    an attached table takes its clock's position as evaluated, as a resumed one does."""
    saved = table.state_dict()["triggers"]
    table.names, table.triggers, table.nodes = new.names, new.triggers, new.nodes
    table._shared, table._event_sets = new._shared, new._event_sets
    table._listeners, table.warnings = {}, new.warnings
    table.load_state_dict({"triggers": {n: s for n, s in saved.items() if n in kept}})


class Retimer:
    """A run's side of live retime (``trainer.retimer``).

    Args:
        table, change: the run's compiled table and its schedule (``change.text``).
        callbacks: the callbacks by name.
        predicates, produced: what the table was compiled with.
        run_dir: the run directory on this rank (``None``: none).
        directory: the chief's run directory (``None``: not the chief, or none).
        events: ``events.jsonl`` (``None``: not written here).
        comm: the ranks' communicator (``None``: one process).
        position: the clock's ``(step, epoch)`` now.
    """

    def __init__(self, *, table: TriggerTable, change: ScheduleChange,
                 callbacks: Mapping[str, Callback], predicates: Mapping[str, Any],
                 produced: frozenset[str], run_dir: Path | None, directory: RunFolder | None,
                 events: JsonlWriter | None, comm: Comm | None,
                 position: Callable[[], tuple[int, int]]) -> None:
        self.table, self.change, self.callbacks = table, change, callbacks
        self.predicates, self.produced = predicates, produced
        self.run_dir, self.directory, self.events = run_dir, directory, events
        self.comm, self.position = comm, position
        self.chief = comm is None or comm.is_chief
        #: the per-batch events the loop fires, fixed when it is built (``run.json``'s
        #: ``batch_events``: the command refuses what the job would, by the same rule)
        self.fires = tuple(e for e, fired in (("batch_start", table.needs_batch_start),
                                               ("batch_end", table.needs_batch_end)) if fired)
        #: the schedule the run started with, and the retimes applied since
        self.history: History | None = None
        #: retimes a resumed run applies again, at their steps
        self.replay: list[Applied] = []
        #: a request made in this process (``retime``): its id and schedule
        self.asked: Request | None = None
        self._next_look, self._seen = 0, False
        #: one process looks at this step whatever ``POLL_NS`` says (the loop's slow path
        #: comes here): a request waits at most ``LOOK_STEPS`` steps, however short the
        #: epochs (whose ends fold the losses) or fast the steps
        self.look_step: float = LOOK_STEPS if comm is None else math.inf
        #: what sat at ``retime.json``, refused and not removable (a directory): its
        #: identity, so it is refused once, not at every look
        self._stuck: tuple[int, int, int] | None = None
        #: the identity of the ``retime.json`` being answered (``None``: the request
        #: being answered was made in this process, or is a replay)
        self._read: tuple[int, int, int] | None = None
        # A callback whose trigger changes starts afresh, as on a resume: its state as built.
        self._initial: dict[str, Any] = {}
        for name, cb in callbacks.items():
            try:
                self._initial[name] = copy.deepcopy(cb.state_dict())
            except Exception:  # such a callback keeps its state (documented)
                continue

    # -- asking --------------------------------------------------------------------------------
    def retime(self, schedule: Schedule | str | Path) -> ScheduleDiff:
        """Hand the running job ``schedule`` (a ``Schedule``, a spec's path, or TOML text):
        checked against the run's now, applied at its next slow-path step. Returns the
        diff of the next firings.

        Raises:
            ScheduleChangeRefused: a change the running job cannot make (the line says why).
            SpecError: a spec or text with problems.
        """
        new = StoredSchedule.parse(_text_of(schedule), "new schedule")
        old = self.change.stored()
        if old is None:
            raise ScheduleChangeRefused("this run's schedule has a Python trigger (when(fn)) "
                                        "with no stored form: it cannot be retimed")
        why = live_refusal(old, new, self.fires)
        if why is not None:
            raise ScheduleChangeRefused(why)
        step, _ = self.position()
        diff = self._diff(old, new, step)  # the caller's thread: the job only applies it
        self.asked = Request(f"python-{time.monotonic_ns()}", new.text)
        self._next_look = 0
        return diff

    def waiting(self, look: bool = False) -> bool:
        """Whether a request waits (looked at once per ``POLL_NS``, and whenever ``look``;
        chief only)."""
        if self.asked is not None or self._seen:
            return True
        now = time.monotonic_ns()
        if (now < self._next_look and not look) or self.run_dir is None:
            return False
        self._next_look = now + POLL_NS
        found = _identity(self.run_dir / REQUEST_FILE)
        self._seen = found is not None and found != self._stuck
        return self._seen  # until it is taken

    # -- the loop ------------------------------------------------------------------------------
    @property
    def next_step(self) -> float:
        """The next step at which a resumed run applies a retime again."""
        return self.replay[0].step if self.replay else float("inf")

    def poll(self, step: int, due: bool, *, asked: bool = False, replay_only: bool = False,
             look: bool = False) -> None:
        """After a slow-path ``step_end`` (``due``: a trigger was due, where ranks agree):
        apply a retime replayed at this step, or a request that waits (several processes:
        ``asked``, the chief's word in this step's agreement). ``look``: the kept losses
        were folded here: one process looks whatever ``POLL_NS`` says (as at
        ``look_step``), so a request waits at most ``LOOK_STEPS`` steps."""
        while self.replay and self.replay[0].step <= step:
            self._apply(self.replay.pop(0).schedule, None, replayed=True)
        if replay_only:
            return
        if self.comm is None:
            if step >= self.look_step:  # epochs shorter than a fold: the loop came here
                look = True
            if look:
                self.look_step = (step // LOOK_STEPS + 1) * LOOK_STEPS
            if self.waiting(look):
                self._take()
        elif due and asked:
            self._take()

    def _take(self) -> None:
        """Read the request (the chief; every rank gets it) and apply or refuse it."""
        try:
            self._take_one()
        finally:  # answered, or nothing to answer: never a later answer's file
            self._read = None

    def _take_one(self) -> None:
        found: Request | BadRequest | None = None
        self._seen = False
        if self.chief:
            if self.asked is not None:
                found, self.asked = self.asked, None
            elif self.run_dir is not None:
                # Its identity before the read: the answer removes the file only if it
                # is still this one (one replaced since is left for the next look).
                self._read = _identity(self.run_dir / REQUEST_FILE)
                found = read_request(self.run_dir)
            if isinstance(found, Request) and self.history is not None:
                # Applied by this run before a kill that left the request unanswered.
                done = self.history.applied_as(found.id)
                if done is not None:
                    self._answer(found.id, "applied", f"applied after step {done.step}",
                                 (done.step, done.epoch))
                    found = None
        if self.comm is not None and self.comm.size > 1:
            found = self.comm.broadcast(found)
        if isinstance(found, BadRequest):
            self._answer(found.id, "refused", found.reason)
        elif found is not None:
            self._apply(found.schedule, found.id)

    # -- applying ------------------------------------------------------------------------------
    def _apply(self, text: str, ident: str | None, *, replayed: bool = False) -> None:
        """Check, compile and adopt ``text``; each schedule is parsed at most once here
        (the running one is kept parsed), and nothing is simulated: the log line says
        what changed, ``schedtrain diff`` what that moves."""
        old = self.change.stored()
        if old is None:
            self._answer(ident, "refused", "this run's schedule has a Python trigger "
                                           "(when(fn)) with no stored form")
            return
        if text == old.text:
            self._answer(ident, "unchanged", "the new schedule is the running one")
            return
        try:
            new = StoredSchedule.parse(text, "new schedule")
            why = live_refusal(old, new, self.fires)
            table = self._compile(new, "retime")
        except Exception as exc:  # a request is data from outside: it never ends the run
            why = f"the new schedule is not valid: {one_line(str(exc), 300)}"
        if why is not None:
            self._answer(ident, "refused", why)
            return
        step, epoch = self.position()
        rules = carry(old, new)
        states = {n: self.callbacks[n].state_dict() for n in rules.reset}
        adopt(self.table, table, rules.kept)
        for name in rules.reset:  # afresh, as a resume does; a saver keeps its records
            if name in self._initial:
                self.callbacks[name].load_state_dict(copy.deepcopy(self._initial[name]))
                self.callbacks[name].load_records(states[name])
        self.change.take(new)
        if self.events is not None:
            self.events.record({"kind": "schedule_change", "step": step, "epoch": epoch,
                                "rule": "retime", **ScheduleDiff(
                                    spec_changes(old.doc, new.doc), None,
                                    rules=rules).to_dict()})
        if not replayed:
            self._remember(Applied(step, epoch, text, ident), old.text)
        if self.directory is not None:
            self.directory.record("running", step=step, epoch=epoch, schedule=text)
        self._answer(ident, "applied", f"applied after step {step}", (step, epoch))

    def _compile(self, text: StoredSchedule | str, source: str) -> TriggerTable:
        """``text`` (a schedule, its run this one) compiled as the run compiles its own.

        A callback whose trigger is unchanged and holds ``every("auto")`` keeps its
        trigger object: the saver measures its saves into that trigger's deciders (and
        configured them with the run's failure rate); a new one would never be fed, and
        the interval would stay where the change found it."""
        parsed = text if isinstance(text, StoredSchedule) else stored(text, source)
        schedule = parsed.schedule()
        now = dict(zip(self.table.names, self.table.triggers, strict=True))
        entries = [attrs.evolve(e, trigger=now[n]) if auto_parts(e.trigger)
                   and now.get(n) == e.trigger else e
                   for n, e in zip(schedule.names, schedule.entries, strict=True)]
        return Schedule(entries, schedule.events).compile(
            predicates=self.predicates, produced_metrics=self.produced)

    def _diff(self, old: StoredSchedule, new: StoredSchedule, step: int) -> ScheduleDiff:
        """The next firings each schedule makes from ``step`` (``retime``'s answer, on the
        caller's thread: the job itself never simulates)."""
        try:
            shape = self.change.shape()
        except ValueError:
            shape = None
        return diff_texts(old, new, shape=shape, from_step=step if shape else None)

    def _remember(self, applied: Applied, old: str) -> None:
        """Add ``applied`` to the history (a later retime replaces the replays after it)."""
        self.replay = []
        was = self.history
        kept = () if was is None else tuple(a for a in was.applied if a.step <= applied.step)
        self.history = History(old if was is None else was.base, (*kept, applied))
        if self.chief and self.run_dir is not None:
            write_history(self.run_dir, self.history)

    def _answer(self, ident: str | None, status: str, reason: str,
                at: tuple[int, int] | None = None) -> None:
        """Say what became of a request: a refusal as one line, the answer file for the
        command that asked, the request removed. ``at``: the ``(step, epoch)`` where it
        was applied (else now)."""
        step, epoch = at if at is not None else self.position()
        if not self.chief:
            return
        if status == "refused":
            warnings.warn(f"retime {status} at step {step}: {reason}", ScheduleWarning,
                          stacklevel=2)
        if self.run_dir is None or (ident is None and status != "refused"):
            return  # a replay, or no directory: nobody waits for an answer
        if ident is not None:
            write_answer(self.run_dir, Answer(ident, status, step, epoch, reason))
        # The file answered (or unreadable: else it is refused again at each look) is
        # removed; one a command wrote since a request made in Python, or since the read
        # (a command writes only where no request waits: a file removed and written again
        # by hand), stays for the next look. The file answered is known by its identity
        # when it was read: it is not read a second time.
        read, self._read = self._read, None
        if read is not None:
            gone = read == _identity(self.run_dir / REQUEST_FILE)
        else:
            waiting = read_request(self.run_dir)
            gone = isinstance(waiting, BadRequest) or (
                waiting is not None and waiting.id == ident)
        if self.directory is not None and gone:
            try:
                self.directory.remove_file(REQUEST_FILE)
            except RunDirError:  # a directory there: refused once, left alone
                self._stuck = _identity(self.run_dir / REQUEST_FILE)


def _identity(path: Path) -> tuple[int, int, int] | None:
    """What sits at ``path``, told apart from what sits there later (``None``: nothing):
    by ``lstat``, which never opens it (a FIFO would block an open)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns


def _text_of(schedule: Schedule | str | Path) -> str:
    """A schedule's canonical TOML."""
    # The spec loader and its checkers: a run imports them when it is retimed by a file.
    from schedtrain.spec.load import load_spec, loads_spec

    if isinstance(schedule, Path):
        schedule = load_spec(schedule, schedule_only=True).schedule()
    elif isinstance(schedule, str):
        schedule = loads_spec(schedule, "retime", schedule_only=True).schedule()
    text = canonical(schedule)
    if text is None:
        raise ScheduleChangeRefused("the new schedule has a Python trigger (when(fn)) with "
                                    "no stored form: it cannot be handed to a run")
    return text
