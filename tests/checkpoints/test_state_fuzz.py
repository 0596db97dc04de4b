"""The persisted-state fuzzer (issue 41): a real run with an ``every = "auto"`` saver,
keep policies, a retime journal and answer, and a SIGTERM preemption; one leaf, line or
file of its run directory mutated; ``--resume auto``. The rule: exit 0 with the intact
resume's final weights and firings, or exit 2 with one line naming the file and key
path; never a hang, a traceback, an exit 1, another result, or a file outside the run
changed. The whole walk: ``python benchmarks/fuzz_state.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from fuzz_mutations import Mutation, mutations
from fuzz_runs import PASSES, Reference, make_fixture, reference, run_case, warm_up
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.slow


@attrs.frozen
class FuzzRun:
    """The fixture run, its intact resume and every mutation of it (shown short: a
    failure names the mutation, not the reference log)."""

    fixture: Path
    ref: Reference = attrs.field(repr=False)
    every: list[Mutation] = attrs.field(repr=False)


@pytest.fixture(scope="session")
def fuzz_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzRun]:
    """The fixture run, made once per session; each case copies it."""
    warm_up()
    root = tmp_path_factory.mktemp("fuzz")
    fixture = make_fixture(root / "fixture")
    yield FuzzRun(fixture, reference(fixture, root / "reference"), mutations(fixture / "run"))


def test_the_fixture_has_every_file_kind(fuzz_run: FuzzRun) -> None:
    """The walk reaches each kind of persisted file the capabilities leave."""
    files = {m.site.file for m in fuzz_run.every}
    assert {"run.json", "retimes.json", "retime.answer.json", "events.jsonl"} <= files
    assert sum(f.endswith(".pt") for f in files) >= 2


@settings(max_examples=40, deadline=None, database=None, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_a_mutated_persisted_field_is_refused_or_harmless(
        fuzz_run: FuzzRun, tmp_path_factory: pytest.TempPathFactory,
        data: st.DataObject) -> None:
    """Any mutation of any persisted leaf, table, line or file: the resume passes (the
    same result, or one line naming the file and key path), within its deadline."""
    mutation = data.draw(st.sampled_from(fuzz_run.every), label="mutation")
    case = tmp_path_factory.mktemp("case") / "case"
    kind, detail, _ = run_case(fuzz_run.fixture, fuzz_run.ref, mutation, case)
    assert kind in (*PASSES, "unwritable"), f"{mutation}: {kind}: {detail}"
