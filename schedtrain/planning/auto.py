"""``plan`` for ``every = "auto"``: the interval Young/Daly give a declared save cost, the
work a failure loses and the time saves take.

The save's cost is ``--checkpoint-seconds`` or, from ``--costs`` (a run's
``events.jsonl``), the mean of the ``NAME/save_cost`` values an auto saver logged (else
the mean of its firings' durations). The seconds per step are, from ``--costs``, the
mean of the ``NAME/step_time`` values the saver logged: measured as the run measures
them, without the saves' stalls, so the plan's interval is the one the run decided on
the same measurements (else the firings' stamps, which include the stalls); without
``--costs``, ``[clock] seconds_per_step``. The interval so found is declared to the trigger
(``Decider.declare``), so the plan's firings use it after the first save. A failure
loses on average half an interval of work plus the restart (the warm-up ``--costs``
measured, 0 without it).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from pathlib import Path

import attrs

from schedtrain.files import UnsafeFile, open_regular
from schedtrain.planning.plan import PlanError
from schedtrain.readback import DamagedFile, parse_json, printable
from schedtrain.spec.failures import mtbf_seconds, overhead_fraction
from schedtrain.spec.model import Spec
from schedtrain.triggers import AutoEvery, Trigger
from schedtrain.triggers.auto import MAX_SECONDS

__all__ = ["AutoPlan", "auto_savers", "auto_table", "declare_auto", "logged_save_cost",
           "logged_step_time"]


@attrs.frozen
class AutoPlan:
    """One auto saver's planned interval and what it costs."""

    callback: str
    interval: int
    cost_s: float
    step_s: float
    mtbf_s: float
    restart_s: float

    @property
    def interval_s(self) -> float:
        return self.interval * self.step_s

    @property
    def lost_s(self) -> float:
        """Expected work lost per failure: half an interval plus the restart."""
        return self.interval_s / 2 + self.restart_s

    @property
    def overhead(self) -> float:
        """The share of the time saves take: cost over the interval's seconds."""
        return self.cost_s / self.interval_s

    def to_dict(self) -> dict[str, float | int | str]:
        return {"callback": self.callback, "interval_steps": self.interval,
                "interval_seconds": self.interval_s, "save_seconds": self.cost_s,
                "step_seconds": self.step_s, "mtbf_seconds": self.mtbf_s,
                "lost_per_failure_seconds": self.lost_s, "overhead": self.overhead}


def _autos(trigger: Trigger) -> list[AutoEvery]:
    found = [trigger] if isinstance(trigger, AutoEvery) else []
    for child in trigger.children():
        found.extend(_autos(child))
    return found


def auto_savers(spec: Spec) -> list[str]:
    """The callbacks of ``spec`` whose trigger has ``every = "auto"``."""
    return [name for name, cb in spec.callbacks.items() if _autos(cb.trigger)]


def logged_save_cost(events: str | Path, callback: str) -> float | None:
    """The save cost ``callback``'s decisions were made on: the mean of the
    ``NAME/save_cost`` values it logged, each at least 0 and the mean at least 1 µs, as
    ``Decider.decide`` takes them (``None``: none logged)."""
    got = _logged(events, f"{callback}/save_cost", -MAX_SECONDS, "a save cost")
    return max(statistics.fmean(max(c, 0.0) for c in got), 1e-6) if got else None


def logged_step_time(events: str | Path, callback: str) -> float | None:
    """The seconds per step ``callback``'s decisions were made on: the mean of the
    ``NAME/step_time`` values it logged (``None``: none logged). The run measures them
    from a save's landing to the next firing, so a save's stall is not in them; the
    firings' stamps in the log (``Costs.seconds_per_step``) hold the stalls."""
    got = _logged(events, f"{callback}/step_time", 0.0, "a step time")
    return statistics.fmean(got) if got else None


def _logged(events: str | Path, name: str, low: float, what: str) -> list[float]:
    """The values of the scalar lines named ``name`` in ``events``, each checked to be
    within ``low``..``MAX_SECONDS``."""
    got: list[float] = []
    path = Path(events)
    try:
        f = open_regular(path)  # never blocks on a FIFO in the log's place
    except UnsafeFile as exc:
        raise DamagedFile(path, "", str(exc).split(" ", 1)[-1]) from None
    with f:
        for number, raw in enumerate(f, 1):
            if name.encode() not in raw:
                continue
            row = parse_json(raw, path)
            if isinstance(row, dict) and row.get("name") == name:
                value = row.get("value")
                if isinstance(value, bool) or not isinstance(value, int | float) \
                        or not low <= value <= MAX_SECONDS:
                    raise DamagedFile(path, f"line {number}.value", (
                        f"expected {what} from {low:,} to {MAX_SECONDS:,} s, found "
                        f"{printable(repr(value))[:40]}"))
                got.append(float(value))
    return got


def declare_auto(spec: Spec, *, cost_s: Mapping[str, float],
                 step_s: float | Mapping[str, float] | None,
                 restart_s: float = 0.0) -> list[AutoPlan]:
    """Declare the interval of each auto saver of ``spec`` from its save cost
    (``cost_s[name]``) and its seconds per step (``step_s``, or ``step_s[name]``); the
    plans, in the spec's order.

    Raises:
        PlanError: an auto saver without a cost or without the seconds per step.
    """
    mtbf = mtbf_seconds(spec.run)
    out: list[AutoPlan] = []
    for name, cb in spec.callbacks.items():
        autos = _autos(cb.trigger)
        if not autos or mtbf is None:  # loading refused an auto trigger without mtbf
            continue
        if name not in cost_s:
            raise PlanError(f"{spec.path}: callbacks.{name} saves every = \"auto\": give "
                            "--checkpoint-seconds S (a save's cost) or --costs EVENTS")
        step = step_s.get(name) if isinstance(step_s, Mapping) else step_s
        if step is None or step <= 0:
            raise PlanError(f"{spec.path}: callbacks.{name} saves every = \"auto\": its "
                            "interval in steps needs the seconds per step: --costs EVENTS "
                            "or [clock] seconds_per_step")
        for auto in autos:
            auto.decider.configure(mtbf, overhead_fraction(spec.run))
            steps = auto.decider.declare(cost_s[name], step)
        out.append(AutoPlan(name, steps, cost_s[name], step, mtbf, restart_s))
    return out


def auto_table(plans: list[AutoPlan]) -> str:
    """The plans as text, a block after the plan's table."""
    if not plans:
        return ""
    lines = ["", "checkpoint interval (every = \"auto\", Young/Daly sqrt(2 C MTBF)):"]
    for p in plans:
        lines.append(
            f"  {p.callback}: every {p.interval:,} steps ({p.interval_s:.4g} s) for a save "
            f"of {p.cost_s:.4g} s and MTBF {p.mtbf_s:.4g} s; work lost per failure "
            f"{p.lost_s:.4g} s (interval/2 + restart {p.restart_s:.4g} s); overhead "
            f"{p.overhead:.2%}")
    return "\n".join(lines) + "\n"
