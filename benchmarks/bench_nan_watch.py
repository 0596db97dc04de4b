"""What watching every step's loss for NaN/inf (``TerminateOnNaN``) adds to the loss keeper.

The loop keeps each step's loss on the device and folds them into a sum every
``FOLD`` steps; with a watcher, each fold also keeps its stacked losses and every
``CHECK_FOLDS`` folds they are looked at together. This times ``LossKeeper.fold`` over
``FOLD`` CPU losses, watched and not, on one thread (the minimum of interleaved rounds),
and prints the difference per step.

Reproduce: ``python benchmarks/bench_nan_watch.py``
"""

from __future__ import annotations

import timeit
from collections.abc import Callable

import torch

from schedtrain.training.losses import FOLD, LossKeeper

ROUNDS, NUMBER = 6, 1600


def _folding(watch: bool) -> Callable[[], None]:
    losses = [torch.tensor(float(i)) for i in range(FOLD)]
    keeper, step = LossKeeper(), [0]
    keeper.watch = watch

    def fold() -> None:
        keeper.losses.extend(losses)
        step[0] += FOLD
        keeper.fold(step[0])
    return fold


def main() -> None:
    torch.set_num_threads(1)
    best = {False: float("inf"), True: float("inf")}
    for r in range(ROUNDS):
        for watch in ((False, True) if r % 2 else (True, False)):
            t = min(timeit.repeat(_folding(watch), number=NUMBER, repeat=3)) / NUMBER
            best[watch] = min(best[watch], t)
    for watch, t in best.items():
        print(f"watch={watch}: {t * 1e6:.1f} us per fold of {FOLD} steps")
    print(f"watching adds {(best[True] - best[False]) * 1e6 / FOLD:.2f} us per step")


if __name__ == "__main__":
    main()
