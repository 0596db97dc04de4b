"""``plan --costs`` reads a run's log back: a FIFO in its place never blocks, a line that
is not JSON (or nests too deeply) is named, and a logged save cost that is not a number
in bounds is refused by file and line, never used."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from schedtrain.planning.auto import logged_save_cost
from schedtrain.planning.costs import CostError, read_costs
from schedtrain.readback import DamagedFile


def _returns_within(call: object, seconds: float = 10) -> BaseException | None:
    got: list[BaseException | None] = []

    def run() -> None:
        try:
            call()  # type: ignore[operator]
            got.append(None)
        except BaseException as exc:  # the thread reports what it got
            got.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked on a FIFO"
    return got[0]


def test_a_fifo_in_the_logs_place_never_blocks(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    os.mkfifo(events)
    assert isinstance(_returns_within(lambda: read_costs(events)), CostError)
    assert isinstance(_returns_within(lambda: logged_save_cost(events, "ckpt")), DamagedFile)


@pytest.mark.parametrize("line", ["[" * 100_000, '{"kind": "firing", "duration": NaN}'])
def test_a_bad_line_is_named(tmp_path: Path, line: str) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text(line + "\n")
    with pytest.raises(CostError, match=r"events.jsonl:1: not a JSON line"):
        read_costs(events)


@pytest.mark.parametrize("value", ["0.5", None, True, 1e308, -1e12, [1]])
def test_a_save_cost_out_of_bounds_is_refused_by_line(tmp_path: Path, value: object) -> None:
    events = tmp_path / "events.jsonl"
    good = {"kind": "scalar", "name": "ckpt/save_cost", "value": 0.25, "step": 10}
    events.write_text(json.dumps(good) + "\n" + json.dumps({**good, "value": value}) + "\n")
    with pytest.raises(DamagedFile) as err:
        logged_save_cost(events, "ckpt")
    assert err.value.key == "line 2.value"


def test_good_costs_are_averaged(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    rows = [{"kind": "scalar", "name": "ckpt/save_cost", "value": v, "step": 10} for v in
            (0.25, 0.75)]
    events.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert logged_save_cost(events, "ckpt") == 0.5
