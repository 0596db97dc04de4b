"""The persisted-state fuzzer over ALL leaves x ALL mutations of a fixture run (issue 41):
counts of files, leaves, mutations and outcomes by kind, the run time and the longest
wait. tests/checkpoints/test_state_fuzz.py draws a few of the same cases in CI.

    python benchmarks/fuzz_state.py [--sample N] [--seed S] [--failures 20]
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

from fuzz_mutations import mutations
from fuzz_runs import PASSES, make_fixture, reference, run_case, warm_up


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
        every = mutations(fixture / "run")
        cases = every
        if args.sample:
            cases = random.Random(args.seed).sample(every, min(args.sample, len(every)))
        files = {m.site.file for m in every}
        leaves = {(m.site.file, m.site.line, m.site.key) for m in every}
        print(f"{len(files)} files, {len(leaves)} leaves/tables/lines, {len(every)} "
              f"mutations; running {len(cases)}", flush=True)
        counts: collections.Counter[str] = collections.Counter()
        examples: dict[str, list[str]] = collections.defaultdict(list)
        longest, longest_case = 0.0, ""
        for i, mutation in enumerate(cases):
            kind, detail, seconds = run_case(fixture, ref, mutation, root / f"c{i}")
            counts[kind] += 1
            if seconds > longest:
                longest, longest_case = seconds, str(mutation)
            if kind not in PASSES and len(examples[kind]) < args.failures:
                examples[kind].append(f"{mutation} :: {detail}")
            if (i + 1) % 200 == 0:
                print(f"  {i + 1} cases, {time.monotonic() - start:.0f} s", flush=True)
    print("outcomes:")
    for kind, n in sorted(counts.items(), key=lambda kv: (kv[0].startswith("FAIL"), kv[0])):
        print(f"  {kind:32} {n:6}")
    failed = sum(n for k, n in counts.items() if k.startswith("FAIL"))
    print(f"failed {failed} of {len(cases)}; run time {time.monotonic() - start:.0f} s; "
          f"longest wait {longest:.1f} s ({longest_case})")
    for kind, rows in sorted(examples.items()):
        print(f"\n{kind}:")
        for row in rows:
            print(f"  {row}")


if __name__ == "__main__":
    main()
