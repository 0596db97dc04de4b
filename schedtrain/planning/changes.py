"""Schedules that change: what differs between two, and which firings that moves.

A schedule is compared as its canonical TOML (``spec.write``): the spec's tables by key
path (``SpecChange``), and over a simulated run the firings each callback gains, loses
or moves (``FiringChange``). The rules take each side as a ``StoredSchedule`` (the text
parsed once, ``planning.stored``) or as text. ``continue_with`` simulates the rules a
resumed run applies when its schedule changed (``schedule_change = "apply"``,
docs/checkpoints.md):

- the clock goes on where it was: periodic grids stay on the run's absolute counters
  (a grid point already passed neither fires again nor is skipped), and an ``at`` point
  already passed never fires;
- a callback whose name and trigger are unchanged keeps its trigger's state (a metric
  trigger's best value and wait) and its own state;
- a callback whose trigger changed starts both afresh, except a saver's record of the
  files it wrote (``Callback.load_records``), so its ``keep`` still knows when each was
  saved; a new callback starts fresh; a removed callback's state is dropped (``Carry``
  says which is which).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from schedtrain.errors import SHOWN_PROBLEMS, shorten, summarized
from schedtrain.planning.deletions import FileChange, Present, file_changes
from schedtrain.planning.nearest import nearest_pairs
from schedtrain.planning.stored import StoredSchedule, stored
from schedtrain.retention import Policy, Saved
from schedtrain.schedule.firings import Firing
from schedtrain.schedule.schedule import Schedule
from schedtrain.simulation.retimed import retimed
from schedtrain.simulation.simclock import RunShape
from schedtrain.simulation.simulate import Simulation
from schedtrain.spec.write import schedule_to_toml, toml_value

__all__ = ["Carry", "Continuation", "FileChange", "FiringChange", "ScheduleDiff",
           "SpecChange", "StoredSchedule", "canonical", "carry", "continue_with", "diff_texts",
           "file_changes", "firing_changes", "spec_changes"]


def canonical(schedule: Schedule) -> str | None:
    """The schedule as canonical TOML, or ``None`` when a trigger has no TOML form (a
    Python ``when(fn)``): such a schedule is "unknown" to a later resume."""
    try:
        return schedule_to_toml(schedule)
    except ValueError:
        return None


# -- the spec's changes ------------------------------------------------------------------


@attrs.frozen
class SpecChange:
    """A key path ``added``, ``removed`` or ``changed`` (``old`` and ``new`` its values),
    or the callbacks ``reordered`` (their common names in the old and the new order)."""

    path: str
    kind: str
    old: Any = None
    new: Any = None

    def __str__(self) -> str:
        if self.kind == "added":
            return f"added   {self.path} = {toml_value(self.new)}"
        if self.kind == "removed":
            return f"removed {self.path} (was {toml_value(self.old)})"
        if self.kind == "reordered":
            return (f"reordered {self.path}: {toml_value(self.old)} -> {toml_value(self.new)} "
                    "(at an event, callbacks fire in this order)")
        return f"changed {self.path}: {toml_value(self.old)} -> {toml_value(self.new)}"

    def to_dict(self) -> dict[str, Any]:
        """The JSON record."""
        return {"path": self.path, "change": self.kind, "old": self.old, "new": self.new}


def spec_changes(old: Mapping[str, Any], new: Mapping[str, Any],
                 prefix: str = "") -> tuple[SpecChange, ...]:
    """The key paths that differ between two TOML documents: the top-level tables and
    their tables (``callbacks.NAME``, ``triggers.NAME``) key by key, any other value
    whole (a trigger is one value); a table added or removed is one change; callbacks
    whose order changed are one ``reordered`` change."""
    out: list[SpecChange] = []
    deep = prefix.count(".") < 2
    if prefix == "callbacks.":
        kept = [k for k in old if k in new]
        if kept != [k for k in new if k in old]:
            out.append(SpecChange("callbacks", "reordered", kept, [k for k in new if k in old]))
    for key in [*old, *(k for k in new if k not in old)]:
        path = f"{prefix}{key}"
        if key not in new:
            out.append(SpecChange(path, "removed", old=old[key]))
        elif key not in old:
            out.append(SpecChange(path, "added", new=new[key]))
        elif deep and isinstance(old[key], Mapping) and isinstance(new[key], Mapping):
            out += spec_changes(old[key], new[key], f"{path}.")
        elif old[key] != new[key]:
            out.append(SpecChange(path, "changed", old[key], new[key]))
    return tuple(out)


# -- the rules of a resume with a changed schedule -----------------------------------------


@attrs.frozen
class Carry:
    """Per callback, what a resume with a changed schedule does with its saved state."""

    #: same name and trigger: its trigger's and its own state are kept
    kept: tuple[str, ...]
    #: its trigger changed: both start afresh
    reset: tuple[str, ...]
    #: not in the old schedule: starts fresh
    added: tuple[str, ...]
    #: not in the new schedule: its saved state is dropped
    removed: tuple[str, ...]

    def lines(self) -> list[str]:
        """One line per callback whose state is not simply kept."""
        return ([f"callbacks.{n}: its trigger changed; its trigger and callback state are "
                 "reset (a saver keeps its record of the files it wrote)" for n in self.reset]
                + [f"callbacks.{n}: new; it starts fresh" for n in self.added]
                + [f"callbacks.{n}: removed; its saved state is dropped" for n in self.removed])

    def to_dict(self) -> dict[str, list[str]]:
        """The JSON record."""
        return {"kept": list(self.kept), "reset": list(self.reset),
                "added": list(self.added), "removed": list(self.removed)}


def carry(old: StoredSchedule | str, new: StoredSchedule | str) -> Carry:
    """The rules applied to two canonical schedules (``canonical``'s TOML; text is
    parsed here)."""
    a = (old if isinstance(old, StoredSchedule) else stored(old, "old schedule")).callbacks
    b = (new if isinstance(new, StoredSchedule) else stored(new, "new schedule")).callbacks
    both = [n for n in b if n in a]
    return Carry(tuple(n for n in both if a[n] == b[n]), tuple(n for n in both if a[n] != b[n]),
                 tuple(n for n in b if n not in a), tuple(n for n in a if n not in b))


@attrs.frozen
class Continuation:
    """A run of the old schedule up to a resume point, then each schedule's firings on."""

    before: tuple[Firing, ...]
    old: tuple[Firing, ...]
    new: tuple[Firing, ...]


def continue_with(old: Schedule, new: Schedule, shape: RunShape, *, from_step: int,
                  phase: str = "step_end", rules: Carry | None = None) -> Continuation:
    """Simulate ``old`` up to the end of step ``from_step`` (its ``step_end``, or its
    ``epoch_end`` with ``phase="epoch_end"``), then ``old`` on, and ``new`` on from the
    same point by the resume rules (``rules``: by default ``carry`` of the two)."""
    before, first, second = retimed(
        lambda s: Simulation(s, shape), old, new, at=from_step, phase=phase,
        kept=(_rules(old, new) if rules is None else rules).kept)
    return Continuation(before, tuple(first.iter_firings()), tuple(second.iter_firings()))


def _rules(old: Schedule, new: Schedule) -> Carry:
    a, b = canonical(old), canonical(new)
    if a is None or b is None:  # no TOML form: a callback is kept when its trigger is equal
        ta, tb = old.triggers(), new.triggers()
        return Carry(tuple(n for n in tb if n in ta and ta[n] == tb[n]),
                     tuple(n for n in tb if n in ta and ta[n] != tb[n]),
                     tuple(n for n in tb if n not in ta), tuple(n for n in ta if n not in tb))
    return carry(a, b)


# -- the firings' changes ------------------------------------------------------------------


@attrs.frozen
class FiringChange:
    """A callback's firing ``added``, ``removed``, or ``moved`` (from ``old`` to ``new``)."""

    callback: str
    kind: str
    old: Firing | None = None
    new: Firing | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON record."""
        out: dict[str, Any] = {"callback": self.callback, "change": self.kind}
        for side, f in (("old", self.old), ("new", self.new)):
            if f is not None:
                out[side] = _where(f)
        return out


def _where(f: Firing) -> dict[str, Any]:
    return {"event": f.event, "step": f.step, "epoch": f.epoch, "batch": f.timestamp.batch,
            **({"conditional": True} if f.conditional else {})}


def _key(f: Firing) -> tuple[str, int, int, int]:
    return (f.event, f.step, f.timestamp.batch, f.epoch)


def _beyond(these: list[Firing], others: list[Firing]) -> dict[str, list[Firing]]:
    """Per callback, the firings of ``these`` that ``others`` does not have (as multisets:
    a firing twice in ``these`` and once in ``others`` is beyond it once), in order."""
    left = Counter((f.callback, _key(f)) for f in others)
    out: dict[str, list[Firing]] = defaultdict(list)
    for f in these:
        k = (f.callback, _key(f))
        if left[k]:
            left[k] -= 1
        else:
            out[f.callback].append(f)
    return out


def firing_changes(old: Iterable[Firing], new: Iterable[Firing]) -> tuple[FiringChange, ...]:
    """Per callback (in order of first appearance), the firings only ``old`` or only
    ``new`` has. Of one callback at one event, the removed and added firings are paired as
    ``moved`` by nearness (``nearest_pairs``): as many pairs as the fewer side has, in time order
    (no two pairs cross), the total distance in steps the least possible, so ``every 20
    steps`` -> ``every 30 steps`` reads ``moved step 20 -> 30``, not ``280 -> 330`` beside
    ``removed 300``."""
    olds, news = list(old), list(new)
    only_old, only_new = _beyond(olds, news), _beyond(news, olds)
    out: list[FiringChange] = []
    for name in dict.fromkeys([f.callback for f in (*olds, *news)]):
        gone, came = only_old[name], only_new[name]
        moved: list[tuple[tuple[int, int, int], FiringChange]] = []
        paired_old: set[int] = set()
        paired_new: set[int] = set()
        for event in dict.fromkeys(f.event for f in (*gone, *came)):
            g = [i for i, f in enumerate(gone) if f.event == event]
            c = [i for i, f in enumerate(came) if f.event == event]
            for i, j in nearest_pairs([_place(gone[i]) for i in g], [_place(came[j]) for j in c]):
                moved.append((_place(gone[g[i]]),
                              FiringChange(name, "moved", gone[g[i]], came[c[j]])))
                paired_old.add(g[i])
                paired_new.add(c[j])
        out += [m for _, m in sorted(moved, key=lambda pm: pm[0])]
        out += [FiringChange(name, "removed", old=f) for i, f in enumerate(gone)
                if i not in paired_old]
        out += [FiringChange(name, "added", new=f) for j, f in enumerate(came)
                if j not in paired_new]
    return tuple(out)


def _place(f: Firing) -> tuple[int, int, int]:
    return (f.step, f.timestamp.batch, f.epoch)


# -- the whole comparison ----------------------------------------------------------------


@attrs.frozen
class ScheduleDiff:
    """What differs between two schedules; ``firings`` is ``None`` when not simulated."""

    spec: tuple[SpecChange, ...]
    firings: tuple[FiringChange, ...] | None
    from_step: int | None = None
    rules: Carry | None = None
    #: the checkpoint files each schedule deletes from the resume point on
    files: tuple[FileChange, ...] = ()

    @property
    def equal(self) -> bool:
        """Whether nothing differs."""
        return not self.spec and not self.firings

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``schedtrain diff --format json``)."""
        out: dict[str, Any] = {"equal": self.equal,
                               "spec": [c.to_dict() for c in self.spec]}
        if self.firings is not None:
            out["firings"] = {"from_step": self.from_step,
                              "changes": [c.to_dict() for c in self.firings]}
        if self.rules is not None:
            out["rules"] = self.rules.to_dict()
        if self.files:
            out["files"] = [f.to_dict() for f in self.files]
        return out

    def table(self, first: int = 5, *, since: str | None = None) -> str:
        """A readable report: the spec's changes, then each callback's firing changes
        (the ``first`` of each kind). ``since``: where the firings are compared from, as
        the report says it (default ``after step N``)."""
        # Thousands of callbacks make a summary, each line cut to a readable length.
        lines = [f"spec: {len(self.spec)} change{'' if len(self.spec) == 1 else 's'}"]
        lines += [f"  {c}" for c in summarized([str(c) for c in self.spec],
                                               more="more spec changes")]
        lines += self.firing_lines(first, since=since)
        if self.rules is not None:
            lines += [f"  {line}" for line in summarized(self.rules.lines(),
                                                         more="more callbacks")]
        if self.files:
            lines.append("checkpoint files:")
            lines += [f"  {f}" for f in summarized([str(f) for f in self.files],
                                                    more="more callbacks")]
        return "\n".join(lines) + "\n"

    def firing_lines(self, first: int = 5, *, since: str | None = None) -> list[str]:
        """The firings part of ``table`` (none: not simulated)."""
        lines: list[str] = []
        if self.firings is not None:
            if since is None:
                since = "" if self.from_step is None else f"after step {self.from_step}"
            lines.append(f"firings{' ' if since else ''}{since}: {len(self.firings)} changed")
            by: dict[str, list[FiringChange]] = defaultdict(list)
            for c in self.firings:
                by[c.callback].append(c)
            for name, changes in list(by.items())[:SHOWN_PROBLEMS]:
                counts = ", ".join(f"{sum(c.kind == k for c in changes)} {k}"
                                   for k in ("added", "removed", "moved"))
                lines.append(f"  {shorten(name, 100)}: {counts}")
                for kind in ("added", "removed", "moved"):
                    shown = [c for c in changes if c.kind == kind]
                    lines += [f"    {kind:<7} {_text(c)}" for c in shown[:first]]
                    if len(shown) > first:
                        lines.append(f"    ... and {len(shown) - first} more {kind}")
            if len(by) > SHOWN_PROBLEMS:
                lines.append(f"  ... and {len(by) - SHOWN_PROBLEMS:,} more callbacks")
        return lines


def _text(c: FiringChange) -> str:
    def at(f: Firing) -> str:
        return (f"{f.event} step {f.step} (epoch {f.epoch})"
                + (" if its condition holds" if f.conditional else ""))
    if c.kind == "moved":
        assert c.old is not None and c.new is not None
        return f"{at(c.old)} -> {at(c.new)}"
    f = c.new if c.new is not None else c.old
    assert f is not None
    return at(f)


def diff_texts(old: StoredSchedule | str, new: StoredSchedule | str, *,
               shape: RunShape | None = None, from_step: int | None = None,
               phase: str = "step_end", files: tuple[str, str] = ("OLD", "NEW"),
               keep: Mapping[str, Policy | None] | None = None,
               saved: Mapping[str, list[Saved]] | None = None,
               present: Present | None = None) -> ScheduleDiff:
    """Compare two TOML documents (specs, or schedules as ``canonical`` writes them).

    Args:
        old, new: the documents (text, parsed here, or ``StoredSchedule``).
        shape: simulate both over this run to compare their firings (``None``: only
            the spec's changes).
        from_step: compare the firings after this step, ``new`` taking over from ``old``
            there by the resume rules (``continue_with``); ``None``: from the start.
        phase: where at ``from_step`` the run resumes (``"step_end"``, ``"epoch_end"``).
        files: names of the two texts for error messages (a ``StoredSchedule`` has its own).
        keep, saved, present: the savers' policies, the records of their files at
            ``from_step`` and which are there: the diff then lists the files each
            schedule deletes.

    Raises:
        SpecError: either document is not a valid spec.
    """
    # A stored schedule has no [run]: its run's rules are not the diff's to judge.
    a = stored(old, files[0])
    sa = a.schedule()
    b = stored(new, files[1])
    sb = b.schedule()
    changes = spec_changes(a.doc, b.doc)
    if shape is None:
        return ScheduleDiff(changes, None)
    if from_step is None:
        fa, fb = Simulation(sa, shape).run(), Simulation(sb, shape).run()
        return ScheduleDiff(changes, firing_changes(fa, fb))
    rules = _rules(sa, sb)
    run = continue_with(sa, sb, shape, from_step=from_step, phase=phase, rules=rules)
    deleted = file_changes(run.old, run.new, keep or {}, saved or {}, present)
    return ScheduleDiff(changes, firing_changes(run.old, run.new), from_step, rules, deleted)
