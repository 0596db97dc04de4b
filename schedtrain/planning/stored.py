"""A schedule as a run stores it: its canonical TOML, parsed once.

A run keeps its schedule as canonical TOML (``planning.changes.canonical``): in every
checkpoint, in ``run.json``, in a retime request and in ``retimes.json``. The rules
that judge a change (``live_refusal``, ``carry``, ``diff_texts``) each read the tables
of both sides; a ``StoredSchedule`` carries the text with its parsed tables, and the
spec and schedule built from them on first use, so one request parses each text once
however many rules read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from schedtrain.events import EventSet
from schedtrain.schedule.schedule import Schedule
from schedtrain.spec.document import parse_toml
from schedtrain.spec.problems import Problems

if TYPE_CHECKING:
    from schedtrain.spec.model import Spec

__all__ = ["StoredSchedule", "stored"]


class StoredSchedule:
    """A TOML schedule (or whole spec) and its parsed tables; equal by text.

    Built with ``parse`` (the TOML read there, once); ``spec``, ``schedule`` and
    ``events`` are built from the parsed tables when first asked, then kept. Treat
    ``doc`` as read-only: it is shared by every rule that reads it.

    Args:
        text: the TOML document.
        doc: the document parsed.
        source: its name in error messages (``"running schedule"``, a file's path).
    """

    __slots__ = ("_events", "_schedule", "_spec", "callbacks", "doc", "source", "text")

    def __init__(self, text: str, doc: Mapping[str, Any], source: str) -> None:
        self.text, self.doc, self.source = text, doc, source
        found = doc.get("callbacks", {})
        #: The ``[callbacks]`` table: name -> its table (as written, trigger included);
        #: an attribute, as every rule reads it (kept with the parsed tables).
        self.callbacks: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        self._spec: Spec | None = None
        self._schedule: Schedule | None = None
        self._events: dict[str, EventSet] | None = None

    @classmethod
    def parse(cls, text: str, source: str = "schedule") -> StoredSchedule:
        """Parse ``text``.

        Raises:
            SpecError: it is not TOML (the line and column said).
        """
        problems = Problems(source)
        doc = parse_toml(text, problems)
        if problems.items:  # the call only where it raises: a live retime parses here
            problems.raise_if_any()
        assert doc is not None
        return cls(text, doc, source)

    def spec(self) -> Spec:
        """The document read as a schedule (``loads_spec(..., schedule_only=True)``).

        Raises:
            SpecError: it is not a valid schedule.
        """
        if self._spec is None:
            # The loader and its checkers: a run imports them only to read a schedule it stored.
            from schedtrain.spec.load import read_spec

            self._spec = read_spec(dict(self.doc), self.source, schedule_only=True)
        return self._spec

    def schedule(self) -> Schedule:
        """The core ``Schedule`` of ``spec`` (one object: do not change it)."""
        if self._schedule is None:
            self._schedule = self.spec().schedule()
        return self._schedule

    def events(self) -> dict[str, EventSet]:
        """Callback name -> the events its trigger is evaluated at."""
        if self._events is None:
            self._events = {e.default_name(): e.trigger.events()
                            for e in self.schedule().entries}
        return self._events

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StoredSchedule) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"StoredSchedule({self.source!r}, {len(self.text):,} characters)"


def stored(schedule: StoredSchedule | str, source: str) -> StoredSchedule:
    """``schedule`` as a ``StoredSchedule`` (text parsed here, named ``source``). The
    rules that take either (``live_refusal``, ``carry``) test ``isinstance`` first: what
    a running job hands them is parsed already.

    Raises:
        SpecError: text that is not TOML.
    """
    return schedule if isinstance(schedule, StoredSchedule) else StoredSchedule.parse(
        schedule, source)
