"""``run.json`` as ``RunDirectory.record`` writes it: what re-reading it would give.

The lock's holder keeps what it wrote last instead of reading the file back at each
record (a live retime's step records once); the file must hold exactly what a record
over the file read back would write.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedtrain.planning.run_status import RUN_FILE
from schedtrain.training.run_dir import RunDirectory

_FIELDS = st.fixed_dictionaries({}, optional={
    "step": st.integers(0, 10**6),
    "epoch": st.integers(0, 1000),
    "checkpoint": st.sampled_from(["checkpoints/a.pt", "s3://b/c.pt"]),
    "phase": st.sampled_from(["step_end", "epoch_end", "train_end"]),
    "resumable": st.integers(0, 10**6),
    "schedule": st.none() | st.sampled_from(["[callbacks.a]\n", "[callbacks.b]\n"]),
    "batch_events": st.lists(st.sampled_from(["batch_start", "batch_end"]), unique=True),
})
_RECORDS = st.lists(st.tuples(st.sampled_from(["running", "finished", "preempted"]),
                              _FIELDS), min_size=1, max_size=6)


def _file(path: Path) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((path / RUN_FILE).read_text())
    return found


def _read_back(path: Path) -> dict[str, Any]:
    """What a record that reads the file back starts from (another object: no memory)."""
    return RunDirectory(path).status() or {}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])
@given(records=_RECORDS, earlier=_FIELDS)
def test_each_record_writes_what_a_read_back_would(tmp_path_factory: Any,
                                                   records: list[tuple[str, Any]],
                                                   earlier: dict[str, Any]) -> None:
    """Under the lock, after any records (an earlier run's file first), run.json holds
    the fields read back from it before, the new fields over them: byte for byte but
    the stamp."""
    path = tmp_path_factory.mktemp("run")
    before = RunDirectory(path)
    before.record("preempted", **earlier)  # an earlier run's file, no lock: read back
    directory = RunDirectory(path)
    directory.acquire()
    try:
        for status, fields in records:
            expected = {"format": "schedtrain-run-1", **_read_back(path), **fields,
                        "status": status}
            directory.record(status, **fields)
            written = _file(path)
            expected["pid"], expected["updated"] = written["pid"], written["updated"]
            assert written == json.loads(json.dumps(expected))
    finally:
        directory.release()


def test_a_record_after_the_lock_was_let_go_reads_the_file(tmp_path: Path) -> None:
    """Another holder's record between two of ours is kept: what was written is
    remembered only while the lock is held."""
    ours, theirs = RunDirectory(tmp_path), RunDirectory(tmp_path)
    ours.acquire()
    ours.record("running", step=3, epoch=0)
    ours.release()
    theirs.acquire()
    theirs.record("preempted", step=5, resumable=5, checkpoint="checkpoints/x.pt")
    theirs.release()
    ours.acquire()
    ours.record("running", step=6)
    ours.release()
    found = _file(tmp_path)
    assert (found["status"], found["step"], found["resumable"], found["checkpoint"]) == (
        "running", 6, 5, "checkpoints/x.pt")


def test_cleared_fields_are_not_written_again(tmp_path: Path) -> None:
    """--overwrite removes run.json: the next record starts from nothing, not from what
    the cleared run wrote."""
    directory = RunDirectory(tmp_path)
    directory.acquire()
    directory.record("running", step=4, resumable=4, checkpoint="checkpoints/y.pt")
    directory.clear()
    directory.record("running", step=0, epoch=0)
    directory.release()
    assert not {"resumable", "checkpoint"} & set(_file(tmp_path))
