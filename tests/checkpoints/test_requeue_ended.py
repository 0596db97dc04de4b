"""A requeue of a run that ended, its end unchanged, has nothing to do whatever schedule
its newest checkpoint holds: the ended check comes before the schedule-change check.
Preempted after its last step with one spec, finished by ``--schedule-change apply``
with another (no checkpoint after: the newest still holds the old schedule), the run is
requeued: ``--resume auto`` exits 0 ("nothing left to do"), ``--resume PATH`` exits 2
("nothing left to resume"), under either ``--schedule-change`` rule, every file as it
was. A run whose end moved later is no ended run: its changed schedule is judged."""

from __future__ import annotations

from pathlib import Path

import pytest
from life_faults import NO_FAULT, Fault, Outcome, run_cli, warm_up
from life_runfiles import Place
from life_specs import Keep, RunOptions, Schedule, render

pytestmark = pytest.mark.slow
RUN = RunOptions(epochs=3, seed=0, mode="sync")
S1 = Schedule(ckpt="5 steps", best=False)
S2 = Schedule(validate="2 epochs", ckpt="8 steps", best=False)


def _train(case: Path, spec: str, *extra: str, fault: Fault = NO_FAULT) -> Outcome:
    return run_cli(["train", spec, "--run-dir", "run", *extra], case, fault=fault,
                   run_dir=case / "run")


def _files(case: Path) -> dict[str, bytes]:
    return {str(p.relative_to(case)): p.read_bytes()
            for p in sorted((case / "run").rglob("*")) if p.is_file() and p.name != ".lock"}


@pytest.fixture(scope="module")
def ended(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run: preempted after step 24 (its last) with S1, finished with S2."""
    warm_up()
    case = tmp_path_factory.mktemp("requeue")
    (case / "s1.toml").write_text(render(RUN, S1, Keep()))
    (case / "s2.toml").write_text(render(RUN, S2, Keep()))
    assert _train(case, "s1.toml", fault=Fault("term", 23)).code == 75
    got = _train(case, "s2.toml", "--resume", "auto", "--schedule-change", "apply")
    assert got.code == 0, got.stderr[-600:]
    assert run_cli(["status", "run"], case).stderr.startswith("run: finished at step 24")
    return case


@pytest.mark.parametrize("rule", [(), ("--schedule-change", "apply"),
                                  ("--schedule-change", "refuse")])
@pytest.mark.parametrize("by_path", [False, True])
def test_a_requeued_ended_run_has_nothing_to_do_whatever_its_checkpoint_holds(
        ended: Path, rule: tuple[str, ...], by_path: bool) -> None:
    before = _files(ended)
    newest = sorted(Place(ended / "run").names())[-1]
    resume = str(ended / "run" / "checkpoints" / newest) if by_path else "auto"
    got = _train(ended, "s2.toml", "--resume", resume, *rule)
    if by_path:
        assert got.code == 2 and "nothing left to resume" in got.stderr, got.stderr[-600:]
    else:
        assert got.code == 0, got.stderr[-600:]
        assert got.lines() == ["the run finished at step 24; nothing left to do"]
    assert "another schedule" not in got.stderr and "applying" not in got.stderr
    assert "Traceback" not in got.stderr
    assert _files(ended) == before


def test_an_end_moved_later_is_judged_as_a_changed_schedule(ended: Path) -> None:
    """Four epochs instead of three: the run has more to do, so the checkpoint's other
    schedule is refused (exit 2, the diff), every file as it was."""
    (ended / "s4.toml").write_text(render(RunOptions(epochs=4, seed=0, mode="sync"), S2,
                                          Keep()))
    before = _files(ended)
    got = _train(ended, "s4.toml", "--resume", "auto")
    assert got.code == 2 and "was saved with another schedule" in got.stderr, got.stderr
    assert _files(ended) == before
