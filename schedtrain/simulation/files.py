"""Which checkpoint files a simulated run leaves after each save.

``planned_files(log, {"save": policy})`` replays a firing log through the retention
rules a ``ModelSaver`` applies (``schedtrain.retention``): after each firing of a named
saver, the files of its folder that still exist. A ``SaverFiles`` in place of the policy
plans a ``MinSaver``/``MaxSaver`` (the best file and its history) or a ``TopKSaver``
(``last.pt`` and the ranked files). Every planned save is taken as finite and as
written (a conditional firing counts as a save): the plan is the most the run keeps.
A ``Best`` rule ranks by the values ``values`` gives at each save; without them it ranks
nothing, and ``best_slots`` says how many files it may add. Without values, each firing
of a ``MinSaver`` is taken as a new best.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal

import attrs

from schedtrain.retention import AnyOf, Best, Every, Latest, Policy, Saved, retained, saved_at
from schedtrain.schedule.firings import Firing
from schedtrain.time import Timestamp

__all__ = ["SaveFiles", "SaverFiles", "best_slots", "planned_files"]

#: Events at which no epoch is in progress (a save there ends the epoch before it).
_BETWEEN = frozenset({"train_start", "epoch_end", "train_end"})


@attrs.frozen
class SaverFiles:
    """How one saver names and keeps its files, for a plan.

    Args:
        kind: ``"model"`` (``ModelSaver``: ``step-00000120.pt`` at each firing),
            ``"transformers"`` (the HF ``"save"`` flag: ``checkpoint-120``), ``"lightning"``
            (the Lightning ``"checkpoint"`` verb: ``NAME-epoch=E-step=120.ckpt``), ``"host"``
            (a host verb's saves in a plan, which knows no host: ``NAME-step=120``), ``"best"``
            (``MinSaver``/``MaxSaver``: ``filename`` at each new best, and with ``keep``
            its history ``<stem>-step-00000120.pt``) or ``"topk"`` (``TopKSaver``:
            ``<monitor>-step-00000120.pt`` where a rule keeps it, and ``last.pt``).
        keep: the retention policy (``None``: a ``ModelSaver`` keeps all, a best saver
            no history, a ``TopKSaver`` no ranked file).
        monitor: the metric a best saver or ``TopKSaver`` ranks by.
        mode: ``"min"`` or ``"max"``.
        filename: a best saver's one best file.
        save_last: a ``TopKSaver`` writes ``last.pt`` at each firing.
    """

    kind: Literal["model", "transformers", "lightning", "host", "best", "topk"] = "model"
    keep: Policy | None = None
    monitor: str = "val/loss"
    mode: Literal["min", "max"] = "min"
    filename: str = ""
    save_last: bool = False

    def monitors(self) -> tuple[str, ...]:
        """The metrics whose values at a save decide its files."""
        own = (self.monitor,) if self.kind in ("best", "topk") else ()
        rules = self.keep.monitors() if self.keep is not None else ()
        return tuple(dict.fromkeys((*own, *rules)))

    def name(self, step: int, epoch: int = 0, callback: str = "") -> str:
        """The file a save at ``step`` writes (the history's, for a best saver); a
        Lightning verb's name also has the epoch counter and the callback's name."""
        if self.kind == "model":
            return f"step-{step:08d}.pt"
        if self.kind == "transformers":
            return f"checkpoint-{step}"
        if self.kind == "lightning":
            return f"{callback}-epoch={epoch}-step={step}.ckpt"
        if self.kind == "host":
            return f"{callback}-step={step}"
        stem = self.filename.removesuffix(".pt") if self.kind == "best" \
            else self.monitor.replace("/", "-")
        return f"{stem}-step-{step:08d}.pt"


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


def best_slots(policy: Policy | SaverFiles | None) -> int:
    """How many files ``Best`` rules of ``policy`` may keep (what a plan without
    metric values cannot place)."""
    if isinstance(policy, SaverFiles):
        policy = policy.keep
    rules = policy.rules if isinstance(policy, AnyOf) else (policy,)
    return sum(r.n for r in rules if isinstance(r, Best))


def planned_files(
    log: Iterable[Firing],
    keep: Mapping[str, Policy | SaverFiles | None],
    values: Callable[[Firing], Mapping[str, float]] | None = None,
    *,
    existing: Mapping[str, Sequence[Saved]] | None = None,
) -> list[SaveFiles]:
    """After each firing of a saver named in ``keep``, the files its folder holds.

    Args:
        log: the firings (``simulate()``'s log, or a plan's).
        keep: saver name -> its retention policy (a ``ModelSaver``; ``None``: it keeps
            all) or a ``SaverFiles``.
        values: the monitored metric values at a firing, for ``Best`` rules and for
            the best savers' comparisons (``None``: unknown).
        existing: saver name -> the records of its files already there, oldest first
            (a run resumed part-way: ``log`` holds the firings after that point).
    """
    savers = {n: k if isinstance(k, SaverFiles) else SaverFiles(keep=k) for n, k in keep.items()}
    saved: dict[str, list[Saved]] = {name: list((existing or {}).get(name, ()))
                                     for name in keep}
    fixed: dict[str, tuple[str, ...]] = dict.fromkeys(keep, ())  # best file, last.pt
    best: dict[str, float] = {}
    # A saver whose policy is decided as each save comes (``_Rolling``) keeps its files
    # without replaying the rules over all of them at each save.
    rolling = {n: r for n, saver in savers.items() if not saved[n]
               for r in [_Rolling.of(saver)] if r is not None}
    out: list[SaveFiles] = []
    for firing in log:
        mine = saved.get(firing.callback)
        if mine is None:
            continue
        saver = savers[firing.callback]
        got = dict(values(firing)) if values is not None else {}
        name = saver.name(firing.step, firing.timestamp.epoch, firing.callback)
        # Between epochs (``epoch_end``, ``train_end`` after one) as a saver records it.
        at = saved_at(firing.timestamp, between_epochs=firing.event in _BETWEEN)
        made = Saved(name, at, True, got)
        roll = rolling.get(firing.callback)
        if roll is not None:
            out.append(SaveFiles(firing.callback, firing.timestamp, roll.add(made)))
            continue
        new: Saved | None = made
        if saver.kind == "best":
            value = got.get(saver.monitor, math.nan)
            before = best.get(firing.callback)
            if values is not None and (math.isnan(value) or (before is not None and (
                    value >= before if saver.mode == "min" else value <= before))):
                new = None  # not a new best: nothing written
            else:
                best[firing.callback] = value
                fixed[firing.callback] = (saver.filename,)
                if saver.keep is None:
                    new = None
        elif saver.kind == "topk":
            if saver.save_last:
                fixed[firing.callback] = ("last.pt",)
            others = [s for s in mine if s.name != name]
            if saver.keep is None or len(others) not in saver.keep.keeps([*others, made]):
                new = None
        if new is not None:
            _replay(saver.keep, mine, new)
        out.append(SaveFiles(firing.callback, firing.timestamp,
                             fixed[firing.callback] + tuple(s.name for s in mine)))
    return out


def _replay(policy: Policy | None, mine: list[Saved], new: Saved) -> None:
    """Add ``new`` to the files ``mine`` (oldest first) and keep what ``policy`` keeps of
    them all: the rules' own definition, over every file at each save."""
    mine[:] = [s for s in mine if s.name != new.name]  # saved again: the file is replaced
    mine.append(new)
    kept = retained(policy, mine)
    mine[:] = [s for i, s in enumerate(mine) if i in kept]


class _Rolling:
    """The files of a saver whose every save is finite and whose policy is ``Latest`` and
    ``Every`` rules on counters that only grow (not epochs): what ``_replay`` keeps,
    decided per save.

    Why it is the same: in the files ``_replay`` keeps, the first file of each grid cell
    of an ``Every`` rule is kept by that rule, so a file the rule keeps when it comes
    stays kept (only files after it in its cell are ever deleted), and one it does not
    keep never becomes kept (its cell's first file stays before it). The other files are
    kept while among the newest ``window`` (the largest ``Latest``, or the newest finite
    file). A save that replaces a file of the same name is replayed in full."""

    def __init__(self, policy: Policy | None, window: int, everies: tuple[Every, ...]) -> None:
        self.policy, self.window, self.everies = policy, window, everies
        self.grids = tuple((r.period.counter, r.period.base) for r in everies)
        self.files: list[Saved] = []
        self.names: list[str] = []
        self.kept: list[bool] = []  # kept by an Every rule for good
        self.present: set[str] = set()
        self.replaying = False  # a counter went back: the argument above no longer holds

    @classmethod
    def of(cls, saver: SaverFiles) -> _Rolling | None:
        """The rolling form of ``saver``'s files, or ``None`` where it has none."""
        if saver.kind in ("best", "topk"):
            return None
        policy = saver.keep
        if policy is None:
            return cls(None, -1, ())
        rules = policy.rules if isinstance(policy, AnyOf) else (policy,)
        if not all(isinstance(r, Latest) or (isinstance(r, Every)
                                             and r.period.counter != "epoch") for r in rules):
            return None
        window = max([1, *(r.n for r in rules if isinstance(r, Latest))])
        return cls(policy, window, tuple(r for r in rules if isinstance(r, Every)))

    def add(self, made: Saved) -> tuple[str, ...]:
        """Save ``made``; the names of the files kept, oldest first."""
        files, names, kept = self.files, self.names, self.kept
        last = files[-1].at if files else None
        forever, grows = False, True
        for counter, base in self.grids:
            before, now = (last.get(counter) if last is not None else 0), made.at.get(counter)
            grows = grows and now >= before
            if now // base > before // base:
                forever = True
        self.replaying = self.replaying or not grows
        if made.name in self.present or self.replaying:
            return self._replay(made)
        files.append(made)
        names.append(made.name)
        kept.append(forever)
        self.present.add(made.name)
        old = len(files) - 1 - self.window
        if self.window > 0 and old >= 0 and not kept[old]:
            self.present.discard(names[old])
            del files[old], names[old], kept[old]
        return tuple(names)

    def _replay(self, made: Saved) -> tuple[str, ...]:
        _replay(self.policy, self.files, made)
        self.names[:] = [s.name for s in self.files]
        self.present = set(self.names)
        self.kept[:] = [False] * len(self.files)
        for rule in self.everies:
            for i in rule.keeps(self.files):
                self.kept[i] = True
        return tuple(self.names)
