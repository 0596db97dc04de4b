"""The persisted-state fuzzer over a host's driver state (issue 41): every leaf x every
mutation of the schedule's state inside a Lightning checkpoint, each resumed with
``Trainer.fit(ckpt_path=...)`` in a forked child. Prints the counts of leaves, mutations
and outcomes by kind, the run time and the longest wait; the failures, grouped.
tests/integrations/test_state_fuzz_host.py draws a few of the same cases in CI.

    python benchmarks/fuzz_state_host.py [--sample N] [--seed S] [--failures 20]
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fuzz_host import (
    PASSES,
    make_fixture,
    mutations,
    reference,
    run_case,
    state_key,
    warm_up,
)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--sample", type=int, default=0,
                   help="run this many cases drawn at random (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--failures", type=int, default=20, help="failures listed per kind")
    args = p.parse_args()
    warm_up()
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        fixture = make_fixture(root / "fixture")
        ref = reference(fixture, root / "reference")
        key = state_key(fixture)
        every = mutations(fixture)
        todo = every
        if args.sample:
            todo = random.Random(args.seed).sample(every, min(args.sample, len(every)))
        kinds: collections.Counter[str] = collections.Counter()
        failures: dict[str, list[str]] = collections.defaultdict(list)
        longest, longest_case = 0.0, ""
        for i, mutation in enumerate(todo):
            kind, detail, seconds = run_case(fixture, ref, key, mutation, root / f"case{i}")
            kinds[kind] += 1
            if seconds > longest:
                longest, longest_case = seconds, str(mutation)
            if kind not in (*PASSES, "unwritable"):
                failures[kind].append(f"{mutation}: {detail}")
        leaves = len({m.key for m in every})
    elapsed = time.monotonic() - start
    print(f"leaves and tables: {leaves}; mutations: {len(every)}; run: {len(todo)}")
    print("outcomes: " + ", ".join(f"{k} {n}" for k, n in kinds.most_common()))
    print(f"failed: {sum(n for k, n in kinds.items() if k not in (*PASSES, 'unwritable'))}")
    print(f"run time: {elapsed:.1f} s; longest wait: {longest:.2f} s ({longest_case})")
    for kind, lines in sorted(failures.items()):
        print(f"\n== {kind} ({len(lines)})")
        for line in lines[:args.failures]:
            print(f"  {line}")


if __name__ == "__main__":
    main()
