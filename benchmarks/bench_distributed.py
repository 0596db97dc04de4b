"""Two ranks: schedtrain with 100 scheduled callbacks vs a bare DDP loop, steps per second.

Both variants train the same small MLP (64 -> 128 -> 10, cross-entropy, SGD, 32 samples
per rank and step, CPU, one thread per rank) wrapped in ``DistributedDataParallel``, in
one ``torchrun`` job of two processes talking over gloo:

* **bare DDP loop** - forward, backward (DDP's gradient all-reduce), ``step``,
  ``zero_grad``; nothing else;
* **schedtrain, 100 callbacks** - ``Trainer(strategy="ddp")`` with 100 callbacks that do
  nothing, each on ``every("100 steps")`` (so they fire, and the ranks agree on the
  step's metrics and stop flag at those steps), no run directory;
* **schedtrain, 0 callbacks** - the trainer alone;
* **bare DDP loop, again** - the control: its ratio to the first is the noise floor.

``--repeats`` rounds each run every variant once, in an order shuffled alike on both
ranks, between barriers; a variant's time is the slower rank's. The best round per
variant is the least disturbed one (as ``timeit`` advises); the median shows the spread.
Ratios are to the faster of the two bare runs; the slower one's ratio is the noise.

Reproduce (from the repository root)::

    python benchmarks/bench_distributed.py --steps 2000 --repeats 7

The script starts ``torchrun --standalone --nproc-per-node 2`` on itself.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

BATCH, FEATURES, HIDDEN, CLASSES, EPOCH = 32, 64, 128, 10, 500
BARE, CONTROL = "bare DDP loop", "bare DDP loop, again"
ST100, ST0 = "schedtrain, 100 callbacks", "schedtrain, 0 callbacks"
REPRODUCE = "python benchmarks/bench_distributed.py --steps {steps} --repeats {repeats}"


def _data(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(rank)  # each rank its own part
    x = torch.randn(EPOCH, BATCH, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (EPOCH, BATCH), generator=g)
    return [(x[i], y[i]) for i in range(EPOCH)]


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(HIDDEN, CLASSES))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def bare(steps: int, data: list[tuple[torch.Tensor, torch.Tensor]]) -> Callable[[], None]:
    """A hand-written DDP loop; returns the timed part."""
    from torch.nn.parallel import DistributedDataParallel

    model, opt = _model()
    ddp = DistributedDataParallel(model)
    loss_fn = torch.nn.functional.cross_entropy

    def run() -> None:
        done = 0
        while done < steps:
            for x, y in data:
                loss = loss_fn(ddp(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                done += 1
                if done == steps:
                    break
    return run


def with_schedtrain(n_callbacks: int) -> Callable[[int, list[Any]], Callable[[], None]]:
    """schedtrain's trainer with ``n_callbacks`` do-nothing callbacks every 100 steps."""
    from schedtrain import Schedule, every
    from schedtrain.callbacks import Callback

    class Nothing(Callback):
        may_stop_alone = False  # it never stops: no stop flag after its firings

    def build(steps: int, data: list[Any]) -> Callable[[], None]:
        from schedtrain.training import Trainer

        model, opt = _model()
        names = {f"cb{i}": every("100 steps") for i in range(n_callbacks)}
        trainer = Trainer(model, opt, data, torch.nn.functional.cross_entropy,
                          schedule=Schedule(names), bindings={n: Nothing() for n in names},
                          max_steps=steps, device="cpu", strategy="ddp",
                          handle_signals=False)
        return trainer.fit
    return build


def count_collectives(run: Callable[[], None]) -> int:
    """Run once, counting the collectives called through ``torch.distributed`` (DDP's
    gradient all-reduce runs in C++, outside it: not counted)."""
    names = ("all_gather", "all_reduce", "broadcast", "broadcast_object_list",
             "all_gather_object", "gather_object", "barrier")
    originals = {n: getattr(dist, n) for n in names}
    count = 0

    def counted(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            nonlocal count
            count += 1
            return fn(*args, **kwargs)
        return call

    try:
        for n, fn in originals.items():
            setattr(dist, n, counted(fn))
        run()
    finally:
        for n, fn in originals.items():
            setattr(dist, n, fn)
    return count


def worker(steps: int, repeats: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = _data(rank)
    variants: dict[str, Callable[[int, list[Any]], Callable[[], None]]] = {
        BARE: bare, ST100: with_schedtrain(100), ST0: with_schedtrain(0), CONTROL: bare}
    collectives, due = count_collectives(variants[ST100](steps, data)), steps // 100
    times: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    shuffle = random.Random(0)  # the same order on every rank
    for _ in range(repeats):
        shuffle.shuffle(order)
        for name in order:
            run = variants[name](steps, data)
            dist.barrier()
            start = time.perf_counter()
            run()
            took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the slower rank's time
            times[name].append(float(took))
    if rank == 0:
        _report(times, steps, repeats)
        print(f"\nschedtrain's own collectives in one run of {ST100!r}: {collectives} "
              f"(steps where a trigger is due: {due}; the rest set up and end the run)")
    dist.destroy_process_group()


def _report(times: dict[str, list[float]], steps: int, repeats: int) -> None:
    best = {name: steps / min(t) for name, t in times.items()}
    bare_best = max(best[BARE], best[CONTROL])  # the same loop twice: the faster one
    print(f"2 ranks (gloo, CPU, 1 thread each), {steps} steps x {repeats} rounds; "
          f"torch {torch.__version__}")
    print(f"{'variant':<28}{'steps/s best':>14}{'median':>10}{'vs bare':>9}")
    for name, t in times.items():
        median = steps / statistics.median(t)
        print(f"{name:<28}{best[name]:>14.0f}{median:>10.0f}{best[name] / bare_best:>9.3f}")
    overhead_us = (1 / best[ST100] - 1 / bare_best) * 1e6
    print(f"schedtrain (100 callbacks) / bare DDP (the faster of its two runs): "
          f"{best[ST100] / bare_best:.3f} of the steps/s ({overhead_us:+.0f} us per step); "
          f"noise floor (slower bare / faster bare): "
          f"{min(best[BARE], best[CONTROL]) / bare_best:.3f}")
    print("reproduce: " + REPRODUCE.format(steps=steps, repeats=repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        torch.set_num_threads(1)
        worker(args.steps, args.repeats)
        return
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root),
                                                       os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2", __file__, "--worker", "--steps", str(args.steps),
           "--repeats", str(args.repeats)]
    sys.exit(subprocess.run(cmd, env=env, check=False).returncode)


if __name__ == "__main__":
    main()
