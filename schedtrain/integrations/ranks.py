"""Several processes inside a host: the schedule's decisions agreed across ranks.

A ``ScheduleDriver`` (and so every host integration) that starts training inside an
initialised ``torch.distributed`` process group of more than one rank builds a
``RankAgreement``. It settles what can differ between ranks only where the table
evaluates something (the driver's slow path, and the lifecycle events), in one small
collective of ``Comm.agree`` (docs/distributed.md), and never on a quiet step:

* **samples and tokens** are the sum over ranks of what each rank counted since the last
  agreement (unless the host reports global counts already: HF's
  ``num_input_tokens_seen`` is gathered by the Trainer itself);
* **time** is the chief's: every rank decides time triggers on rank 0's clock;
* **metrics** that the schedule's conditions and metric triggers read: a value the host
  has already agreed (Lightning's ``sync_dist``, HF's logged and evaluated metrics,
  ``reduce={name: "host"}``) is put as it is, on every rank alike; any other is reduced
  over the ranks that put one (``reduce``: mean by default, sum, max, min) before a
  trigger reads it, with the arithmetic of schedtrain's own loop (``reduce_column``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Final, Protocol

import torch.distributed as dist

from schedtrain.clock import LoopClock
from schedtrain.distributed.comm import Comm, World
from schedtrain.distributed.vocabulary import reduce_column
from schedtrain.integrations.values import HOST, number
from schedtrain.schedule.table import TriggerTable
from schedtrain.time import Timestamp
from schedtrain.triggers.protocol import ANY_TIME, MetricValue

__all__ = ["RankAgreement", "reads_time"]


class LatestValues(Protocol):
    """The driver's metric values (``driver.LatestValues``)."""

    def put(self, name: str, value: object) -> None: ...

    def latest(self, name: str) -> MetricValue | None: ...


_HEAD: Final = 4  # samples, tokens, the chief's time (high and low 32 bits)
_EVENTS: Final = ("batch_end", "step_end", "epoch_end")


def reads_time(table: TriggerTable) -> bool:
    """Whether a trigger of ``table`` may read wall time: a time unit in the clock part of
    any of its parts, at any depth (a composite's own bound keeps one part's counter:
    ``every("1 step") & every("1 s")``'s is the step's), or a trigger evaluated at every
    point (a condition, a user's trigger), which might."""
    zero = Timestamp()
    if any(node.bound(event, zero) == ANY_TIME for node in table.nodes for event in _EVENTS):
        return True
    todo = list(table.triggers)
    while todo:
        trigger = todo.pop()
        for event in _EVENTS:
            due = trigger.bound(event, zero)
            if due != ANY_TIME and due[5] != float("inf"):
                return True
        todo.extend(trigger.children())
    return False


class RankAgreement:
    """The ranks' agreement for one driver; built by ``ScheduleDriver.train_start``.

    Args:
        comm: the ranks' communicator.
        metrics: the metrics the schedule reads (others are never agreed).
        reduce: metric name -> "mean" (default), "sum", "max", "min" or "host".
        global_counts: the host reports samples and tokens summed over ranks already.
        reads_time: a trigger may read wall time (else the chief's time is not sent).
        agreed: samples and tokens at the last agreement (a resumed run's).
    """

    def __init__(self, comm: Comm, metrics: Collection[str], reduce: Mapping[str, str], *,
                 global_counts: bool, reads_time: bool, agreed: tuple[int, int]) -> None:
        self.comm = comm
        self.ops = {n: reduce.get(n, "mean") for n in sorted(metrics)}
        self.reduced = tuple(n for n, op in self.ops.items() if op != HOST)
        self.global_counts = global_counts
        self.reads_time = reads_time
        #: whether a settle runs a collective (a rank-wide fact: the same on every rank)
        self.collective = not global_counts or reads_time or bool(self.reduced)
        self.agreed = agreed
        #: a reduced value equal to the latest is not a new value (Lightning reads its
        #: logged metrics again at every look, as its callback does on one process)
        self.dedup = False
        #: collectives run so far (tests count them)
        self.collectives = 0
        self._pending: dict[str, float] = {}

    @classmethod
    def detect(cls, metrics: Collection[str], reduce: Mapping[str, str], *,
               global_counts: bool, reads_time: bool,
               agreed: tuple[int, int]) -> RankAgreement | None:
        """The agreement when this process is one of several in an initialised process
        group, else ``None`` (one process: nothing to agree)."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        return cls(Comm(World.from_env(), owns_group=False), metrics, reduce,
                   global_counts=global_counts, reads_time=reads_time, agreed=agreed)

    def put(self, metrics: LatestValues, name: str, value: object, agreed: bool) -> None:
        """A metric value from this rank: put as it is when the host agreed it (or the
        schedule does not read it), else kept until the next settle reduces it."""
        if agreed or name not in self.reduced:
            metrics.put(name, value)
        else:
            self._pending[name] = number(name, value)

    def settle(self, clock: LoopClock, metrics: LatestValues, *, step_end: bool) -> None:
        """Before the table evaluates an event: agree the counters, the time and the
        pending metrics (one collective; none when nothing here can differ)."""
        if not self.collective:
            return
        sample0, token0 = self.agreed
        ds, dt = clock.sample - sample0, clock.token - token0
        t = clock.time_ns if self.comm.is_chief and self.reads_time else 0
        rows = self._agree([ds, dt, t >> 32, t & 0xFFFFFFFF])
        if self.global_counts:
            sample, token = clock.sample, clock.token
        else:
            sample = sample0 + sum(int(r[0]) for r in rows)
            token = token0 + sum(int(r[1]) for r in rows)
        self.agreed = (sample, token)
        time = clock.time_ns
        if self.reads_time:  # the chief's
            time = (int(rows[0][2]) << 32) | int(rows[0][3])
        if step_end:  # the step end the next step's crossings start from
            clock.amend(sample=sample, token=token, time=clock.reading(time))
        else:
            clock.sample, clock.token, clock.time_ns = sample, token, time
        self._put_reduced(metrics, rows, _HEAD)

    def settle_metrics(self, metrics: LatestValues) -> None:
        """After a firing callback's action: the metrics it put, reduced before the
        triggers of the callbacks declared after it read them."""
        if self.reduced:
            self._put_reduced(metrics, self._agree([]), 0)

    def _agree(self, head: list[int]) -> list[list[float]]:
        row = [float(v) for v in head]
        for name in self.reduced:
            value = self._pending.get(name)
            row += [0.0 if value is None else value, float(value is not None)]
        self._pending.clear()
        self.collectives += 1
        return self.comm.agree(row)

    def _put_reduced(self, metrics: LatestValues, rows: list[list[float]], first: int) -> None:
        for i, name in enumerate(self.reduced):
            column = first + 2 * i
            value = reduce_column(rows, column, column + 1, self.ops[name])
            if value is None:
                continue
            latest = metrics.latest(name)
            if self.dedup and latest is not None and latest.value == value:
                continue
            metrics.put(name, value)
