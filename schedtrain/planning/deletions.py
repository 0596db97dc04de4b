"""Which checkpoint files a changed schedule deletes: a resumed run's savers go on from
the records of the files they wrote (``retention``), and each schedule's later saves
prune them by the savers' ``keep`` (``simulation.planned_files``). The changed-schedule
refusal and ``schedtrain diff`` list them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from schedtrain.retention import Policy, Saved, retained, saved_row
from schedtrain.schedule.firings import Firing
from schedtrain.simulation.files import planned_files

__all__ = ["FileChange", "Present", "file_changes", "saved_records"]

#: Which of a saver's files (its name, their names) are there now.
Present = Callable[[str, list[str]], set[str]]


@attrs.frozen
class FileChange:
    """Of a saver's files there at the resume point, those each schedule deletes by the
    end of the run (its ``keep`` applied to its records and its later saves)."""

    callback: str
    there: tuple[str, ...]
    old: tuple[str, ...]
    new: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """The JSON record."""
        return {"callback": self.callback, "there": list(self.there),
                "deleted_by_old": list(self.old), "deleted_by_new": list(self.new)}

    def __str__(self) -> str:
        def names(files: tuple[str, ...]) -> str:
            shown = ", ".join(files[:6]) + (f" and {len(files) - 6} more" if len(files) > 6
                                            else "")
            return shown or "none"
        return (f"{self.callback}: of its {len(self.there)} checkpoint files there now, "
                f"the new schedule deletes {names(self.new)} (the old one: "
                f"{names(self.old)})")


def file_changes(old: Sequence[Firing], new: Sequence[Firing],
                 keep: Mapping[str, Policy | None],
                 saved: Mapping[str, list[Saved]],
                 present: Present | None = None) -> tuple[FileChange, ...]:
    """Per saver of ``keep`` (name -> its policy) with records in ``saved`` (its files at
    the resume point), the files each schedule's firings after that point (``old``,
    ``new``) delete by the end of the run. ``present(saver, names)`` says which files
    are there now; without it, those ``keep`` leaves of the records."""
    out = []
    for name, recorded in saved.items():
        if name not in keep or not recorded:
            continue
        # A checkpoint holds the records as they were before its own save's prune ran.
        if present is not None:
            here = present(name, [s.name for s in recorded])
            records = [s for s in recorded if s.name in here]
        else:
            records = [recorded[i] for i in sorted(retained(keep[name], recorded))]
        there = tuple(s.name for s in records)
        gone = []
        for firings in (old, new):
            after = planned_files(firings, {name: keep[name]}, existing={name: records})
            left = set(after[-1].files) if after else set(there)
            gone.append(tuple(n for n in there if n not in left))
        out.append(FileChange(name, there, gone[0], gone[1]))
    return tuple(out)


def saved_records(states: object, names: Iterable[str]) -> dict[str, list[Saved]]:
    """The records of the files of savers ``names`` in a checkpoint's callback
    ``states`` (a saver whose records cannot be read is left out: not planned)."""
    out: dict[str, list[Saved]] = {}
    for name in names:
        state = states.get(name) if isinstance(states, dict) else None
        rows = state.get("records") if isinstance(state, dict) else None
        try:
            records = {s.name: s for s in map(saved_row, rows or [])}
        except (TypeError, ValueError):
            continue
        out[name] = list(records.values())
    return out
