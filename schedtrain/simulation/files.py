"""Which checkpoint files a simulated run leaves after each save.

``planned_files(log, {"save": policy})`` replays a firing log through the retention
rules a ``ModelSaver`` applies (``schedtrain.retention``): after each firing of a named
saver, the files of its folder that still exist. Every planned save is taken as finite
and as written (a conditional firing counts as a save): the plan is the most the run
keeps. A ``Best`` rule ranks by the values ``values`` gives at each save; without
them it ranks nothing, and ``Retention.best_slots`` says how many files it may add.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import attrs

from schedtrain.retention import AnyOf, Best, Policy, Saved, retained
from schedtrain.schedule.firings import Firing
from schedtrain.time import Timestamp

__all__ = ["SaveFiles", "best_slots", "planned_files"]


@attrs.frozen
class SaveFiles:
    """The files of one saver's folder right after one of its saves.

    Args:
        callback: the saver.
        at: the clock at the save.
        files: the checkpoint file names that exist then, oldest first.
    """

    callback: str
    at: Timestamp
    files: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        """The plan's JSON record."""
        return {"callback": self.callback, "step": self.at.step,
                "seconds": self.at.seconds, "files": list(self.files)}


def best_slots(policy: Policy | None) -> int:
    """How many files ``Best`` rules of ``policy`` may keep (what a plan without
    metric values cannot place)."""
    rules = policy.rules if isinstance(policy, AnyOf) else (policy,)
    return sum(r.n for r in rules if isinstance(r, Best))


def planned_files(
    log: Iterable[Firing],
    keep: Mapping[str, Policy | None],
    values: Callable[[Firing], Mapping[str, float]] | None = None,
) -> list[SaveFiles]:
    """After each firing of a saver named in ``keep``, the files its folder holds.

    Args:
        log: the firings (``simulate()``'s log, or a plan's).
        keep: saver name -> its retention policy (``None``: it keeps all).
        values: the monitored metric values at a firing, for ``Best`` rules.
    """
    saved: dict[str, list[Saved]] = {name: [] for name in keep}
    out: list[SaveFiles] = []
    for firing in log:
        mine = saved.get(firing.callback)
        if mine is None:
            continue
        name = f"step-{firing.step:08d}.pt"
        if mine and mine[-1].name == name:
            mine.pop()  # saved again at the same step: the file is replaced
        mine.append(Saved(name, firing.timestamp, True,
                          dict(values(firing)) if values is not None else {}))
        kept = retained(keep[firing.callback], mine)
        mine[:] = [s for i, s in enumerate(mine) if i in kept]
        out.append(SaveFiles(firing.callback, firing.timestamp, tuple(s.name for s in mine)))
    return out
