"""Cost of a schedule: measured durations from a run's ``events.jsonl``, applied to a plan.

``read_costs(path)`` takes what a previous or shortened run measured: each firing line's
``duration`` (the seconds its callback ran); the seconds per training step (the span of
the log's firing ``time`` stamps after step 0, less the firings' own durations, over the
steps it covers: a mean, which is what a sum of steps needs); the warm-up (what the
steps before the first firing took beyond that rate: the first step builds the
allocator's caches and the data iterator); and the end (from the last firing's end to
the run's end in ``run.json`` beside the log: the last checkpoint's write).
``predict(plan, costs)`` multiplies them out over the plan: per callback the planned
firings (the first at its measured first firing's cost, often slower, the others at the
mean of the later ones), the total and its share of the predicted run, and the
wall-clock offset of each planned firing. Durations are measurements: a prediction is
only as good as the run it came from.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from schedtrain.errors import RunDirError
from schedtrain.files import UnsafeFile, open_regular
from schedtrain.planning.plan import Plan, PlanError
from schedtrain.planning.run_status import read_status
from schedtrain.readback import DamagedFile, parse_json
from schedtrain.schedule.firings import Firing

__all__ = ["DEFAULT_SHARE_WARNING", "CallbackCost", "CostError", "Costs", "Prediction",
           "cost_json", "cost_table", "hms", "predict", "predict_firings", "read_costs",
           "time_left"]

#: ``plan --costs`` warns when one callback takes more than this share of the run.
DEFAULT_SHARE_WARNING: Final = 0.10


class CostError(PlanError):
    """A costs file that cannot be read: missing, not JSON lines, no timed firings."""


@attrs.frozen
class Costs:
    """What a run measured.

    Args:
        durations: callback name -> the seconds each of its firings ran, in order.
        seconds_per_step: training seconds per step, firings and warm-up excluded.
        steps: how many steps the measurement covers.
        warmup: seconds the steps before the log's first firing after step 0 took beyond
            ``seconds_per_step`` each (0 when the log has no clock ``seconds`` to place
            the run's start).
        tail: seconds from the last firing's end to the run's end (``run.json``), or 0.
    """

    durations: Mapping[str, tuple[float, ...]]
    seconds_per_step: float
    steps: int
    warmup: float = 0.0
    tail: float = 0.0

    def per_firing(self, name: str) -> float:
        """Mean seconds per firing of ``name`` (0 for a callback the run never fired)."""
        got = self.durations.get(name, ())
        return statistics.fmean(got) if got else 0.0

    def firing(self, name: str, nth: int) -> float:
        """Predicted seconds of the ``nth`` firing (from 0) of ``name``: the measured
        first for the first, the mean of the later ones for the others (the first when
        the log has one), 0 for a callback the log never fired."""
        got = self.durations.get(name, ())
        if not got:
            return 0.0
        return got[0] if nth == 0 or len(got) == 1 else statistics.fmean(got[1:])


@attrs.frozen
class CallbackCost:
    """One callback's predicted cost: ``total`` is ``first`` plus the other firings at
    the mean of the measured later ones."""

    callback: str
    firings: int
    mean: float
    median: float
    first: float
    measured: int
    total: float
    share: float


@attrs.frozen
class Prediction:
    """A plan's predicted wall time.

    Args:
        steps: the planned run's steps.
        step_seconds: steps x measured seconds per step.
        callbacks: per callback, in order of first firing.
        offsets: each planned firing's predicted offset from the run's start, in seconds.
        warmup: the measured warm-up of the first steps, paid once.
        tail: the measured end of the run after its last firing.
    """

    steps: int
    step_seconds: float
    callbacks: tuple[CallbackCost, ...]
    offsets: tuple[float, ...]
    warmup: float = 0.0
    tail: float = 0.0

    @property
    def total(self) -> float:
        """Predicted wall time of the run: warm-up, steps, every firing and the end."""
        return (self.warmup + self.step_seconds + self.tail
                + sum(c.total for c in self.callbacks))

    def over(self, share: float) -> tuple[CallbackCost, ...]:
        """Callbacks whose share of the run passes ``share``."""
        return tuple(c for c in self.callbacks if c.share > share)


def read_costs(path: str | Path) -> Costs:
    """Read the firing lines of an ``events.jsonl`` (and ``run.json`` beside it).

    Raises:
        CostError: the file is missing, holds a line that is not JSON, or has no firing
            with a ``duration`` (written by schedtrain before durations were recorded);
            or ``run.json`` beside it is damaged (named with its key).
    """
    path = Path(path)
    rows = _firing_rows(path)
    timed = [r for r in rows if _number(r.get("duration"))]
    if not timed:
        raise CostError(f"{path}: no firing line with a \"duration\"; --costs needs the "
                        "events.jsonl of a run made by this version of schedtrain")
    durations: dict[str, list[float]] = {}
    for r in timed:
        durations.setdefault(str(r["callback"]), []).append(float(r["duration"]))
    stamped = [r for r in timed if _number(r.get("time")) and isinstance(r.get("step"), int)]
    per_step, steps, warmup = _step_time(stamped)
    end = max((float(r["time"]) + float(r["duration"]) for r in stamped), default=None)
    return Costs({n: tuple(d) for n, d in durations.items()}, per_step, steps, warmup,
                 _tail(path, end))


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _step_time(stamped: list[dict[str, Any]]) -> tuple[float, int, float]:
    """Seconds per step, the steps they cover and the warm-up, from the firings' stamps."""
    # Training time at each firing's start: its wall time less the firings run before it.
    points, spent = [], 0.0
    for r in stamped:
        points.append((int(r["step"]), float(r["time"]) - spent))
        spent += float(r["duration"])
    if not points:
        return 0.0, 0, 0.0
    first = stamped[0]
    # The clock's seconds at the first firing place the run's start (step 0) on the
    # wall clock; then the steps before the first firing are warm-up, measured apart.
    origin = (float(first["time"]) - float(first["seconds"])
              if _number(first.get("seconds")) else None)
    steady = [p for p in points if p[0] > 0] if origin is not None else points
    if not steady:
        return 0.0, 0, 0.0
    (s1, w1), (s2, w2) = steady[0], steady[-1]
    if s2 > s1:
        per_step = max(w2 - w1, 0.0) / (s2 - s1)
    elif origin is not None:  # one step measured: from the start, warm-up included
        return max(w1 - origin, 0.0) / s1, s1, 0.0
    else:
        return 0.0, 0, 0.0
    warmup = max(w1 - origin - s1 * per_step, 0.0) if origin is not None else 0.0
    return per_step, s2 - s1, warmup


def _tail(path: Path, end: float | None) -> float:
    """Seconds from ``end`` to the run's end recorded in ``run.json`` beside the log."""
    try:  # never blocks (a FIFO is refused), every field checked (RunStatus)
        status = read_status(path.parent)
    except RunDirError as exc:
        raise CostError(str(exc)) from None
    if (end is None or status is None or status.status not in {"finished", "stopped"}
            or status.updated is None):
        return 0.0
    return max(status.updated - end, 0.0)


def _firing_rows(path: Path) -> list[dict[str, Any]]:
    try:
        f = open_regular(path)  # a FIFO in the log's place never blocks
    except UnsafeFile as exc:
        raise CostError(str(exc)) from None
    except OSError as exc:
        raise CostError(f"{path}: cannot read the costs file ({exc.strerror})") from None
    rows = []
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = parse_json(line, path)
            except DamagedFile:
                raise CostError(f"{path}:{n}: not a JSON line; --costs expects a run's "
                                "events.jsonl") from None
            if isinstance(row, dict) and row.get("kind") == "firing":
                rows.append(row)
    return rows


def time_left(steps: int, firings: Mapping[str, int], costs: Costs) -> float:
    """The cost model: ``steps`` at the measured seconds per step, plus each callback's
    ``firings`` at its mean measured seconds per firing: a running run's ETA from where
    it is (``predict_firings`` adds the warm-up, first firings and end of a whole run)."""
    return steps * costs.seconds_per_step + sum(
        n * costs.per_firing(name) for name, n in firings.items())


def predict(plan: Plan, costs: Costs) -> Prediction:
    """Apply ``costs`` to ``plan`` (``predict_firings`` over its log and steps)."""
    return predict_firings(plan.log, plan.shape.total_steps, costs)


def predict_firings(firings: Iterable[Firing], steps: int, costs: Costs) -> Prediction:
    """Apply ``costs`` to planned ``firings`` over ``steps``: the warm-up once the first
    step runs, each step the measured seconds per step, each firing ``Costs.firing``."""
    counts: dict[str, int] = {}
    totals: dict[str, float] = {}
    offsets: list[float] = []
    spent = 0.0  # seconds of firings so far
    per_step = costs.seconds_per_step
    warmup = costs.warmup if steps > 0 else 0.0
    for f in firings:
        offsets.append(f.step * per_step + (warmup if f.step > 0 else 0.0) + spent)
        n = counts.get(f.callback, 0)
        cost = costs.firing(f.callback, n)
        spent += cost
        counts[f.callback] = n + 1
        totals[f.callback] = totals.get(f.callback, 0.0) + cost
    step_seconds = steps * per_step
    whole = warmup + step_seconds + spent + costs.tail
    return Prediction(steps, step_seconds, tuple(
        _callback_cost(name, n, costs.durations.get(name, ()), totals[name], whole)
        for name, n in counts.items()), tuple(offsets), warmup, costs.tail)


def _callback_cost(name: str, firings: int, measured: Sequence[float], total: float,
                   whole: float) -> CallbackCost:
    mean = statistics.fmean(measured) if measured else 0.0
    median = statistics.median(measured) if measured else 0.0
    first = measured[0] if measured else 0.0
    return CallbackCost(name, firings, mean, median, first, len(measured), total,
                        total / whole if whole > 0 else 0.0)


def hms(seconds: float) -> str:
    """Seconds as ``h:mm:ss``."""
    m, s = divmod(round(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


def cost_table(pred: Prediction) -> str:
    """The per-callback cost table ``schedtrain plan --costs`` prints after the plan."""
    lines = [f"cost (measured): {pred.steps:,} steps x "
             f"{pred.step_seconds / pred.steps if pred.steps else 0.0:.4g} s = "
             f"{hms(pred.step_seconds)}; warm-up {pred.warmup:.3g} s; "
             f"end of the run {pred.tail:.3g} s",
             f"  {'callback':<24} {'firings':>8} {'first s':>10} {'mean s':>10} "
             f"{'median s':>10} {'total':>9} {'share':>6}"]
    lines += [f"  {c.callback:<24} {c.firings:>8,} {c.first:>10.4g} {c.mean:>10.4g} "
              f"{c.median:>10.4g} {hms(c.total):>9} {c.share:>6.1%}"
              for c in pred.callbacks]
    lines.append(f"predicted wall time: {hms(pred.total)} ({pred.total:.1f} s)")
    return "\n".join(lines) + "\n"


def cost_json(plan: Plan, pred: Prediction) -> str:
    """``plan --format json --costs``: each firing gains ``offset_seconds`` (its predicted
    wall-clock offset from the run's start), and ``"costs"`` holds the prediction."""
    doc = json.loads(plan.log.to_json())
    for row, offset in zip(doc["firings"], pred.offsets, strict=True):
        row["offset_seconds"] = round(offset, 6)
    doc["costs"] = {
        "steps": pred.steps, "step_seconds": pred.step_seconds, "warmup_seconds": pred.warmup,
        "tail_seconds": pred.tail, "total_seconds": pred.total,
        "callbacks": [attrs.asdict(c) for c in pred.callbacks]}
    return json.dumps(doc, indent=2) + "\n"
