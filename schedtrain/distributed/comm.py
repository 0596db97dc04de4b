"""``Comm``: the few agreements a run on several processes needs, and nothing per step.

The clock, and every trigger on steps and epochs, agree across ranks by construction:
every rank counts the same steps. What can differ (samples and tokens, wall time,
metrics, a request to stop, a preemption signal) is agreed here, only at the points
where something can fire. Every agreement is one collective of a few floats per rank
(``agree``), so one call carries sums, the chief's values and flags together:

* at a step where a trigger is due, the loop agrees on this rank's samples and tokens
  since the last agreement (summed: the counters are global), the chief's training time
  and each rank's mean loss since it was last published (``train/loss`` is their mean);
* ``reduce_floats``: metric values put by a firing callback, reduced (mean, sum, max,
  min) before any later trigger sees them, with the ranks' stop flags;
* ``first_flagged``/``any``: a stop requested on one rank stops every rank.
* ``post_preempt``/``preempt_target``: a signal on one rank sets a key in the process
  group's store (not a collective); every rank reads it at its slow-path steps and all
  stop at the same step.

Control traffic goes through a gloo group on the host, so under NCCL it never
synchronises the device.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs
import torch
import torch.distributed as dist

from schedtrain.distributed.vocabulary import REDUCE_OPS, first_flagged, reduce_column
from schedtrain.errors import RunDirError, RunEnded

__all__ = ["REDUCE_OPS", "Comm", "World", "check_reduce", "first_flagged",
           "multi_process_env", "reduce_column", "reraise_on_all"]

_PREEMPT_KEY: Final = "schedtrain/preempt"


def multi_process_env() -> bool:
    """Whether this process is one of several (``WORLD_SIZE > 1``, or a process group of
    more than one is already initialised)."""
    if dist.is_available() and dist.is_initialized():
        return bool(dist.get_world_size() > 1)
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def check_reduce(reduce: Mapping[str, str]) -> None:
    """Refuse an unknown reduction, naming the metric."""
    for name, op in reduce.items():
        if op not in REDUCE_OPS:
            raise ValueError(f"reduce[{name!r}] must be one of {list(REDUCE_OPS)}, "
                             f"got {op!r}")


@attrs.frozen
class World:
    """Where this process stands: its rank, the world size, its local rank."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> World:
        """Read ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` as ``torchrun`` sets them."""
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size(),
                       int(os.environ.get("LOCAL_RANK", "0")))
        return cls(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
                   int(os.environ.get("LOCAL_RANK", "0")))


class Comm:
    """Agreement between the ranks of an initialised default process group.

    Args:
        world: this process's place.
        owns_group: the group was created by schedtrain (``close`` destroys it).
    """

    def __init__(self, world: World, *, owns_group: bool) -> None:
        self.world = world
        self.owns_group = owns_group
        self.rank, self.size, self.is_chief = world.rank, world.size, world.is_chief
        backend = dist.get_backend()
        # Host-side agreements on a gloo group: never a device synchronisation.
        self.group: Any = None if backend == "gloo" else dist.new_group(backend="gloo")
        self._store: Any = dist.distributed_c10d._get_default_store()

    @classmethod
    def setup(cls, device: torch.device, timeout_s: float = 300.0) -> Comm | None:
        """The run's ``Comm`` when it runs on several processes (``WORLD_SIZE > 1`` or a
        process group already initialised), else ``None``. Creates the default process
        group when needed: NCCL for CUDA devices, gloo otherwise."""
        if not dist.is_available():
            return None
        if dist.is_initialized():
            world = World.from_env()
            return cls(world, owns_group=False) if world.size > 1 else None
        world = World.from_env()
        if world.size <= 1:
            return None
        backend = "nccl" if device.type == "cuda" else "gloo"
        init_group(backend, datetime.timedelta(seconds=timeout_s))
        return cls(World.from_env(), owns_group=True)

    def close(self) -> None:
        """Destroy the process group if this ``Comm`` created it."""
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()

    # -- agreements --------------------------------------------------------------------------
    def agree(self, values: Sequence[float]) -> list[list[float]]:
        """Every rank's ``values``, on every rank (row ``r`` is rank ``r``'s): one
        collective on a small float64 matrix, the single one an agreement costs. Having
        every row lets one call carry sums, the chief's values, maxima, minima and flags
        together. Each rank fills its own row of zeros and the matrix is summed: adding
        zeros is exact, so this is an all-gather done by an all-reduce."""
        rows = torch.zeros(self.size, len(values), dtype=torch.float64)
        rows[self.rank] = torch.tensor([float(v) for v in values], dtype=torch.float64)
        dist.all_reduce(rows, group=self.group)
        return [list(r) for r in rows.tolist()]

    def first_flagged(self, flag: bool) -> int | None:
        """The lowest rank on which ``flag`` is true (``None``: on none)."""
        return first_flagged(self.agree((float(flag),)), 0)

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank."""
        return self.first_flagged(flag) is not None

    def reduce_floats(self, values: Sequence[float | None], ops: Sequence[str],
                      flag: bool = False) -> tuple[list[float | None], int | None]:
        """Each value reduced across ranks by its op over the ranks that have one
        (``None``: not put on this rank; ``None`` back when no rank put it), and the
        lowest rank whose ``flag`` is set, in one collective."""
        n = len(values)
        rows = self.agree([0.0 if v is None else float(v) for v in values]
                          + [0.0 if v is None else 1.0 for v in values] + [float(flag)])
        return [reduce_column(rows, i, n + i, op) for i, op in enumerate(ops)], \
            first_flagged(rows, 2 * n)

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on the chief (``None`` elsewhere)."""
        got: list[Any] | None = [None] * self.size if self.is_chief else None
        dist.gather_object(obj, got, dst=0, group=self.group)
        return got

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` (the chief's by default) on every rank."""
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=self.group)
        return box[0]

    def mean_number(self, value: float) -> float:
        """``value``'s mean over ranks, by the arithmetic of every agreement."""
        mean = reduce_column(self.agree((value, 1.0)), 0, 1, "mean")
        assert mean is not None
        return mean

    def mean_tensor(self, value: torch.Tensor) -> torch.Tensor:
        """``value``'s mean over ranks, on its device (NCCL: no host synchronisation)."""
        out = value.detach().clone()
        dist.all_reduce(out)
        return out / self.size

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    # -- preemption (through the store: no collective) -----------------------------------
    def post_preempt(self, target_step: int, signal_name: str) -> tuple[int, str]:
        """Propose stopping at ``target_step``; the first proposal wins on every rank."""
        won = self._store.compare_set(_PREEMPT_KEY, "", f"{target_step} {signal_name}")
        return _preempt_value(won)

    def await_preempt(self) -> tuple[int, str]:
        """The agreed preemption step and signal, waiting for a rank to post one (a rank
        that knows another has a signal: that rank posts it, naming its own)."""
        self._store.wait([_PREEMPT_KEY])
        return _preempt_value(self._store.get(_PREEMPT_KEY))

    def preempt_target(self) -> tuple[int, str] | None:
        """The agreed preemption step and signal, once any rank has posted one."""
        if not self._store.check([_PREEMPT_KEY]):
            return None
        return _preempt_value(self._store.get(_PREEMPT_KEY))


def init_group(backend: str, timeout: datetime.timedelta) -> None:
    """Create the default process group from ``torchrun``'s environment.

    Under ``torchrun``'s elastic agent (``TORCHELASTIC_RESTART_COUNT`` set) every attempt
    of a restarted worker group shares one store: the agent's, kept from one rendezvous
    round to the next. Keys the previous group left there (gloo's and NCCL's addresses,
    a posted preemption) would be read by the new group as its own: a rank connects to
    a dead peer's address (``connectFullMesh ... Connection refused``, costing another
    restart) or waits on one forever, and a restarted group would stop at the previous
    group's preemption step. So each attempt's keys live under their own prefix.
    """
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None:
        dist.init_process_group(backend, timeout=timeout)
        return
    from torch.distributed.distributed_c10d import PrefixStore
    from torch.distributed.rendezvous import rendezvous

    store, rank, size = next(rendezvous("env://", timeout=timeout))
    store.set_timeout(timeout)
    dist.init_process_group(backend, store=PrefixStore(f"schedtrain/attempt-{attempt}", store),
                            rank=rank, world_size=size, timeout=timeout)


def _preempt_value(raw: bytes | str) -> tuple[int, str]:
    text = raw.decode() if isinstance(raw, bytes) else raw
    step, _, name = text.partition(" ")
    return int(step), name


def reraise_on_all(comm: Comm, error: RunDirError | None) -> RunDirError | None:
    """The chief's run-directory error (or ``None``) on every rank, so all ranks refuse
    a run together instead of the others waiting for the chief."""
    sent = None
    if comm.is_chief and error is not None:
        sent = (str(error), getattr(error, "status", None), getattr(error, "step", None))
    got = comm.broadcast(sent)
    if got is None:
        return None
    message, status, step = got
    if status is not None:
        return RunEnded(message, status=status, step=step)
    return RunDirError(message)
