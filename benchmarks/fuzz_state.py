"""The persisted-state fuzzer over ALL leaves x ALL mutations of the fixture runs (issue
41): per fixture, counts of files, leaves, mutations and outcomes by kind, the run time
and the longest wait. tests/checkpoints/test_state_fuzz.py draws a few of the same cases
in CI. The fixtures (tests/fuzz_fixtures.py): ``auto`` (an ``every = "auto"`` saver, a
SIGTERM preemption) and ``notice`` (an applied live retime, a division from one process
to two, a cloud notice preemption; its cases resume on one process).

    python benchmarks/fuzz_state.py [--fixture auto|notice] [--sample N] [--seed S]
                                    [--failures 20]
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

from fuzz_fixtures import FIXTURES, FuzzRun, fuzz_runs
from fuzz_runs import PASSES, run_case


def walk(run: FuzzRun, root: Path, *, sample: int, seed: int, failures: int) -> int:
    """Run ``run``'s cases (all, or ``sample`` drawn at random), print what they found;
    returns the number of failed cases."""
    start = time.monotonic()
    every = run.every
    cases = every
    if sample:
        cases = random.Random(seed).sample(every, min(sample, len(every)))
    files = {m.site.file for m in every}
    leaves = {(m.site.file, m.site.line, m.site.key) for m in every}
    print(f"[{run.name}] {len(files)} files, {len(leaves)} leaves/tables/lines, "
          f"{len(every)} mutations; running {len(cases)}", flush=True)
    counts: collections.Counter[str] = collections.Counter()
    examples: dict[str, list[str]] = collections.defaultdict(list)
    longest, longest_case = 0.0, ""
    for i, mutation in enumerate(cases):
        kind, detail, seconds = run_case(run.fixture, run.ref, mutation, root / f"c{i}")
        counts[kind] += 1
        if seconds > longest:
            longest, longest_case = seconds, str(mutation)
        if kind not in PASSES and len(examples[kind]) < failures:
            examples[kind].append(f"{mutation} :: {detail}")
        if (i + 1) % 200 == 0:
            print(f"  {i + 1} cases, {time.monotonic() - start:.0f} s", flush=True)
    print(f"[{run.name}] outcomes:")
    for kind, n in sorted(counts.items(), key=lambda kv: (kv[0].startswith("FAIL"), kv[0])):
        print(f"  {kind:32} {n:6}")
    failed = sum(n for k, n in counts.items() if k.startswith("FAIL"))
    print(f"[{run.name}] failed {failed} of {len(cases)}; run time "
          f"{time.monotonic() - start:.0f} s; longest wait {longest:.1f} s ({longest_case})")
    for kind, rows in sorted(examples.items()):
        print(f"\n{kind}:")
        for row in rows:
            print(f"  {row}")
    print(flush=True)
    return failed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fixture", choices=FIXTURES, action="append",
                   help="walk this fixture (repeatable; default: all)")
    p.add_argument("--sample", type=int, default=0,
                   help="run this many cases a fixture, drawn at random (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--failures", type=int, default=20, help="failures listed per kind")
    args = p.parse_args()
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with fuzz_runs(root, args.fixture or FIXTURES) as runs:
            print(f"fixtures made in {time.monotonic() - start:.0f} s", flush=True)
            for name, run in runs.items():
                walk(run, root / f"{name}-cases", sample=args.sample, seed=args.seed,
                     failures=args.failures)


if __name__ == "__main__":
    main()
