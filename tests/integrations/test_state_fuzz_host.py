"""The persisted-state fuzzer over a host's driver state (issue 41): a Lightning fit with
the schedtrain callback (a periodic probe, ``improved`` and ``plateau`` on the logged
loss, schedtrain's ``EarlyStopping``, a ``"checkpoint"`` saver keeping 2 files) killed
after step 6; one leaf or table of the schedule's state inside the saver's checkpoint
mutated; ``fit(ckpt_path=...)`` in a forked child. The rule: the intact resume's firings,
weights and files, or a ``schedtrain.Error`` of one line naming the key path; never a
hang, another exception, or another result. The whole walk:
``python benchmarks/fuzz_state_host.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("lightning")
from fuzz_host import (
    PASSES,
    HostMutation,
    Result,
    make_fixture,
    mutations,
    reference,
    run_case,
    state_key,
    warm_up,
)
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")]


class HostFuzz:
    """The fixture checkpoint, its intact resume and every mutation of its driver state
    (shown short: a failure names the mutation, not the reference)."""

    def __init__(self, fixture: Path, key: str, ref: Result, every: list[HostMutation]
                 ) -> None:
        self.fixture, self.key, self.ref, self.every = fixture, key, ref, every

    def __repr__(self) -> str:
        return f"HostFuzz({self.fixture.name}, {len(self.every)} mutations)"


@pytest.fixture(scope="module")
def host_fuzz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostFuzz]:
    """The fixture fit, made once per module; each case copies its checkpoints."""
    warm_up()
    root = tmp_path_factory.mktemp("host_fuzz")
    fixture = make_fixture(root / "fixture")
    yield HostFuzz(fixture, state_key(fixture), reference(fixture, root / "reference"),
                   mutations(fixture))


def test_the_fixture_reaches_every_part_of_the_state(host_fuzz: HostFuzz) -> None:
    """The walk reaches the clock, the triggers, the metrics, the hosted callback's
    state and the saver's keep records; the intact resume fires every callback."""
    tops = {m.key[:2] for m in host_fuzz.every if len(m.key) >= 2}
    assert {("driver", "clock"), ("driver", "table"), ("driver", "metrics"),
            ("driver", "callbacks"), ("keep", "save")} <= tops
    fired = {f[0] for f in host_fuzz.ref.firings}
    assert fired == {"probe", "best", "calm", "early", "save"}


# The same cases every run (derandomized): CI is reproducible, and the benchmark script
# walks every leaf and mutation and prints the counts (benchmarks/fuzz_state*.py).
@settings(max_examples=25, deadline=None, database=None, phases=[Phase.generate],
          derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_a_mutated_driver_state_is_refused_or_harmless(
        host_fuzz: HostFuzz, tmp_path_factory: pytest.TempPathFactory,
        data: st.DataObject) -> None:
    """Any mutation of any leaf or table of the schedule's state in the host's
    checkpoint: the resume passes (the same result, or one line naming the key path),
    within its deadline."""
    mutation = data.draw(st.sampled_from(host_fuzz.every), label="mutation")
    case = tmp_path_factory.mktemp("case") / "case"
    kind, detail, _ = run_case(host_fuzz.fixture, host_fuzz.ref, host_fuzz.key, mutation, case)
    assert kind in (*PASSES, "unwritable"), f"{mutation}: {kind}: {detail}"


@pytest.mark.parametrize(("key", "kind"), [
    (("keep", "save", 0, 0), "path"),  # a record naming ../outside.txt: nothing deleted
    (("keep",), "missing"),
    (("driver", "clock", "now", "step"), "10**12"),
    (("driver", "clock", "now", "batch"), "0"),
    (("driver", "clock", "now", "epoch"), "0"),
    (("driver", "clock", "now", "step_in_epoch"), "0"),
    (("driver", "in_epoch"), "bool"),
    (("driver", "pending", 0), "10**12"),
    (("driver", "table", "triggers"), "missing"),
    (("driver", "callbacks", "early", "wait"), "list"),
    (("driver", "table", "triggers", "best", "best"), "str"),
    (("driver", "metrics", "counts", "loss"), "-1"),
])
def test_each_defect_the_walk_found_is_refused_by_key_path(
        host_fuzz: HostFuzz, tmp_path: Path, key: tuple[object, ...], kind: str) -> None:
    """The defects the full walk found (a file outside the folder deleted, crashes,
    counters disagreeing with Lightning's, a part named without its key): each refused in
    one line naming its key path, the file outside the folder untouched."""
    mutation = HostMutation(key, kind)  # type: ignore[arg-type]
    got, detail, _ = run_case(host_fuzz.fixture, host_fuzz.ref, host_fuzz.key, mutation,
                              tmp_path / "case")
    assert got == "refused", f"{mutation}: {got}: {detail}"
