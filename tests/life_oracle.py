"""An independent oracle for a run's life, from the documented rules (docs/concepts.md,
docs/checkpoints.md), not from the code under test: the firings of a schedule history
(crossing semantics on the run's absolute counters; a change takes over after its
position) and the files a keep policy leaves (latest, the last save at or before each
multiple of N epochs, the best by val/loss put at the save's step, the newest always).
The auto saver's firings follow the wall clock: its files are judged from the firings
the run logged."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomllib
from jobs.lifecycle import STEPS_PER_EPOCH
from life_specs import Keep, Schedule

#: An evaluation point: (step, rank) with rank 0 step_end, 1 epoch_end, 2 train_end.
Point = tuple[int, int]
EVENTS = {0: "step_end", 1: "epoch_end", 2: "train_end"}
PHASES = {"step_end": 0, "epoch_end": 1, "train_end": 2, "preempt": 0}
RANKS = {"step_end": 0, "epoch_end": 1, "train_end": 2}
Firing = tuple[str, str, int]  # (callback, event, step)


def schedule_of(text: str) -> Schedule:
    """The lifecycle schedule a canonical TOML text holds (its own reading)."""
    cbs = tomllib.loads(text)["callbacks"]
    ckpt = cbs["ckpt"]["trigger"]
    end = "any" in ckpt
    every = ckpt["any"][0]["every"] if end else ckpt["every"]
    v = cbs["validate"]["trigger"]["every"]
    return Schedule(validate=v, ckpt=every, ckpt_end=end, best="best" in cbs)


def _period(text: str) -> tuple[int, int] | None:
    """(k, rank) for "k steps"/"k epochs"; None for auto."""
    if text == "auto":
        return None
    n, unit = text.split()
    return int(n), (1 if unit.startswith("epoch") else 0)


def _due(period: str, p: Point) -> bool:
    got = _period(period)
    if got is None:
        return False
    k, rank = got
    step, at = p
    if rank != at:
        return False
    return (step % k == 0) if rank == 0 else ((step // STEPS_PER_EPOCH) % k == 0)


def points(end: int) -> list[Point]:
    out: list[Point] = []
    for s in range(1, end + 1):
        out.append((s, 0))
        if s % STEPS_PER_EPOCH == 0:
            out.append((s, 1))
    out.append((end, 2))
    return out


def expected_firings(history: Sequence[tuple[Point, Schedule]], end: int,
                     val_loss: dict[int, float]) -> list[Firing]:
    """Every firing (auto saves aside) of the schedules in ``history`` (each in force
    after its point; the first at (0, 0)), to the end of the run. ``val_loss``: the
    values the run logged by step (the MinSaver's improved part reads the newest)."""
    out: list[Firing] = []
    best, last_validate = float("inf"), None
    for p in points(end):
        sched = [s for at, s in history if at < p][-1]
        if sched.validate != last_validate:  # the best saver's trigger changed: afresh
            best, last_validate = float("inf"), sched.validate
        if _due(sched.validate, p):
            out.append(("validate", EVENTS[p[1]], p[0]))
            if sched.best:
                seen = [v for s, v in val_loss.items() if s <= p[0]]
                value = val_loss.get(max(s for s in val_loss if s <= p[0])) if seen else None
                if value is not None and value < best:
                    best = value
                    out.append(("best", EVENTS[p[1]], p[0]))
        if _due(sched.ckpt, p) or (p[1] == 2 and sched.ckpt_end):
            out.append(("ckpt", EVENTS[p[1]], p[0]))
        if p[1] == 2:
            out.append(("digest", "train_end", p[0]))
    return out


def read_log(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            row = {"unparsed": line}
        rows.append(row if isinstance(row, dict) else {"unparsed": line})
    return rows


def logged_firings(rows: Sequence[dict[str, Any]]) -> list[Firing]:
    return [(r["callback"], r["event"], r["step"]) for r in rows if r.get("kind") == "firing"]


def val_losses(rows: Sequence[dict[str, Any]]) -> dict[int, float]:
    return {r["step"]: r["value"] for r in rows
            if r.get("kind") == "scalar" and r.get("name") == "val/loss"}


def compare_firings(got: list[Firing], want: list[Firing], *, auto: bool,
                    finished: bool) -> str | None:
    """None where the logged firings are the expected ones (a prefix of them for a run
    that did not finish: exact before its last logged point, a subset at it)."""
    if auto:  # the auto saver's steps follow the wall clock: judged by its files
        got = [f for f in got if f[0] != "ckpt" or f[1] == "train_end"]
        want = [f for f in want if f[0] != "ckpt" or f[1] == "train_end"]
    dupes = {f for f in got if got.count(f) > 1}
    if dupes:
        return f"fired twice: {sorted(dupes)[:4]}"
    if finished:
        if sorted(got) != sorted(want):
            return _diff(got, want)
        return None
    if not got:
        return None
    last = max((f[2], _rank(f[1])) for f in got)
    before = [f for f in want if (f[2], _rank(f[1])) < last]
    got_before = [f for f in got if (f[2], _rank(f[1])) < last]
    at = {f for f in got if (f[2], _rank(f[1])) == last}
    want_at = {f for f in want if (f[2], _rank(f[1])) == last}
    if sorted(got_before) != sorted(before) or not at <= want_at:
        return _diff(got, [f for f in want if (f[2], _rank(f[1])) <= last])
    return None


def _rank(event: str) -> int:
    return {"step_end": 0, "epoch_end": 1, "train_end": 2}.get(event, 3)


def _diff(got: list[Firing], want: list[Firing]) -> str:
    extra = sorted(set(got) - set(want))
    missing = sorted(set(want) - set(got))
    return f"extra firings {extra[:5]}, missing {missing[:5]}"


def kept_files(saves: Sequence[Point], policies: Sequence[tuple[int, Keep]],
               validated: Sequence[Point], val_loss: dict[int, float],
               resumes: Sequence[tuple[int, Keep]] = (), *,
               cut_short: Sequence[int] = ()) -> set[str]:
    """The checkpoint files ``saves`` (the saver's save points, in order) leave, each
    save pruning by the policy in force at its step (``policies``: (from step, keep)),
    and each resume pruning by its keep at its step (``resumes``: (step, keep), in the
    order they ran: a resume killed before its first save pruned all the
    same, and a plain resume by the same keep, a no-op unless a kill cut the last
    save's pruning short: a save killed right after its commit, its step in
    ``cut_short``, never pruned). A save's record holds val/loss only where its policy
    then judged by it and the value was put at its own step before it (``validated``:
    validate's points; it fires before the saver at one point): a save without one is
    never among the best."""
    records: list[int] = []
    present: set[int] = set()
    values: dict[int, float] = {}
    pending = list(resumes)

    def resumed_before(step: float) -> None:
        nonlocal present
        while pending and pending[0][0] < step:
            keep = pending.pop(0)[1]
            if records:
                present = {f for f in present if f in _kept(keep, records, values)}

    last = {s: i for i, (s, _) in enumerate(saves)}
    for i, (s, rank) in enumerate(saves):
        resumed_before(s)
        if s in records:
            records.remove(s)  # the same file written again (a periodic and a train_end save)
        records.append(s)
        present.add(s)
        keep = [k for at, k in policies if at < s or at == 0][-1]
        values.pop(s, None)
        if keep.best and any(v == s and r <= rank for v, r in validated) and s in val_loss:
            values[s] = val_loss[s]
        if s in cut_short and last[s] == i:
            continue
        present = {f for f in present if f in _kept(keep, records, values)}
    resumed_before(float("inf"))
    return {f"step-{s:08d}.pt" for s in present}


def _kept(keep: Keep, records: list[int], values: dict[int, float]) -> set[int]:
    out = set(records[-keep.latest:]) | {records[-1]}
    if keep.every_epochs:
        span = keep.every_epochs * STEPS_PER_EPOCH
        for boundary in range(span, records[-1] + span, span):
            before = [r for r in records if r <= boundary]
            if before:
                out.add(before[-1])
    if keep.best:
        valued = [r for r in records if r in values]
        out |= set(sorted(valued, key=lambda r: (values[r], records.index(r)))[:keep.best])
    return out
