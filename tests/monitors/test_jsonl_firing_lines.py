"""A firing's line in events.jsonl is exactly what ``json.dumps`` of its row writes."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedtrain.monitors.jsonl import JsonlWriter, _firing_row
from schedtrain.readback import DamagedFile
from schedtrain.time import Timestamp

counts = st.integers(min_value=0, max_value=2**62)
timestamps = st.builds(Timestamp, counts, counts, counts, counts, counts, counts,
                       st.integers(min_value=0, max_value=10**9)
                       | st.floats(min_value=0, max_value=1e9))
walls = st.floats(allow_nan=True, allow_infinity=True)


@settings(max_examples=200, deadline=None)
@given(callback=st.text(), event=st.text(), ts=timestamps, wall=walls,
       duration=st.none() | st.floats(allow_nan=True, allow_infinity=True))
def test_firing_line_is_json_dumps_of_the_row(callback: str, event: str, ts: Timestamp,
                                              wall: float, duration: float | None) -> None:
    row = _firing_row(callback, event, ts, wall)
    with tempfile.TemporaryDirectory() as d:
        writer = JsonlWriter(Path(d) / "events.jsonl")
        # twice: the second line comes from the cached head
        for _ in range(2):
            if duration is None:
                writer.firing(callback, event, ts, wall)
            else:
                writer.firing_timed(callback, event, ts, wall, duration)
        writer.close()
        text = (Path(d) / "events.jsonl").read_text()
    expected = json.dumps(row if duration is None else {**row, "duration": duration}) + "\n"
    assert text == expected * 2


@given(st.lists(st.text(max_size=12), min_size=1, max_size=6), st.data())
def test_a_resume_cuts_the_log_only_between_lines(texts: list[str], data: st.DataObject
                                                  ) -> None:
    """Cut back to a checkpoint's length: at a line's end it cuts, inside a line (the log
    was edited before it) it refuses naming the line, the log left as it was."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        body = "".join(json.dumps({"t": t}) + "\n" for t in texts).encode()
        path.write_bytes(body)
        size = data.draw(st.integers(0, len(body) - 1))
        writer = JsonlWriter(path)
        if size == 0 or body[size - 1:size] == b"\n":
            writer.truncate(size)
            assert path.read_bytes() == body[:size]
        else:
            with pytest.raises(DamagedFile) as err:
                writer.truncate(size)
            line = body[:size].count(b"\n") + 1
            assert err.value.key == f"line {line}"
            assert path.read_bytes() == body
