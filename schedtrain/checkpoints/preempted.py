"""The preemption checkpoints no save asked for: kept out of every saver's files.

A preemption writes ``step-NNNNNNNN.pt`` of its own, at a step where a saver may not
have saved. It holds every saver's records as they were, but it is none of their saves:
counted as one, it would sit among a saver's files placed by its step alone, and a
``keep`` rule would keep it in place of the file an unbroken run keeps (an ``every``
rule's milestone). So savers never see it (``Checkpoints.paths``), and the checkpoint
owner deletes it itself once a newer finite checkpoint of the same folder has landed:
until then it is the one to resume from. A file a save asked for at the same step (the
preemption wrote it again) stays the saver's.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping
from pathlib import Path
from typing import Any

from schedtrain.checkpoints.files import NAME_RE

__all__ = ["PreemptedFiles"]


class PreemptedFiles:
    """The ``written`` keys of the preemption checkpoints that no save asked for
    (``run.preempted`` in each later checkpoint)."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def wrote(self, key: str, phase: str, written: Iterable[str]) -> None:
        """A write of ``key`` at ``phase`` begins (``written``: the keys before it)."""
        if phase != "preempt":
            if key in self.keys:  # a save asked for this name again: it is the saver's
                self.keys.remove(key)
            return
        # A key written before is a save's file that the preemption wrote again, unless
        # that write was an earlier preemption's (preempted again before any save).
        if key not in self.keys and key not in written:
            self.keys.append(key)

    def others(self, written: Iterable[str]) -> list[str]:
        """The keys of ``written`` that are not a preemption's own file."""
        return [k for k in written if k not in self.keys]

    def replaced(self, landed: Path, key: str, resolve: Callable[[str], Path]) -> list[str]:
        """The keys that a finite checkpoint ``landed`` (its key ``key``) replaces as the
        one to resume from, forgotten now: the others of its folder (``resolve``: a key's
        path)."""
        m = NAME_RE.fullmatch(landed.name)
        if m is None or m[2] is not None:  # not a resume candidate: nothing replaced
            return []
        folder = landed.parent.resolve()
        gone = [k for k in self.keys if k != key and resolve(k).parent.resolve() == folder]
        self.keys = [k for k in self.keys if k not in gone]
        return gone

    def state(self) -> list[str]:
        """The keys as plain values (``run.preempted``)."""
        return list(self.keys)

    def load(self, run: Mapping[str, Any], own: str, phase: str,
             owned: Container[str]) -> None:
        """Take a checkpoint's ``run.preempted`` (the checkpoint: ``own``, taken at
        ``phase``; ``owned``: the keys it says were committed before it). Only names
        among its ``written`` count: another entry names no file of the run. Without
        the list (written before it existed) a preemption's own file is one unless a
        save committed it first."""
        written, value = run["written"], run.get("preempted")
        if value is None:
            alone = phase == "preempt" and own not in owned and own in written
            self.keys = [own] if alone else []
            return
        entries = value if isinstance(value, list) else []
        self.keys = list(dict.fromkeys(k for k in entries if isinstance(k, str) and k in written))
