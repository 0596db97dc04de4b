"""A job whose saver uses ``every = "auto"`` takes a schedule change as a job with fixed
intervals does (issue 42, E1): ``diff RUN_DIR NEW``, ``train NEW --resume auto
--schedule-change apply`` and a live ``retime``, with NEW a whole spec or a schedule-only
file. The stored schedule has no ``[run]``: the failure rate is the run's, never asked
of it again, and "not written by schedtrain" is said only of a schedule that does not
read."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from jobs import forked
from jobs.trials import env

from schedtrain.cli import main

SPEC = """\
[run]
task = "jobs.crash:make_task"
max_epochs = {epochs}
seed = 3
mtbf = "{mtbf}"
checkpoint_mode = "sync"

[callbacks.validate]
type = "InferenceRunner"
trigger = {{ every = "{validate}" }}

[callbacks.ckpt]
type = "ModelSaver"
keep = 3
trigger = {{ every = "auto" }}
"""

#: NEW's schedule alone: a file without [run] (the job's own [run] applies).
ONLY = """\
[callbacks.validate]
trigger = { every = "2 epochs" }

[callbacks.ckpt]
trigger = { every = "auto" }
"""

STEPS = 64  # 512 samples in batches of 8


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


def _firings(run_dir: Path, callback: str) -> list[int]:
    return [r["step"] for r in _rows(run_dir)
            if r["kind"] == "firing" and r["callback"] == callback]


@pytest.fixture
def trained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    """A finished 2-epoch run of the auto job, its new spec (3 epochs, validation every 2),
    and the new schedule alone."""
    monkeypatch.chdir(tmp_path)
    old, new, only = tmp_path / "old.toml", tmp_path / "new.toml", tmp_path / "only.toml"
    old.write_text(SPEC.format(epochs=2, mtbf="10 min", validate="1 epoch"))
    new.write_text(SPEC.format(epochs=3, mtbf="10 min", validate="2 epochs"))
    only.write_text(ONLY)
    run_dir = tmp_path / "run"
    code, _, err = _cli("train", str(old), "--run-dir", str(run_dir))
    assert code == 0, err
    return run_dir, new, only


def _newest(run_dir: Path) -> int:
    return max(int(re.findall(r"\d+", p.name)[0]) for p in
               (run_dir / "checkpoints").glob("step-*.pt"))


@pytest.mark.parametrize("side", ["new", "only"])
def test_diff_of_an_auto_run_prints_its_firings(trained: tuple[Path, Path, Path],
                                                side: str) -> None:
    """diff RUN_DIR NEW and diff CHECKPOINT NEW: the firings after the checkpoint's step,
    for a whole spec and a schedule-only file alike (exit 1: they differ)."""
    run_dir, new, only = trained
    step = _newest(run_dir)
    target = str(new if side == "new" else only)
    for old in (run_dir, run_dir / "checkpoints" / f"step-{step:08d}.pt"):
        code, out, err = _cli("diff", str(old), target, "--epochs", "3",
                              "--steps-per-epoch", str(STEPS))
        assert code == 1, err
        assert "mtbf" not in err and err.count("\n") <= 1
        assert f"firings after step {step}" in out
        assert f"removed epoch_end step {STEPS} (epoch 1)" in out


def test_resume_with_another_schedule_is_refused_by_its_diff_then_applied(
        trained: tuple[Path, Path, Path]) -> None:
    """--resume auto with NEW: refused with the diff (not as an unreadable checkpoint);
    with --schedule-change apply: resumed with NEW's schedule, the saver's state kept."""
    run_dir, new, _ = trained
    step = _newest(run_dir)
    before = _firings(run_dir, "ckpt")
    code, _, err = _cli("train", str(new), "--run-dir", str(run_dir), "--resume", "auto")
    assert code == 2
    assert "was saved with another schedule" in err and "not written by schedtrain" not in err
    assert "mtbf" not in err
    code, _, err = _cli("train", str(new), "--run-dir", str(run_dir), "--resume", "auto",
                        "--schedule-change", "apply")
    assert code == 0, err
    rows = _rows(run_dir)
    changes = [r for r in rows if r["kind"] == "schedule_change"]
    assert [(c["step"], c["rule"]) for c in changes] == [(step, "apply")]
    assert [s for s in _firings(run_dir, "validate") if s > step] == [2 * STEPS]
    # The saver was kept: its trigger goes on from the checkpoint's state (its next
    # save where that state put it), not from a fresh first save at step 10 again.
    assert [s for s in _firings(run_dir, "ckpt") if s <= step] == [
        s for s in before if s <= step]
    assert all(s > step + 10 for s in _firings(run_dir, "ckpt") if s > step)


@pytest.mark.slow
@pytest.mark.parametrize("side", ["new", "only"])
def test_a_running_auto_job_is_retimed(tmp_path: Path, side: str) -> None:
    """schedtrain retime RUN_DIR NEW (a whole spec, or a schedule-only file) while an auto
    job (a child forked from the test process, ``jobs.forked``) runs: applied; validation
    fires by the new schedule after it, and the saver goes on deciding: each save after
    the change is its previous save plus the interval logged before that one's firing."""
    spec, new = tmp_path / "job.toml", tmp_path / "new.toml"
    spec.write_text(SPEC.format(epochs=3, mtbf="1 s", validate="1 epoch"))
    new.write_text(SPEC.format(epochs=3, mtbf="1 s", validate="2 epochs")
                   if side == "new" else ONLY)
    run_dir = tmp_path / "run"
    proc = forked.schedtrain(["train", str(spec), "--run-dir", str(run_dir)], cwd=tmp_path,
                             env={**env(0), "CRASH_JOB_STEP_SECONDS": "0.02"})
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "events.jsonl").exists() or not _firings(run_dir, "ckpt"):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the job never saved"
            time.sleep(0.02)
        code, out, err = _cli("retime", str(run_dir), str(new), "--wait", "120")
        assert code == 0, err
        assert "changed callbacks.validate.trigger" in out
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    answer = json.loads((run_dir / "retime.answer.json").read_text())
    assert answer["status"] == "applied", answer
    step = answer["step"]
    assert step < 3 * STEPS - 10, "applied too late to see the saver go on: retime earlier"
    assert [s for s in _firings(run_dir, "validate") if s > step] == [
        s for s in (STEPS, 2 * STEPS, 3 * STEPS) if s > step and s % (2 * STEPS) == 0]
    rows = _rows(run_dir)
    saves = _firings(run_dir, "ckpt")
    decided = [(r["step"], int(r["value"])) for r in rows if r.get("name") == "ckpt/interval"]
    assert [s for s in saves if s > step], "no save after the change"
    for prev, nxt in itertools.pairwise(saves):
        # sync: the save at `prev` was placed by the newest decision logged before it
        # fired (the first, before any decision, by the start interval of 10 steps)
        known = [v for s, v in decided if s < prev]
        assert nxt - prev == (known[-1] if known else 10), (prev, nxt, decided)


@pytest.mark.parametrize(("old", "new"), [
    ('{ every = "50 steps" }', '{ every = "auto" }'),
    ('{ every = "auto" }', '{ every = "50 steps" }'),
    ('{ every = "auto" }', '{ every = "auto", offset = "5 steps" }'),
    ('{ any = [{ every = "auto" }, { on = "train_end" }] }', '{ every = "auto" }'),
])
def test_a_live_change_of_an_auto_trigger_is_refused(tmp_path: Path, old: str,
                                                     new: str) -> None:
    """A running saver measures its saves into the deciders it was built with: a retime
    that changes a trigger holding every = "auto" (before or after) is refused in one
    line, by the command and by the job's rules alike, with the way to make it."""
    import os

    from schedtrain.planning.changes import canonical
    from schedtrain.planning.requests import live_refusal
    from schedtrain.spec import loads_spec

    def text(trigger: str) -> str:
        got = canonical(loads_spec(ONLY.replace('{ every = "auto" }', trigger),
                                   schedule_only=True).schedule())
        assert got is not None
        return got

    why = live_refusal(text(old), text(new))
    assert why is not None and 'callbacks.ckpt: its trigger changes and holds every = "auto"' \
        in why and "--schedule-change apply" in why
    assert live_refusal(text(old), text(old).replace("2 epochs", "3 epochs")) is None
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps(
        {"status": "running", "pid": os.getpid(), "step": 4, "epoch": 0,
         "schedule": text(old)}))
    (tmp_path / "new.toml").write_text(ONLY.replace('{ every = "auto" }', new))
    code, _, err = _cli("retime", str(run_dir), str(tmp_path / "new.toml"))
    assert code == 2 and err.count("\n") == 1 and "holds every = \"auto\"" in err, err
    assert not (run_dir / "retime.json").exists()
