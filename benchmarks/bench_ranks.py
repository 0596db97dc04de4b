"""``simulate_ranks`` at 1,024 ranks: seconds per simulated run.

Each rank has its own clock rates (samples and tokens per batch) and its own metric
stream, reduced across ranks before the triggers read it (as a real run's agreement
does). Two shapes:

* 10,000 steps (10 epochs), ``val/loss`` per epoch on each rank;
* 1,000 steps, ``train/loss`` at every step on each rank (1,024,000 values) and
  ``val/loss`` per epoch.

The schedule mixes triggers on tokens, samples, wall time, steps with a condition on
the reduced loss, and improvement of the reduced validation loss. The best of
``--repeats`` runs is printed per shape (the machine is shared; the best is the least
disturbed run). Reproduce (from the repository root)::

    python benchmarks/bench_ranks.py --ranks 1024 --repeats 3
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from schedtrain import Schedule, every, improved, on, when
from schedtrain.testing import simulate_ranks

REPRODUCE = "python benchmarks/bench_ranks.py --ranks {ranks} --repeats {repeats}"
SCHEDULE = Schedule({
    "tokens": every("2500000 tokens"),
    "samples": every("500000 samples"),
    "wall": every("60 s"),
    "best": every("1 epoch") & improved("val/loss"),
    "low": every("50 steps") & when("train/loss < 0.75"),
    "end": on("train_end"),
})


def streams(ranks: int, epochs: int, steps: int, per_step: bool) -> list[dict[str, Any]]:
    """Each rank's metrics: its own values, at the points every rank reports."""
    out = []
    for r in range(ranks):
        stream: dict[str, Any] = {
            "val/loss": [(f"{e} epochs", 1.0 / (e + r % 7)) for e in range(1, epochs + 1)]}
        if per_step:
            stream["train/loss"] = [(s, 1.0 / (1 + s % (r + 1))) for s in range(1, steps + 1)]
        out.append(stream)
    return out


def once(ranks: int, epochs: int, steps_per_epoch: int, per_step: bool) -> tuple[float, int]:
    """Seconds for one ``simulate_ranks`` call (streams built beforehand), and firings."""
    given = streams(ranks, epochs, epochs * steps_per_epoch, per_step)
    start = time.perf_counter()
    log = simulate_ranks(SCHEDULE, world_size=ranks, rank_metrics=given, epochs=epochs,
                         steps_per_epoch=steps_per_epoch,
                         samples_per_batch=[16 + r % 5 for r in range(ranks)],
                         tokens_per_batch=[100 + r % 13 for r in range(ranks)],
                         seconds_per_step=0.3)
    return time.perf_counter() - start, len(log)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for label, epochs, spe, per_step in (
            ("10,000 steps, val/loss per epoch per rank", 10, 1000, False),
            ("1,000 steps, train/loss every step per rank", 4, 250, True)):
        runs = [once(args.ranks, epochs, spe, per_step) for _ in range(args.repeats)]
        best = min(s for s, _ in runs)
        print(f"{args.ranks} ranks, {label}: best {best:.2f} s of {args.repeats} "
              f"({runs[0][1]} firings)")
    print("reproduce:", REPRODUCE.format(ranks=args.ranks, repeats=args.repeats))


if __name__ == "__main__":
    main()
