"""A live retime is applied once, by its request's id, however the job is killed while it
applies it: a ``kill -9`` after ``retimes.json`` recorded the retime but before the
request (``retime.json``) was removed leaves a resumed run that answers the request as
applied where it was, and replays it there (it used to apply it again at its first look,
at another step). Killed before the journal was written, the request is applied once by
the resumed run.

Each job is a child forked from the test process (``jobs.forked``: torch imported once),
its 20 ms steps paced on a clock of its own (``retime_kill.job``'s ``virtual``), not
slept."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from jobs.forked import Forked, warm_up
from jobs.retime_kill import NEW, OLD, job
from jobs.trials import compare, env

from schedtrain.planning.changes import canonical
from schedtrain.planning.requests import (
    ANSWER_FILE,
    REQUEST_FILE,
    Applied,
    History,
    read_answer,
    read_history,
    write_history,
)

pytestmark = pytest.mark.slow


def _job(run_dir: Path, kill: str, marker: Path, ask_at: int, weights: Path
         ) -> subprocess.CompletedProcess[str]:
    def body() -> int:
        job(run_dir, kill, marker, ask_at, weights, virtual=True)
        return 0
    warm_up()
    args = ["jobs.retime_kill", str(run_dir), kill, str(marker), str(ask_at), str(weights)]
    proc = Forked(body, cwd=run_dir.parent, env=env(0), args=args)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode is not None
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _retimes(run_dir: Path) -> list[int]:
    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if r["kind"] == "schedule_change"]


def _reference(tmp: Path, applied: Applied) -> Path:
    """The uninterrupted run with the same retime at the same step (replayed from its
    retimes.json by a resume that finds no checkpoint)."""
    reference = tmp / "reference"
    reference.mkdir()
    base = canonical(OLD)
    assert base is not None
    write_history(reference, History(base, (applied,)))
    marker = tmp / "asked-reference"
    marker.write_text("")  # the reference asks nothing
    done = _job(reference, "none", marker, 0, tmp / "reference.pt")
    assert done.returncode == 0, done.stderr[-3000:]
    return reference


@pytest.mark.parametrize("ask_at", [5, 40])
@pytest.mark.parametrize("kill", ["after-journal", "after-answer", "before-journal"])
def test_a_retime_is_applied_once_across_a_kill(tmp_path: Path, kill: str,
                                                ask_at: int) -> None:
    """Killed at each point of applying a request, then resumed: one retime in the log,
    in retimes.json (with the request's id) and in the answer, all at one step; no
    request left; the log and checkpoints those of an uninterrupted run retimed there."""
    run_dir, marker = tmp_path / "run", tmp_path / "asked"
    killed = _job(run_dir, kill, marker, ask_at, tmp_path / "killed.pt")
    assert killed.returncode == -9, killed.stderr[-3000:]
    ident = marker.read_text()
    assert (run_dir / REQUEST_FILE).exists()  # the kill left the request unanswered
    before = read_history(run_dir)
    assert (before is None) == (kill == "before-journal")
    resumed = _job(run_dir, "none", marker, ask_at, tmp_path / "resumed.pt")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    history = read_history(run_dir)
    assert history is not None and len(history.applied) == 1
    (applied,) = history.applied
    if before is not None:  # where the killed run applied it, and nowhere else
        assert [a.step for a in before.applied] == [applied.step]
    assert _retimes(run_dir) == [applied.step]
    assert applied.schedule == canonical(NEW) and applied.id == ident
    if before is not None:
        assert before.applied == history.applied
    answer = read_answer(run_dir, ident)
    assert answer is not None and (answer.status, answer.step) == ("applied", applied.step)
    assert not (run_dir / REQUEST_FILE).exists() and (run_dir / ANSWER_FILE).exists()
    reference = _reference(tmp_path, applied)
    assert compare(reference, run_dir) == []
    want: dict[str, Any] = torch.load(tmp_path / "reference.pt", weights_only=True)
    got: dict[str, Any] = torch.load(tmp_path / "resumed.pt", weights_only=True)
    assert all(torch.equal(want[k], got[k]) for k in want)
