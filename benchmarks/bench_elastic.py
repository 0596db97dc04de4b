"""Elastic restart: time from a worker's death to the first step trained again.

Runs the documented command, ``torchrun --standalone --max-restarts 1 --nproc-per-node 2
-m schedtrain train SPEC --resume auto`` (the job of tests/distributed/test_elastic.py: 2 gloo
processes on the CPU, 32 steps), ``--trials`` times; in each, one worker of a rank drawn
at random is killed with SIGKILL from outside once ``events.jsonl`` has a random number
of lines. Measured on the wall clock of this machine:

* **death to training again** - from the kill to the chief's first ``step_end`` of the
  restarted group (``torchrun`` stops the survivor, starts two new workers, they import,
  build the task, make the process group, resume from the newest checkpoint and train);
* **launch to first step** - the same for the first attempt, from starting ``torchrun``:
  what any start of this job costs, for comparison.

Each trial also checks that the run ended after exactly one restart. Reproduce (from the
repository root)::

    python benchmarks/bench_elastic.py --trials 7
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "distributed")]

from test_elastic import elastic_run  # noqa: E402


def trial(folder: Path, rank: int, line: int) -> tuple[float, float]:
    """(death to training again, launch to first step) in seconds."""
    start = time.time()
    result = elastic_run(folder, kill_rank_at_line=(rank, line))
    if result.returncode != 0 or (folder / "attempt.txt").read_text() != "1":
        raise SystemExit(f"trial in {folder} did not end after one restart:\n"
                         f"{result.stderr[-3000:]}")
    died = float((folder / "died.txt").read_text())
    again = float((folder / "first-step-1.txt").read_text())
    first = float((folder / "first-step-0.txt").read_text())
    return again - died, first - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    draw = random.Random(args.seed)
    restarts, starts = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for i in range(args.trials):
            rank, line = draw.randint(0, 1), draw.randint(20, 200)
            restart, start = trial(Path(scratch) / f"trial-{i}", rank, line)
            restarts.append(restart)
            starts.append(start)
            print(f"trial {i}: rank {rank} killed at log line {line}: training again "
                  f"{restart:.2f} s after its death (first start: {start:.2f} s)", flush=True)
    print(f"death to training again: median {statistics.median(restarts):.2f} s "
          f"(min {min(restarts):.2f}, max {max(restarts):.2f}) over {args.trials} trials; "
          f"launch to first step: median {statistics.median(starts):.2f} s")
    print(f"reproduce: python benchmarks/bench_elastic.py --trials {args.trials} "
          f"--seed {args.seed}")


if __name__ == "__main__":
    main()
