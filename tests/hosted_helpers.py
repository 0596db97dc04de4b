"""A user's own schedtrain ``Callback`` for the host tests: it records where each of its
hooks ran on the clock, and keeps a count as state (so resume can be checked)."""

from __future__ import annotations

from typing import Any

from schedtrain import FiringLog, Schedule, Scheduled
from schedtrain.callbacks import Callback


class Recorder(Callback):
    """Records ``(name, step, batch, epoch, step_in_epoch, sample, token)`` at each
    ``_trigger`` and ``epoch_num`` at each epoch hook; ``count`` is its state."""

    def __init__(self) -> None:
        self.fired: list[tuple[object, ...]] = []
        self.epochs: list[tuple[str, int]] = []
        self.count = 0

    def _trigger(self) -> None:
        t = self.now
        self.count += 1
        self.fired.append((self.name, t.step, t.batch, t.epoch, t.step_in_epoch, t.sample,
                           t.token))

    def _before_epoch(self) -> None:
        self.epochs.append(("before", self.epoch_num))

    def _after_epoch(self) -> None:
        self.epochs.append(("after", self.epoch_num))

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = int(state["count"])


def recorded(schedule: Schedule) -> tuple[Schedule, dict[str, Recorder]]:
    """``schedule`` with a ``Recorder`` bound to each of its callbacks."""
    recorders = {name: Recorder() for name in schedule.names}
    return Schedule([Scheduled(e.trigger, recorders[e.default_name()], e.default_name())
                     for e in schedule.entries]), recorders


def fired(recorders: dict[str, Recorder]) -> list[tuple[object, ...]]:
    """Every recorder's firings, sorted by clock and then by name (``simulated_fired``)."""
    return sorted((f for r in recorders.values() for f in r.fired), key=_key)


def _key(f: tuple[object, ...]) -> tuple[int, int, int, str]:
    return (int(f[2]), int(f[1]), int(f[3]), str(f[0]))  # type: ignore[call-overload]


def simulated_fired(log: FiringLog) -> list[tuple[object, ...]]:
    """``simulate()``'s firings as a ``Recorder`` records them, in the same order."""
    out = [(f.callback, f.timestamp.step, f.timestamp.batch, f.timestamp.epoch,
            f.timestamp.step_in_epoch, f.timestamp.sample, f.timestamp.token) for f in log]
    return sorted(out, key=_key)
