"""One agreement of the ranks, as each rank packs and reads it
(tests/distributed/test_distributed_cost.py, ``AGREEMENT_ROW``).

Run as ``torchrun --standalone --nproc-per-node 2 -m jobs.agreement_row OUT``: for each of
``CASES`` every rank builds a fresh ``Agreement`` over a real gloo group, agrees once at
step 1 (the loop's ``catch_up`` where ranks must agree) and once more at the epoch's end,
and writes ``OUT/rank{r}.json``: per case, the row it put in the agreement and what it
read back (the counters, its clock's training time, whether a live retime waits, the
agreed loss, and the preemption the epoch's end raised).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist

from schedtrain import Schedule, every
from schedtrain.clock import LoopClock
from schedtrain.distributed.agreement import Agreement, PreemptRequested
from schedtrain.distributed.comm import Comm, World
from schedtrain.training.control.inbox import Inbox
from schedtrain.training.control.run_control import RETIME
from schedtrain.training.losses import LossKeeper

#: Each rank's clock reads this when it starts (its own axis; the chief's time is agreed).
T0 = 1_000_000
#: Per case: what each rank (0, 1) counted since the last agreement, its mean loss
#: (``None``: it has none), its pending preemption, and the chief's training time (ns,
#: past 2**32: both words carry) and whether a live retime waits on it.
CASES: tuple[dict[str, Any], ...] = (
    {"samples": (48, 16), "tokens": (7, 0), "loss": (0.5, None), "signal": (None, None),
     "elapsed": (5 << 32) | 0x89ABCDEF, "retime": True},
    {"samples": (16, 16), "tokens": (0, 3), "loss": (1.0, 3.0), "signal": (None, "SIGTERM"),
     "elapsed": (6 << 32) | 0xFFFFFFFF, "retime": False},
)


class Recorded(Comm):
    """The run's communicator, keeping each row this rank put in an agreement."""

    def __init__(self, world: World) -> None:
        super().__init__(world, owns_group=True)
        self.put: list[list[float]] = []

    def agree(self, values: Sequence[float]) -> list[list[float]]:
        self.put.append([float(v) for v in values])
        return super().agree(values)


def one(comm: Recorded, case: dict[str, Any]) -> dict[str, Any]:
    """One agreement at step 1 of ``case``, then the epoch's end; what this rank saw."""
    rank = comm.rank
    clock, losses, inbox = LoopClock(lambda: T0), LossKeeper(), Inbox()
    if case["loss"][rank] is not None:
        losses.numbers.append(case["loss"][rank])
    inbox.requested = case["signal"][rank]
    agreed: list[int] = []
    agreement = Agreement(clock=clock, inbox=inbox, comm=comm,
                          table=Schedule({"tick": every("1 step")}).compile(), losses=losses,
                          max_steps=None, alone={}, hooks_alone=False, reduce_ops={},
                          bits=lambda: RETIME if case["retime"] else 0,  # run control's
                          on_agreed=agreed.append)
    agreement.exact = True  # every step agrees (as with a per-step hook)
    # The chief's reading is its training time from T0; another rank's own is ignored.
    time = T0 + (case["elapsed"] if comm.is_chief else 77)
    agreement.catch_up(1, 1, (case["samples"][rank], case["tokens"][rank], 0, 0, None, time))
    put = comm.put.pop()
    try:
        agreement.after_epoch_end()
        preempted = None
    except PreemptRequested as exc:
        preempted = exc.signal
    return {"put": put, "sample": clock.sample, "token": clock.token,
            "time_ns": clock.time_ns, "retime_asked": agreed == [RETIME],
            "loss": losses.agreed, "preempted": preempted}


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    comm = Recorded(World.from_env())
    try:
        seen = [one(comm, case) for case in CASES]
        (out / f"rank{comm.rank}.json").write_text(json.dumps(seen))
    finally:
        comm.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
