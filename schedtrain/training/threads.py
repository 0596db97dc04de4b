"""CPU threads for a run started from the command line.

torch runs each CPU operation on as many threads as the machine has cores. On a
machine other jobs share, those threads wait for each other at every operation's end
whenever one of them is descheduled: a small model's epoch takes several times longer
than on one thread (docs/performance.md has the figures). ``schedtrain train`` on the
CPU therefore uses half the CPUs this process may run on, shared among the processes of
this node (``LOCAL_WORLD_SIZE`` under ``torchrun``), at least one; ``OMP_NUM_THREADS``
or ``MKL_NUM_THREADS`` set by the user win, and so does a count set from Python. The
count depends only on the machine, never on its load, so a run and its resume compute
alike.
"""

from __future__ import annotations

import os
from typing import Final

import torch

from schedtrain.training.device import resolve_device

__all__ = ["THREAD_VARIABLES", "cpu_threads", "limit_cpu_threads"]

#: Environment variables by which a user chooses the thread count.
THREAD_VARIABLES: Final = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def cpu_threads(local_world_size: int = 1) -> int:
    """Half the CPUs this process may run on, shared among ``local_world_size``
    processes, at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, cpus // (2 * max(1, local_world_size)))


def limit_cpu_threads(device: str) -> int | None:
    """For a run on the CPU (``device`` as ``[run] device`` says it), set torch's thread
    count to ``cpu_threads`` unless the user chose one; returns the count set, or
    ``None`` when it was left alone."""
    if any(os.environ.get(name) for name in THREAD_VARIABLES):
        return None
    try:
        if resolve_device(device).type != "cpu":
            return None
    except ValueError:
        return None  # refused with its key path when the trainer is built
    try:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    except ValueError:
        local = 1
    n = cpu_threads(local)
    torch.set_num_threads(n)
    return n
