"""``Comm``: the few agreements a run on several processes needs, and nothing per step.

The clock, and every trigger on steps and epochs, agree across ranks by construction:
every rank counts the same steps. What can differ (samples and tokens, wall time,
metrics, a request to stop, a preemption signal) is agreed here, only at the points
where something can fire:

* ``sync_counts``: one all-reduce of three integers (this rank's samples and tokens
  since the last agreement, and the chief's training time) at a step where a trigger is
  due; sample and token counters become global sums, time the chief's.
* ``reduce_floats``: metric values put by a firing callback, reduced (mean, sum, max,
  min) before any later trigger sees them.
* ``any``: a stop requested on one rank stops every rank.
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

from schedtrain.errors import RunDirError, RunEnded
from schedtrain.spec.document import REDUCE_OPS

__all__ = ["REDUCE_OPS", "Comm", "World", "check_reduce", "multi_process_env",
           "reraise_on_all"]

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
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        return cls(World.from_env(), owns_group=True)

    def close(self) -> None:
        """Destroy the process group if this ``Comm`` created it."""
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()

    # -- agreements --------------------------------------------------------------------------
    def _all_reduce(self, values: Sequence[float | int], op: Any,
                    dtype: torch.dtype) -> list[Any]:
        t = torch.tensor(list(values), dtype=dtype)
        dist.all_reduce(t, op=op, group=self.group)
        return list(t.tolist())

    def sync_counts(self, samples: int, tokens: int, time_ns: int) -> tuple[int, int, int]:
        """Global samples and tokens since the last agreement, and the chief's time."""
        s, t, chief_time = self._all_reduce(
            (samples, tokens, time_ns if self.is_chief else 0), dist.ReduceOp.SUM,
            torch.int64)
        return int(s), int(t), int(chief_time)

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank."""
        return bool(self._all_reduce((int(flag),), dist.ReduceOp.MAX, torch.int64)[0])

    def reduce_floats(self, values: Sequence[float | None],
                      ops: Sequence[str]) -> list[float | None]:
        """Each value reduced across ranks by its op over the ranks that have one
        (``None``: not put on this rank; ``None`` back when no rank put it)."""
        n = len(values)
        present = [0.0 if v is None else 1.0 for v in values]
        summed = self._all_reduce([0.0 if v is None else float(v) for v in values] + present,
                                  dist.ReduceOp.SUM, torch.float64)
        out: list[float | None] = [None if summed[n + i] == 0 else summed[i] / summed[n + i]
                                   if op == "mean" else summed[i]
                                   for i, op in enumerate(ops)]
        for op, red in (("max", dist.ReduceOp.MAX), ("min", dist.ReduceOp.MIN)):
            idx = [i for i, o in enumerate(ops) if o == op]
            if idx:
                fill = -float("inf") if op == "max" else float("inf")
                mine = [values[i] for i in idx]
                got = self._all_reduce([fill if v is None else float(v) for v in mine], red,
                                       torch.float64)
                for i, v in zip(idx, got, strict=True):
                    out[i] = None if summed[n + i] == 0 else float(v)
        return out

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on the chief (``None`` elsewhere)."""
        got: list[Any] | None = [None] * self.size if self.is_chief else None
        dist.gather_object(obj, got, dst=0, group=self.group)
        return got

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, on every rank."""
        got: list[Any] = [None] * self.size
        dist.all_gather_object(got, obj, group=self.group)
        return got

    def broadcast(self, obj: Any) -> Any:
        """The chief's ``obj`` on every rank."""
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

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

    def preempt_target(self) -> tuple[int, str] | None:
        """The agreed preemption step and signal, once any rank has posted one."""
        if not self._store.check([_PREEMPT_KEY]):
            return None
        return _preempt_value(self._store.get(_PREEMPT_KEY))


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
