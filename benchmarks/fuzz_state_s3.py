"""The persisted-state fuzzer over a run whose checkpoints live in an S3 bucket on a moto
server (issue 41): ALL mutations of ALL objects of its bucket prefix (checkpoints,
manifests, the lease), or a sample; counts of objects, leaves, mutations and outcomes by
kind, the run time and the longest wait. tests/checkpoints/test_state_fuzz_s3.py draws a
few of the same cases in CI.

    python benchmarks/fuzz_state_s3.py [--sample N] [--seed S] [--failures 20]

A sample draws an object at random, then one of its mutations not drawn yet (the
checkpoints' run trees hold nearly all the leaves; the manifests and the lease get their
share); ``--uniform`` draws among all mutations instead.
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

from fuzz_mutations import Mutation
from fuzz_runs import warm_up
from fuzz_s3 import (
    PASSES,
    Bucket,
    make_fixture,
    moto_server,
    object_mutations,
    reference,
    run_case,
    use_endpoint,
)


def draw(every: list[Mutation], n: int, seed: int, *, uniform: bool) -> list[Mutation]:
    """``n`` mutations of ``every`` (0: all), without repeats."""
    rng = random.Random(seed)
    if not n or n >= len(every):
        return every
    if uniform:
        return rng.sample(every, n)
    by_object: dict[str, list[Mutation]] = collections.defaultdict(list)
    for m in every:
        by_object[m.site.file].append(m)
    for rows in by_object.values():
        rng.shuffle(rows)
    out: list[Mutation] = []
    while len(out) < n:
        name = rng.choice([k for k, v in by_object.items() if v])
        out.append(by_object[name].pop())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--sample", type=int, default=0,
                   help="run this many cases drawn at random (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--uniform", action="store_true",
                   help="draw among all mutations, not object first")
    p.add_argument("--failures", type=int, default=20, help="failures listed per kind")
    args = p.parse_args()
    warm_up()
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, moto_server() as endpoint:
        use_endpoint(endpoint)
        bucket = Bucket(endpoint)
        root = Path(tmp)
        fixture = make_fixture(root / "fixture", bucket)
        ref = reference(fixture, bucket, root / "reference")
        every = object_mutations(fixture, bucket)
        cases = draw(every, args.sample, args.seed, uniform=args.uniform)
        objects = {m.site.file for m in every}
        leaves = {(m.site.file, m.site.key) for m in every}
        print(f"{len(objects)} objects ({', '.join(sorted(objects))}), {len(leaves)} "
              f"leaves/tables/objects, {len(every)} mutations; running {len(cases)}",
              flush=True)
        counts: collections.Counter[str] = collections.Counter()
        per_object: collections.Counter[str] = collections.Counter()
        examples: dict[str, list[str]] = collections.defaultdict(list)
        longest, longest_case = 0.0, ""
        for i, mutation in enumerate(cases):
            kind, detail, seconds = run_case(fixture, bucket, ref, mutation,
                                             root / f"c{i}", prefix=f"c{i}/ck")
            counts[kind] += 1
            per_object[mutation.site.file] += 1
            if seconds > longest:
                longest, longest_case = seconds, str(mutation)
            if kind not in PASSES and len(examples[kind]) < args.failures:
                examples[kind].append(f"{mutation} :: {detail}")
            if (i + 1) % 25 == 0:
                print(f"  {i + 1} cases, {time.monotonic() - start:.0f} s", flush=True)
    print("cases by object: " + ", ".join(f"{k} {n}" for k, n in sorted(per_object.items())))
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
