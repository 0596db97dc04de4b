"""Schedule coverage: which parts of each simulated trigger never decided a firing.

A callback's trigger is cut into parts: the ``all``, ``any`` and ``not`` nodes and their
leaves, each with its key path (``val.trigger.any[1]``) and TOML spelling. At each point
where a callback is evaluated, each part has a value; a part *decided* the outcome there
when flipping it alone would flip the callback's (the other children of an ``all``
held, those of an ``any`` did not). Per part, ``CallbackCoverage`` keeps:

* **fired**: it decided a firing (for the trigger itself: the callback fired);
* **blocked**: it decided against one (only asked of the children of an ``all`` and of
  ``not``: a window that never kept its ``every`` from firing was never tested).

``gaps()`` lists the parts that never did, the most telling first: of an ``all`` that
never fired, the parts that were never true (the window never entered), not the
``every`` it kept out. ``testing.recorder`` watches simulations and feeds these records.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from schedtrain.triggers.base import AllOf, AnyOf, Not, Trigger
from schedtrain.triggers.conditions import When
from schedtrain.triggers.metric import MetricTrigger
from schedtrain.triggers.windows import Window

__all__ = ["FALSE", "TRUE", "UNKNOWN", "UNSEEN", "CallbackCoverage", "Gap", "Part", "kind_of"]

#: A part's value at one evaluation (``UNSEEN``: it was not evaluated there).
UNSEEN, FALSE, TRUE, UNKNOWN = -1, 0, 1, 2
_LABEL_WIDTH = 60
#: What a record has seen of each part (``CallbackCoverage``'s lists, one flag a part).
_SEEN = ("evaluated", "true", "fired", "blocked")


@attrs.frozen
class Part:
    """One part of a callback's trigger: where it is, what it is, where it sits."""

    path: str
    label: str
    kind: str  # "all", "any", "not" or "leaf"
    what: str  # "window", "condition", "metric trigger", or "trigger"
    parent: int
    children: tuple[int, ...]
    dynamic: bool

    @property
    def named(self) -> str:
        """The key path and the part as written in TOML."""
        return f"{self.path} ({self.label})"


@attrs.frozen
class Gap:
    """A part that never decided a firing (or never blocked one), and where it was run."""

    callback: str
    part: Part
    problem: str
    where: str

    def __str__(self) -> str:
        return f"{self.part.named}: {self.problem}"


def _label(trigger: Trigger) -> str:
    from schedtrain.spec.write import toml_value, trigger_table

    try:
        text = toml_value(trigger_table(trigger))[2:-2]  # the inline table's keys
    except (ValueError, TypeError):
        text = repr(trigger)
    return text if len(text) <= _LABEL_WIDTH else text[:_LABEL_WIDTH - 3] + "..."


def _what(trigger: Trigger) -> str:
    if isinstance(trigger, Window):
        return "window"
    if isinstance(trigger, When):
        return "condition"
    if isinstance(trigger, MetricTrigger):
        return "metric trigger"
    return "trigger"


def kind_of(trigger: Trigger) -> str:
    """``"all"``, ``"any"``, ``"not"``, or ``"leaf"`` for every other trigger."""
    # Only the library's own compositions are opened: a subclass compiles its own way.
    return {AllOf: "all", AnyOf: "any", Not: "not"}.get(type(trigger), "leaf")


def _parts(trigger: Trigger, path: str, parent: int, out: list[Part]) -> None:
    index = len(out)
    kind = kind_of(trigger)
    out.append(Part(path, _label(trigger), kind, _what(trigger), parent, (), trigger.dynamic))
    kids = []
    if kind != "leaf":
        for i, child in enumerate(trigger.children()):
            kids.append(len(out))
            _parts(child, path + trigger.child_path(i), index, out)
    out[index] = attrs.evolve(out[index], children=tuple(kids))


class CallbackCoverage:
    """What the simulations of one callback (its name and trigger) showed of its parts."""

    def __init__(self, name: str, trigger: Trigger, where: str) -> None:
        self.name = name
        self.where = where
        parts: list[Part] = []
        _parts(trigger, f"{name}.trigger", -1, parts)
        self.parts: tuple[Part, ...] = tuple(parts)
        self.pure = trigger.pure
        n = len(parts)
        self.evaluated = [False] * n
        self.true = [False] * n
        self.fired = [False] * n
        self.blocked = [False] * n

    def to_data(self) -> dict[str, Any]:
        """The record as plain data (JSON-able): what crosses from a pytest-xdist worker."""
        return {"name": self.name, "where": self.where, "pure": self.pure,
                "parts": [{**attrs.asdict(p), "children": list(p.children)} for p in self.parts],
                **{k: list(getattr(self, k)) for k in _SEEN}}

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> CallbackCoverage:
        """The record ``to_data`` gave (no trigger needed: its parts are in the data)."""
        self = cls.__new__(cls)
        self.name, self.where, self.pure = data["name"], data["where"], bool(data["pure"])
        self.parts = tuple(Part(**{**p, "children": tuple(p["children"])})
                           for p in data["parts"])
        for k in _SEEN:
            setattr(self, k, [bool(v) for v in data[k]])
        return self

    def merge(self, other: CallbackCoverage) -> None:
        """Add what ``other`` (the same callback, simulated elsewhere) saw to this record."""
        if other.parts != self.parts:
            raise ValueError(f"cannot merge the coverage of {other.name!r}: its parts differ")
        for k in _SEEN:
            mine: list[bool] = getattr(self, k)
            mine[:] = [a or b for a, b in zip(mine, getattr(other, k), strict=True)]

    def blocks(self, i: int) -> bool:
        """Whether part ``i`` is asked to have blocked a firing."""
        p = self.parts[i]
        return p.kind == "not" or (p.parent >= 0 and self.parts[p.parent].kind == "all")

    def open_blocks(self) -> Iterator[int]:
        """Parts of an ``all`` (not below a ``not``) that have not blocked a firing yet."""
        for i, p in enumerate(self.parts):
            if not self.blocked[i] and p.parent >= 0 and self.parts[p.parent].kind == "all" \
                    and not self._under_not(i):
                yield i

    def _under_not(self, i: int) -> bool:
        parent = self.parts[i].parent
        while parent >= 0:
            if self.parts[parent].kind == "not":
                return True
            parent = self.parts[parent].parent
        return False

    def observe(self, values: list[int], fired: bool) -> None:
        """One evaluation: each part's value (``UNSEEN`` where it was not evaluated)."""
        parts = self.parts
        decisive = [False] * len(parts)
        decisive[0] = values[0] in (FALSE, TRUE)
        for i, p in enumerate(parts):  # parents come before their children
            v = values[i]
            if v == UNSEEN:
                continue
            self.evaluated[i] = True
            self.true[i] = self.true[i] or v == TRUE
            if not decisive[i]:
                continue
            if fired:
                self.fired[i] = True
            else:
                self.blocked[i] = True
            for c in p.children:
                if values[c] not in (FALSE, TRUE):
                    continue
                others = [values[s] for s in p.children if s != c]
                if p.kind == "all":  # children skipped after a false one do not count
                    decisive[c] = all(o in (TRUE, UNSEEN) for o in others)
                elif p.kind == "any":
                    decisive[c] = all(o == FALSE for o in others)
                else:
                    decisive[c] = True

    def gaps(self) -> list[Gap]:
        """The parts that never decided a firing, most telling first (see the module)."""
        out: list[Gap] = []
        self._walk(0, out)
        return out

    def _gap(self, i: int, problem: str, out: list[Gap]) -> None:
        out.append(Gap(self.name, self.parts[i], problem, self.where))

    def _walk(self, i: int, out: list[Gap]) -> None:
        p = self.parts[i]
        if not self.evaluated[i]:
            self._gap(i, "never evaluated: no simulation reached an event it watches", out)
            return
        if not self.fired[i]:
            if p.kind == "all":
                never = [c for c in p.children if not self.true[c]]
                for c in never:
                    self._walk(c, out)
                if not never:
                    self._gap(i, "never fired: its parts were never true at one point", out)
            elif p.kind == "any":
                for c in p.children:
                    self._walk(c, out)
            else:
                self._gap(i, self._never_fired(i), out)
            return
        if self.blocks(i) and not self.blocked[i] and (self.pure or p.dynamic):
            self._gap(i, self._never_blocked(i), out)
        if p.kind in ("all", "any"):
            for c in p.children:
                self._walk(c, out)

    def _never_fired(self, i: int) -> str:
        p = self.parts[i]
        if p.kind == "not":
            return "`not` never let a firing through"
        if self.true[i]:
            return "never fired alone: each time it was true another branch fired too"
        if p.what == "window":
            return "window never entered"
        if p.what == "condition":
            return "condition never true"
        if p.what == "metric trigger":
            return "metric trigger never fired"
        return "never fired" if p.parent < 0 else "never true"

    def _never_blocked(self, i: int) -> str:
        what = self.parts[i].what
        if self.parts[i].kind == "not":
            return "`not` never blocked a firing"
        if what == "window":
            return "window never blocked a firing: the rest never held outside it"
        if what == "condition":
            return "condition never false where the rest held"
        return f"{what} never blocked a firing: the rest of its `all` never held without it"
