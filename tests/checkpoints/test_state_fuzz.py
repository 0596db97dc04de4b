"""The persisted-state fuzzer (issue 41) over two fixture runs (tests/fuzz_fixtures.py):
``auto``, a run with an ``every = "auto"`` saver, keep policies, a retime journal and
answer, and a SIGTERM preemption; ``notice``, a run retimed live, preempted on one
process, resumed on two (the epoch re-divided) and preempted there by a cloud notice,
each case resuming it on one process. One leaf, line or file of a run directory
mutated; ``--resume auto``. The rule: exit 0 with the intact resume's final weights and
firings, or exit 2 with one line naming the file and key path; never a hang, a
traceback, an exit 1, another result, or a file outside the run changed. The cases are
split into parts (each fixture's journal files, a share of its checkpoints) that
pytest-xdist spreads over its workers. The whole walk: ``python benchmarks/fuzz_state.py``."""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import pytest
import torch
from fuzz_fixtures import FIXTURES, FuzzRuns, lazy_runs
from fuzz_mutations import Part
from fuzz_runs import PASSES, run_case
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not torch.distributed.is_available(),
                                 reason="the notice fixture runs on two processes")]

#: Cases drawn, over both fixtures together.
CASES = 48
JOURNAL = "journal"


def kind_of(file: str) -> str:
    """A run file's kind, as the parts divide them: its checkpoints, or the rest (the
    run's record, its retime journal and answer, its log)."""
    return "checkpoints" if file.endswith(".pt") else JOURNAL


#: The parts, 24 cases a fixture as before the split; a notice case (a longer resume)
#: costs several auto ones, so its checkpoints are split three ways.
PARTS = (Part(JOURNAL, 6, fixture="auto"),
         *(Part("checkpoints", 9, at, 2, "auto") for at in range(2)),
         Part(JOURNAL, 6, fixture="notice"),
         *(Part("checkpoints", 6, at, 3, "notice") for at in range(3)))


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzRuns]:
    """The fixture runs, each made once per session as a test first asks for it; each
    case copies one."""
    with lazy_runs(tmp_path_factory.mktemp("fuzz")) as made:
        yield made


def test_the_fixtures_have_every_file_kind(runs: FuzzRuns) -> None:
    """The walk reaches each kind of persisted file the capabilities leave, and the
    notice fixture's last checkpoint holds two ranks' parts after a stretch on one."""
    for run in (runs[name] for name in FIXTURES):
        files = {m.site.file for m in run.every}
        assert {"run.json", "retimes.json", "retime.answer.json", "events.jsonl"} <= files
        assert sum(f.endswith(".pt") for f in files) >= 2
    every = runs["notice"].every
    last = max(m.site.file for m in every if m.site.file.endswith(".pt"))
    keys = {m.site.key for m in every if m.site.file == last}
    assert ("run", "data", "split", "done", 0, 1) in keys
    assert ("run", "ranks", 1, "data", "split", "done") in keys


def test_the_parts_cover_every_mutation(runs: FuzzRuns) -> None:
    """Each file of each fixture, so each of its mutations, is in exactly one part, and
    the parts draw the cases the fuzzer draws."""
    assert sum(p.cases for p in PARTS) == CASES
    for name in FIXTURES:
        files = sorted({m.site.file for m in runs[name].every})
        picked = [f for p in PARTS if p.fixture == name for f in p.pick(files, kind_of)]
        assert sorted(picked) == files, name
        assert all(p.pick(files, kind_of) for p in PARTS if p.fixture == name), name


# The same cases every run (derandomized, each part seeded by its name): CI is
# reproducible, and the benchmark script walks every leaf and mutation and prints the
# counts (benchmarks/fuzz_state*.py).
@pytest.mark.parametrize("part", PARTS, ids=lambda p: p.id)
def test_a_mutated_persisted_field_is_refused_or_harmless(
        runs: FuzzRuns, tmp_path_factory: pytest.TempPathFactory, part: Part,
        request: pytest.FixtureRequest) -> None:
    """Any mutation of any persisted leaf, table, line or file of either fixture: the
    resume passes (the same result, or one line naming the file and key path), within
    its deadline."""
    if part.fixture == "notice":
        # Each notice case's resume (forked) writes 21 checkpoints: their fsyncs were
        # most of its wall time (tests/conftest.py). Not for the auto fixture, whose saver
        # spaces its saves by their measured cost: cheaper saves, more of them.
        request.getfixturevalue("no_fsync")
    run = runs[part.fixture]
    files = part.pick({m.site.file for m in run.every}, kind_of)
    of_file = {f: [m for m in run.every if m.site.file == f] for f in files}

    # The file first, then one of its mutations: each file of the part gets its share.
    @seed(zlib.crc32(part.id.encode()))
    @settings(max_examples=part.cases, deadline=None, database=None,
              phases=[Phase.generate], derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data())
    def case(data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(files), label="file")
        mutation = data.draw(st.sampled_from(of_file[name]), label="mutation")
        folder = tmp_path_factory.mktemp("case") / "case"
        kind, detail, _ = run_case(run.fixture, run.ref, mutation, folder)
        assert kind in (*PASSES, "unwritable"), f"{run.name}: {mutation}: {kind}: {detail}"

    case()
