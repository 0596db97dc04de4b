"""A resumed saver prunes its own files by its keep policy once its state is restored:
the pruning a ``kill -9`` cut short (after a save's commit, before its pruning) is done
at the resume, and a resume with another ``keep`` prunes by it at once, whether or not a
save follows. Never another's file, never the newest finite one nor the one resumed
from; in a local folder and an object-store ``checkpoint_dir`` alike. Real commands in
forked children, the kill planted in the child (tests/life_faults.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from life_faults import NO_FAULT, Fault, run_cli, warm_up
from life_runfiles import Place, s3_bucket
from life_specs import Keep, RunOptions, Schedule, render

pytestmark = pytest.mark.slow
#: 4 epochs of 8 steps, a checkpoint every 8 steps: steps 8, 16, 24, 32
RUN = RunOptions(epochs=4, seed=0, mode="sync")
SAVES = Schedule(validate="1 epoch", ckpt="8 steps", best=False)


@pytest.fixture(scope="module")
def bucket() -> Iterator[tuple[str, str, Any]]:
    warm_up()
    with s3_bucket() as found:
        yield found


def _place(case: Path, where: str, bucket: tuple[str, str, Any]) -> tuple[Place, RunOptions]:
    run_dir = case / "run"
    if where == "local":
        return Place(run_dir), RUN
    name, endpoint, client = bucket
    place = Place(run_dir, name, f"{case.name}/checkpoints", client)
    return place, RunOptions(epochs=4, seed=0, mode="sync",
                             checkpoint_dir=place.url("")[:-1], endpoint=endpoint)


def _train(case: Path, spec: str, *extra: str, fault: Fault = NO_FAULT) -> Any:
    return run_cli(["train", spec, "--run-dir", "run", *extra], case, fault=fault,
                   run_dir=case / "run")


@pytest.mark.parametrize("kill_at", [4, 3, 2])
def test_the_pruning_a_kill_cut_short_is_done_at_the_resume(
        tmp_path: Path, bucket: tuple[str, str, Any], kill_at: int) -> None:
    """Killed right after the n-th checkpoint's commit: once resumed, the files are the
    uninterrupted run's (at the last save, with no save after the resume, too). The
    planted kill is a local write's (in a bucket the keep test below covers it)."""
    whole, case = tmp_path / "whole", tmp_path / "case"
    whole.mkdir()
    case.mkdir()
    spec = render(RUN, SAVES, Keep(latest=1))
    (whole / "s.toml").write_text(spec)
    assert _train(whole, "s.toml").code == 0
    want = Place(whole / "run").names()
    assert want == {"step-00000032.pt"}
    place, run = _place(case, "local", bucket)
    (case / "s.toml").write_text(render(run, SAVES, Keep(latest=1)))
    killed = _train(case, "s.toml", fault=Fault("kill_commit", kill_at))
    assert killed.code == -9
    assert len(place.names()) == 2  # the newest committed, its pruning never ran
    got = _train(case, "s.toml", "--resume", "auto")
    assert got.code == 0, got.stderr[-600:]
    assert place.names() == want


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_resume_with_another_keep_prunes_by_it_at_once(
        tmp_path: Path, bucket: tuple[str, str, Any], where: str) -> None:
    """Preempted after the last step (its last save pruned by ``latest = 3``), resumed
    with ``latest = 1``: no save follows, and the new policy has judged the files at the
    resume; the one resumed from stays."""
    place, run = _place(tmp_path, where, bucket)
    (tmp_path / "s1.toml").write_text(render(run, SAVES, Keep(latest=3)))
    (tmp_path / "s2.toml").write_text(render(run, SAVES, Keep(latest=1)))
    assert _train(tmp_path, "s1.toml", fault=Fault("term", 31)).code == 75
    assert place.names() == {f"step-{s:08d}.pt" for s in (16, 24, 32)}
    got = _train(tmp_path, "s2.toml", "--resume", "auto")
    assert got.code == 0, got.stderr[-600:]
    assert "resumed from" in got.stderr and "step-00000032.pt at step 32" in got.stderr
    assert place.names() == {"step-00000032.pt"}


def test_a_best_saver_prunes_its_history_by_the_new_keep_at_the_resume(
        tmp_path: Path) -> None:
    """``MinSaver`` keeping its new bests' history, preempted in epoch 4, resumed
    with a smaller ``keep`` and killed in epoch 4, before its next firing: the history
    was pruned to the new keep at the resume; its best file and the ModelSaver's stay."""
    def spec(keep: int) -> str:
        head: str = render(RUN, SAVES, Keep(latest=4))
        return head + (
            '\n[callbacks.best]\ntype = "MinSaver"\nmonitor = "val/loss"\n'
            f'keep = {keep}\ntrigger = {{ every = "1 epoch" }}\n')
    (tmp_path / "s1.toml").write_text(spec(4))
    (tmp_path / "s2.toml").write_text(spec(1))
    assert _train(tmp_path, "s1.toml", fault=Fault("term", 24)).code == 75  # after 25
    best = tmp_path / "run" / "best"
    history = sorted(p.name for p in best.glob("min-val-loss-step-*.pt"))
    assert len(history) >= 2  # val/loss fell at least twice in 3 epochs
    checkpoints = Place(tmp_path / "run").names()
    got = _train(tmp_path, "s2.toml", "--resume", "auto", fault=Fault("kill", 26))
    assert got.code == -9, got.stderr[-600:]
    assert sorted(p.name for p in best.glob("min-val-loss-step-*.pt")) == history[-1:]
    assert (best / "min-val-loss.pt").exists()
    assert Place(tmp_path / "run").names() == checkpoints


def test_a_topk_saver_prunes_by_the_new_keep_at_the_resume(tmp_path: Path) -> None:
    """``TopKSaver`` keeping the best and the 3 newest, resumed keeping the best and the
    newest, killed before its next firing: at most those two files are left."""
    def spec(latest: int) -> str:
        head: str = render(RUN, SAVES, Keep(latest=4))
        return head + (
            '\n[callbacks.top]\ntype = "TopKSaver"\nmonitor = "val/loss"\n'
            f'keep = {{ any = [{{ best = 1 }}, {{ latest = {latest} }}] }}\n'
            'save_last = false\ntrigger = { every = "1 epoch" }\n')
    (tmp_path / "s1.toml").write_text(spec(3))
    (tmp_path / "s2.toml").write_text(spec(1))
    assert _train(tmp_path, "s1.toml", fault=Fault("term", 24)).code == 75  # after 25
    best = tmp_path / "run" / "best"
    before = sorted(p.name for p in best.glob("val-loss-step-*.pt"))
    assert len(before) == 3
    got = _train(tmp_path, "s2.toml", "--resume", "auto", fault=Fault("kill", 26))
    assert got.code == -9, got.stderr[-600:]
    after = sorted(p.name for p in best.glob("val-loss-step-*.pt"))
    assert before[-1] in after and set(after) < set(before) and len(after) <= 2
