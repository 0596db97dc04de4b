"""The persisted-state fuzzer over a run whose checkpoints live in an S3 bucket (issue 41):
a real run on a moto server, its checkpoints every 8 steps (keep policies), preempted
(SIGTERM) at step 30, a lease left as a killed run leaves it; one object of its bucket
prefix mutated (a leaf of a checkpoint's run state, its manifest rewritten to match; a
manifest's leaf; the lease's; the object emptied, garbage or deleted); ``--resume
auto``. The rule is fuzz_runs' (tests/fuzz_s3.py): exit 0 with the intact resume's
firings and the bucket's final weights, or exit 2 with one line naming the object and
key path (a damaged lease may be watched for the stale time, then taken over); never a
hang, a traceback, an exit 1 or another result. The cases are split into parts (the
lease, a share of the manifests, a share of the checkpoints) that pytest-xdist spreads
over its workers. The whole walk: ``python benchmarks/fuzz_state_s3.py``."""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterator

import attrs
import pytest
from fuzz_mutations import Mutation, Part
from fuzz_runs import warm_up
from fuzz_s3 import (
    DELETED,
    PASSES,
    Bucket,
    Fixture,
    S3Reference,
    make_fixture,
    object_mutations,
    reference,
    run_case,
    use_endpoint,
)
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from schedtrain.checkpoints.lease import LEASE

pytestmark = pytest.mark.slow
_CASES = itertools.count()
#: Cases drawn, over every part.
CASES = 25


def kind_of(name: str) -> str:
    """An object's kind, as the parts divide them."""
    return "lease" if name == LEASE else "checkpoints" if name.endswith(".pt") else \
        "manifests"


#: The parts: the object first, as before the split, so each kind gets the share of the
#: cases its objects have among them (one lease, as many manifests as checkpoints).
PARTS = (Part("lease", 3), Part("manifests", 6, 0, 2), Part("manifests", 5, 1, 2),
         Part("checkpoints", 6, 0, 2), Part("checkpoints", 5, 1, 2))


@attrs.frozen
class S3FuzzRun:
    """The fixture run, its bucket, its intact resume and every mutation of its objects
    (shown short: a failure names the mutation)."""

    fixture: Fixture
    bucket: Bucket = attrs.field(repr=False)
    ref: S3Reference = attrs.field(repr=False)
    every: list[Mutation] = attrs.field(repr=False)


@pytest.fixture(scope="session")
def s3_fuzz_run(tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str
                ) -> Iterator[S3FuzzRun]:
    """The fixture run, made once per session in its own bucket; each case copies it."""
    warm_up()
    use_endpoint(s3_endpoint)
    root = tmp_path_factory.mktemp("fuzz-s3")
    bucket = Bucket(s3_endpoint)
    fixture = make_fixture(root / "fixture", bucket)
    yield S3FuzzRun(fixture, bucket, reference(fixture, bucket, root / "reference"),
                    object_mutations(fixture, bucket))


def test_the_fixture_has_every_object_kind(s3_fuzz_run: S3FuzzRun) -> None:
    """The walk reaches checkpoints (pruned by the keep policy), their manifests and the
    lease, and each object as a whole."""
    files = {m.site.file for m in s3_fuzz_run.every}
    assert LEASE in files
    points = {f for f in files if f.endswith(".pt")}
    assert len(points) >= 3
    assert {f.removesuffix(".pt") + ".manifest.json" for f in points} <= files
    assert {m.site.file for m in s3_fuzz_run.every if m.kind == DELETED} == files


def test_the_parts_cover_every_object(s3_fuzz_run: S3FuzzRun) -> None:
    """Each object of the prefix, so each of its mutations, is in exactly one part, and
    the parts draw the cases the fuzzer draws."""
    assert sum(p.cases for p in PARTS) == CASES
    names = sorted({m.site.file for m in s3_fuzz_run.every})
    assert sorted(f for p in PARTS for f in p.pick(names, kind_of)) == names
    assert all(p.pick(names, kind_of) for p in PARTS)


# The same cases every run (derandomized, each part seeded by its name): CI is
# reproducible, and the benchmark script walks every leaf and mutation and prints the
# counts (benchmarks/fuzz_state*.py).
@pytest.mark.parametrize("part", PARTS, ids=lambda p: p.id)
def test_a_mutated_object_is_refused_or_harmless(
        s3_fuzz_run: S3FuzzRun, tmp_path_factory: pytest.TempPathFactory, part: Part
        ) -> None:
    """Any mutation of any object of the bucket prefix: the resume passes (the same
    result, the checkpoint passed over, one line naming the object and key path, or a
    damaged lease watched and taken over), within its deadline."""
    run = s3_fuzz_run
    names = part.pick({m.site.file for m in run.every}, kind_of)
    of_name = {n: [m for m in run.every if m.site.file == n] for n in names}

    # The object first, then one of its mutations: the checkpoints' run trees hold 97%
    # of the leaves, and the manifests and the lease get their share.
    @seed(zlib.crc32(part.id.encode()))
    @settings(max_examples=part.cases, deadline=None, database=None,
              phases=[Phase.generate], derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data())
    def case(data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(names), label="object")
        mutation = data.draw(st.sampled_from(of_name[name]), label="mutation")
        folder = tmp_path_factory.mktemp("case") / "case"
        kind, detail, _ = run_case(run.fixture, run.bucket, run.ref, mutation, folder,
                                   prefix=f"case-{next(_CASES)}/ck")
        assert kind in (*PASSES, "unwritable"), f"{mutation}: {kind}: {detail}"

    case()
