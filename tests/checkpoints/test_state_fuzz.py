"""The persisted-state fuzzer (issue 41) over two fixture runs (tests/fuzz_fixtures.py):
``auto``, a run with an ``every = "auto"`` saver, keep policies, a retime journal and
answer, and a SIGTERM preemption; ``notice``, a run retimed live, preempted on one
process, resumed on two (the epoch re-divided) and preempted there by a cloud notice,
each case resuming it on one process. One leaf, line or file of a run directory
mutated; ``--resume auto``. The rule: exit 0 with the intact resume's final weights and
firings, or exit 2 with one line naming the file and key path; never a hang, a
traceback, an exit 1, another result, or a file outside the run changed. The whole walk:
``python benchmarks/fuzz_state.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from fuzz_fixtures import FIXTURES, FuzzRun, fuzz_runs
from fuzz_runs import PASSES, run_case
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not torch.distributed.is_available(),
                                 reason="the notice fixture runs on two processes")]

#: Cases drawn, over both fixtures together.
CASES = 48


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, FuzzRun]]:
    """Both fixture runs, made once per session; each case copies one."""
    with fuzz_runs(tmp_path_factory.mktemp("fuzz")) as made:
        yield made


def test_the_fixtures_have_every_file_kind(runs: dict[str, FuzzRun]) -> None:
    """The walk reaches each kind of persisted file the capabilities leave, and the
    notice fixture's last checkpoint holds two ranks' parts after a stretch on one."""
    for run in runs.values():
        files = {m.site.file for m in run.every}
        assert {"run.json", "retimes.json", "retime.answer.json", "events.jsonl"} <= files
        assert sum(f.endswith(".pt") for f in files) >= 2
    every = runs["notice"].every
    last = max(m.site.file for m in every if m.site.file.endswith(".pt"))
    keys = {m.site.key for m in every if m.site.file == last}
    assert ("run", "data", "split", "done", 0, 1) in keys
    assert ("run", "ranks", 1, "data", "split", "done") in keys


# The same cases every run (derandomized): CI is reproducible, and the benchmark script
# walks every leaf and mutation and prints the counts (benchmarks/fuzz_state*.py).
@settings(max_examples=CASES, deadline=None, database=None, phases=[Phase.generate],
          derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_a_mutated_persisted_field_is_refused_or_harmless(
        runs: dict[str, FuzzRun], tmp_path_factory: pytest.TempPathFactory,
        data: st.DataObject) -> None:
    """Any mutation of any persisted leaf, table, line or file of either fixture: the
    resume passes (the same result, or one line naming the file and key path), within
    its deadline."""
    run = runs[data.draw(st.sampled_from(FIXTURES), label="fixture")]
    mutation = data.draw(st.sampled_from(run.every), label="mutation")
    case = tmp_path_factory.mktemp("case") / "case"
    kind, detail, _ = run_case(run.fixture, run.ref, mutation, case)
    assert kind in (*PASSES, "unwritable"), f"{run.name}: {mutation}: {kind}: {detail}"
