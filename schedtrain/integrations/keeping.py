"""Which of a host verb's checkpoints to keep: the savers' ``keep`` policies
(``schedtrain.retention``: latest, every, best, any) for the files a host writes when the
schedule says so (Lightning's ``"checkpoint"`` verb, the HF Trainer's ``"save"`` flag).

Each save is recorded (file name, clock, the monitored values then) when the verb asks for
it, before the write, so the host's checkpoint holds its own record and a resumed run
prunes as the unbroken one would. Once the write has landed, the verb's own files that the
policy does not keep are deleted: never a file another writer made, never the newest, never
one the host still needs (``spare``: HF's ``best_model_checkpoint``). Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from schedtrain.checkpoints.files import plain_name
from schedtrain.integrations.driver_state import DriverStateError, count
from schedtrain.readback import MAX_LIST, printable
from schedtrain.retention import Policy, Saved, parse_keep, retained
from schedtrain.time import Timestamp

__all__ = ["HostKeep", "host_keeps", "host_policies", "load_keeps", "save_kept"]

KeepArg = Policy | int | Mapping[str, Any]


def host_policies(keep: Mapping[str, KeepArg | None] | None, bound: Mapping[str, Any],
                  verb: str) -> dict[str, Policy]:
    """``keep`` (callback name -> a policy, ``N`` or its TOML table) checked against what
    each name is bound to: only callbacks bound to ``verb`` write files to keep."""
    out: dict[str, Policy] = {}
    for name, value in (keep or {}).items():
        if bound.get(name) != verb:
            raise ValueError(f"keep[{name!r}]: only a callback bound to {verb!r} writes "
                             f"checkpoints to keep, and {name!r} is bound to "
                             f"{bound.get(name)!r}")
        try:
            policy = parse_keep(value)
        except ValueError as exc:
            raise ValueError(f"keep[{name!r}]: {exc}") from None
        if policy is not None:
            out[name] = policy
    return out


class HostKeep:
    """The saves one verb-bound callback asked for, and its policy over them."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.saved: dict[str, Saved] = {}  # file name -> record, in save order

    @property
    def monitors(self) -> tuple[str, ...]:
        """The metrics whose values at a save the policy ranks by."""
        return self.policy.monitors()

    def record(self, name: str, at: Timestamp, values: Mapping[str, Any]) -> None:
        """A save of ``name`` is asked for now, with the monitors' ``values`` (a ``None``
        one left out); one at the same name replaces it."""
        self.saved.pop(name, None)
        self.saved[name] = Saved(name, at, True, {m: float(v) for m, v in values.items()
                                                  if v is not None})

    def save(self, path: Path, at: Timestamp, values: Mapping[str, Any],
             write: Callable[[Path], object], *, delete: Callable[[Path], object],
             prune: bool = True) -> None:
        """Record a save of ``path`` (the monitors' ``values`` then; a missing one is left
        out), ``write(path)``, then (``prune``: on the chief) prune its folder."""
        self.record(path.name, at, {m: values.get(m) for m in self.monitors})
        write(path)
        if prune:
            self.prune(path.parent, delete)

    def prune(self, folder: Path, delete: Callable[[Path], object],
              spare: Iterable[str] = ()) -> list[str]:
        """Delete (``delete(path)``) the recorded files of ``folder`` the policy does not
        keep (of those that exist, sparing the names ``spare``); the names deleted."""
        mine = [s for s in self.saved.values() if (folder / s.name).exists()]
        keep = retained(self.policy, mine)
        kept = set(spare)
        gone = []
        for i, s in enumerate(mine):
            if i not in keep and s.name not in kept:
                delete(folder / s.name)
                self.saved.pop(s.name, None)
                gone.append(s.name)
        return gone

    def state(self) -> list[list[Any]]:
        """The records as JSON data (the host's checkpoint keeps them)."""
        return [[s.name, s.at.step, s.at.batch, s.at.epoch, s.at.step_in_epoch, s.at.sample,
                 s.at.token, s.at.time_ns, dict(s.values)] for s in self.saved.values()]

    def load(self, rows: object, where: str = "keep") -> None:
        """Restore ``state()``, each record checked first (``where``: its key path): a
        name is one plain file name (never a path: ``prune`` deletes ``folder / name``),
        the counters whole numbers, the values finite numbers; a damaged one raises
        ``DriverStateError`` naming its key path, and nothing is restored."""
        self.saved = {n: Saved(n, at, True, v) for n, at, v in _rows(rows, where)}


def _rows(rows: object, where: str) -> list[tuple[str, Timestamp, dict[str, float]]]:
    if not isinstance(rows, list | tuple) or len(rows) > MAX_LIST:
        raise DriverStateError(where, f"a list of at most {MAX_LIST:,} saves", rows)
    out = []
    for i, row in enumerate(rows):
        at = f"{where}[{i}]"
        if not isinstance(row, list | tuple) or len(row) != 9:
            raise DriverStateError(at, "a list of 9 (file name, 7 counters, values)", row)
        try:
            name = plain_name(row[0], "a kept checkpoint's name")
            if printable(name) != name:  # no name saved by the host holds one
                raise ValueError(f"{printable(name)[:60]!r} holds a control character")
        except ValueError as exc:
            raise DriverStateError(f"{at}[0]", "one plain file name, no folder part",
                                   printable(str(exc))[:120]) from None
        counters = [count(c, f"{at}[{j}]") for j, c in enumerate(row[1:8], 1)]
        values = row[8]
        if not isinstance(values, Mapping):
            raise DriverStateError(f"{at}[8]", "a table of monitored values", values)
        for k, v in values.items():
            if (not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int | float)
                    or not math.isfinite(v)):
                raise DriverStateError(f"{at}[8].{printable(str(k))[:60]}",
                                       "a finite number", v)
        out.append((name, Timestamp.make(*counters), {k: float(v) for k, v in values.items()}))
    return out



def load_keeps(keeps: Mapping[str, HostKeep], saved: object) -> None:
    """Restore each ``HostKeep.state()`` of ``saved`` (by callback name) that ``keeps`` has;
    one ``keeps`` has and ``saved`` lacks is damage (its files would be left behind), as
    is any damaged record (``DriverStateError``, key path ``keep.NAME[i][j]``). All are
    checked before any is restored."""
    if not isinstance(saved, Mapping):
        raise DriverStateError("keep", "a table of saves by callback name", saved)
    missing = sorted(set(keeps) - set(saved))
    if missing:
        raise DriverStateError(f"keep.{printable(missing[0])}", "the saves recorded for "
                               "this saver's keep policy", "nothing")
    loaded = {n: _rows(saved[n], f"keep.{printable(n)}") for n in keeps}
    for name, rows in loaded.items():
        keeps[name].saved = {n: Saved(n, at, True, v) for n, at, v in rows}


def host_keeps(keep: Mapping[str, KeepArg | None] | None, bound: Mapping[str, Any],
               verb: str) -> dict[str, HostKeep]:
    """A ``HostKeep`` per callback that ``keep`` names (``host_policies`` checks them)."""
    return {n: HostKeep(p) for n, p in host_policies(keep, bound, verb).items()}


def save_kept(kept: HostKeep | None, path: Path, at: Timestamp, values: Mapping[str, Any],
              write: Callable[[Path], object], *, delete: Callable[[Path], object],
              prune: bool = True) -> None:
    """``write(path)``; with ``kept``, recorded first and pruned after (``HostKeep.save``)."""
    if kept is None:
        write(path)
    else:
        kept.save(path, at, values, write, delete=delete, prune=prune)
