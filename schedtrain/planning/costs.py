"""Cost of a schedule: measured durations from a run's ``events.jsonl``, applied to a plan.

``read_costs(path)`` takes what a previous or shortened run measured: each firing line's
``duration`` (the seconds its callback ran) and the seconds per training step (the span
of the log's firing ``time`` stamps, less the firings' own durations, over the steps it
covers). ``predict(plan, costs)`` multiplies them out over the plan: per callback the
planned firings, the seconds per firing, the total and its share of the predicted run,
and the wall-clock offset of each planned firing. Durations are measurements: a
prediction is only as good as the run it came from.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from schedtrain.planning.plan import Plan, PlanError

__all__ = ["DEFAULT_SHARE_WARNING", "CallbackCost", "CostError", "Costs", "Prediction",
           "cost_json", "cost_table", "hms", "predict", "read_costs", "time_left"]

#: ``plan --costs`` warns when one callback takes more than this share of the run.
DEFAULT_SHARE_WARNING: Final = 0.10


class CostError(PlanError):
    """A costs file that cannot be read: missing, not JSON lines, no timed firings."""


@attrs.frozen
class Costs:
    """What a run measured.

    Args:
        durations: callback name -> the seconds each of its firings ran, in order.
        seconds_per_step: training seconds per step, firings excluded.
        steps: how many steps the measurement covers.
    """

    durations: Mapping[str, tuple[float, ...]]
    seconds_per_step: float
    steps: int

    def per_firing(self, name: str) -> float:
        """Mean seconds per firing of ``name`` (0 for a callback the run never fired)."""
        got = self.durations.get(name, ())
        return statistics.fmean(got) if got else 0.0


@attrs.frozen
class CallbackCost:
    """One callback's predicted cost."""

    callback: str
    firings: int
    mean: float
    median: float
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
    """

    steps: int
    step_seconds: float
    callbacks: tuple[CallbackCost, ...]
    offsets: tuple[float, ...]

    @property
    def total(self) -> float:
        """Predicted wall time of the run: steps plus every firing."""
        return self.step_seconds + sum(c.total for c in self.callbacks)

    def over(self, share: float) -> tuple[CallbackCost, ...]:
        """Callbacks whose share of the run passes ``share``."""
        return tuple(c for c in self.callbacks if c.share > share)


def read_costs(path: str | Path) -> Costs:
    """Read the firing lines of an ``events.jsonl``.

    Raises:
        CostError: the file is missing, holds a line that is not JSON, or has no firing
            with a ``duration`` (written by schedtrain before durations were recorded).
    """
    rows = _firing_rows(Path(path))
    timed = [r for r in rows if isinstance(r.get("duration"), int | float)]
    if not timed:
        raise CostError(f"{path}: no firing line with a \"duration\"; --costs needs the "
                        "events.jsonl of a run made by this version of schedtrain")
    durations: dict[str, list[float]] = {}
    for r in timed:
        durations.setdefault(str(r["callback"]), []).append(float(r["duration"]))
    stamped = [r for r in timed if isinstance(r.get("time"), int | float)
               and isinstance(r.get("step"), int)]
    first, last = (stamped[0], stamped[-1]) if stamped else (None, None)
    steps = int(last["step"]) - int(first["step"]) if first and last else 0
    per_step = 0.0
    if first is not None and last is not None and steps > 0:
        # From the first firing's start to the last one's: firings in between (the first's
        # own included, the last's not) are not training.
        between = sum(float(r["duration"]) for r in stamped[:-1])
        span = float(last["time"]) - float(first["time"]) - between
        per_step = max(span, 0.0) / steps
    return Costs({n: tuple(d) for n, d in durations.items()}, per_step, steps)


def _firing_rows(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CostError(f"{path}: cannot read the costs file ({exc.strerror})") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise CostError(f"{path}:{n}: not a JSON line; --costs expects a run's "
                            "events.jsonl") from None
        if isinstance(row, dict) and row.get("kind") == "firing":
            rows.append(row)
    return rows


def time_left(steps: int, firings: Mapping[str, int], costs: Costs) -> float:
    """The cost model: ``steps`` at the measured seconds per step, plus each callback's
    ``firings`` at its mean measured seconds per firing (the run's predicted wall time
    from its start, or a running run's ETA from where it is)."""
    return steps * costs.seconds_per_step + sum(
        n * costs.per_firing(name) for name, n in firings.items())


def predict(plan: Plan, costs: Costs) -> Prediction:
    """Apply ``costs`` to ``plan``: each firing takes its callback's mean measured
    duration, each step the measured seconds per step."""
    counts: dict[str, int] = {}
    offsets: list[float] = []
    spent = 0.0  # seconds of firings so far
    per_step = costs.seconds_per_step
    for f in plan.log:
        offsets.append(f.step * per_step + spent)
        spent += costs.per_firing(f.callback)
        counts[f.callback] = counts.get(f.callback, 0) + 1
    steps = plan.shape.total_steps
    step_seconds = steps * per_step
    whole = time_left(steps, counts, costs)
    return Prediction(steps, step_seconds, tuple(
        _callback_cost(name, n, costs.durations.get(name, ()), whole)
        for name, n in counts.items()), tuple(offsets))


def _callback_cost(name: str, firings: int, measured: Iterable[float],
                   whole: float) -> CallbackCost:
    got = tuple(measured)
    mean = statistics.fmean(got) if got else 0.0
    median = statistics.median(got) if got else 0.0
    total = firings * mean
    return CallbackCost(name, firings, mean, median, len(got), total,
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
             f"{hms(pred.step_seconds)}",
             f"  {'callback':<24} {'firings':>8} {'mean s':>10} {'median s':>10} "
             f"{'total':>9} {'share':>6}"]
    lines += [f"  {c.callback:<24} {c.firings:>8,} {c.mean:>10.4g} {c.median:>10.4g} "
              f"{hms(c.total):>9} {c.share:>6.1%}" for c in pred.callbacks]
    lines.append(f"predicted wall time: {hms(pred.total)} ({pred.total:.1f} s)")
    return "\n".join(lines) + "\n"


def cost_json(plan: Plan, pred: Prediction) -> str:
    """``plan --format json --costs``: each firing gains ``offset_seconds`` (its predicted
    wall-clock offset from the run's start), and ``"costs"`` holds the prediction."""
    doc = json.loads(plan.log.to_json())
    for row, offset in zip(doc["firings"], pred.offsets, strict=True):
        row["offset_seconds"] = round(offset, 6)
    doc["costs"] = {
        "steps": pred.steps, "step_seconds": pred.step_seconds, "total_seconds": pred.total,
        "callbacks": [attrs.asdict(c) for c in pred.callbacks]}
    return json.dumps(doc, indent=2) + "\n"
