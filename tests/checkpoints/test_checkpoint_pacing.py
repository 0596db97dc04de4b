"""Background writes that leave the step its speed: kept staging buffers and a paced writer.

The snapshot of an async save is copied into the buffers of the last one
(``checkpoint_staging = "reuse"``), and the writing thread is busy at most
``checkpoint_write_share`` of the time until the loop waits for it. Neither changes a
byte written, and nothing waits longer than the write itself.
"""

from __future__ import annotations

import io
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_async_checkpoints import _trainer

from schedtrain.checkpoints import pacing
from schedtrain.checkpoints.background import Writer
from schedtrain.checkpoints.format import digest
from schedtrain.checkpoints.pacing import Pace, paced, paced_file, pause
from schedtrain.checkpoints.staging import Staging
from schedtrain.cli import main as cli_main
from schedtrain.monitors import store as store_module
from schedtrain.spec.model import CPU_WRITE_SHARE
from schedtrain.training import dispatch as dispatch_module


def _ptrs(tree: dict[str, torch.Tensor]) -> dict[str, int]:
    return {k: v.untyped_storage().data_ptr() for k, v in tree.items()}


class TestStaging:
    """Each snapshot equals the live state at its time, whatever buffers it went into."""

    @settings(max_examples=40, deadline=None)
    @given(st.lists(st.integers(1, 5), min_size=1, max_size=4),
           st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(1, 6)),
                    min_size=1, max_size=6),
           st.sampled_from(["reuse", "fresh"]))
    def test_snapshots_equal_the_state_of_their_time(
            self, sizes: list[int], edits: list[tuple[int, int, int]], mode: str) -> None:
        """Between snapshots the live tensors change in place or are replaced by ones of
        another size: every snapshot holds the values of its time; ``reuse`` copies into
        the former buffer of a storage of the same size, ``fresh`` never does."""
        live = {f"t{i}": torch.arange(float(n)) for i, n in enumerate(sizes)}
        staging = Staging(mode)
        before, sources = staging.snapshot(live, free=True), _ptrs(live)
        for index, kind, size in edits:
            name = f"t{index % len(sizes)}"
            if kind == 0:
                live[name].add_(1.0)  # in place: same storage
            elif kind == 1:
                live[name] = torch.full((size,), float(size))  # a new storage
            copy = staging.snapshot(live, free=True)
            for k, v in live.items():
                assert torch.equal(copy[k], v)
                assert copy[k].untyped_storage().data_ptr() != v.untyped_storage().data_ptr()
                kept = (mode == "reuse" and _ptrs(live)[k] == sources[k]
                        and v.untyped_storage().nbytes() == before[k].untyped_storage().nbytes())
                assert (_ptrs(copy)[k] == _ptrs(before)[k]) == kept
            before, sources = copy, _ptrs(live)

    def test_reuse_holds_the_last_snapshot_and_fresh_nothing(self) -> None:
        """``held_bytes``: the memory kept between saves."""
        live = {"w": torch.zeros(100), "b": torch.zeros(10, dtype=torch.float64)}
        for mode, held in (("reuse", 100 * 4 + 10 * 8), ("fresh", 0)):
            staging = Staging(mode)
            staging.snapshot(live, free=True)
            assert staging.held_bytes == held

    def test_buffers_a_write_may_still_read_are_not_copied_into(self) -> None:
        """Not ``free`` (a forgotten write runs on): new buffers, the old copy intact."""
        live = {"w": torch.zeros(8)}
        staging = Staging("reuse")
        first = staging.snapshot(live, free=True)
        live["w"].add_(2.0)
        second = staging.snapshot(live, free=False)
        assert torch.equal(first["w"], torch.zeros(8))
        assert torch.equal(second["w"], torch.full((8,), 2.0))
        assert _ptrs(first) != _ptrs(second)

    def test_a_forgotten_write_keeps_its_buffers(self) -> None:
        """After ``forget`` (a second Ctrl-C) the stray thread's snapshot is not reused
        while it runs."""
        gate = threading.Event()
        writer = Writer()
        live = {"w": torch.ones(4)}
        first = writer.stage(live)
        writer.start(lambda: gate.wait(timeout=30))
        writer.forget()
        second = writer.stage(live)
        assert _ptrs(first) != _ptrs(second)
        gate.set()
        assert writer._stray is not None
        writer._stray.join()
        third = writer.stage(live)
        assert _ptrs(third) == _ptrs(second)

    def test_refused(self) -> None:
        with pytest.raises(ValueError, match="`checkpoint_staging` must be one of"):
            Staging("keep")


class _FakeEvent:
    """``Event`` whose ``wait`` records its timeout and advances a fake wall clock
    (``clock[0]``; ``clock[1]`` is the thread's CPU time, which a sleep leaves)."""

    def __init__(self, clock: list[float]) -> None:
        self.clock, self.waits, self.set_ = clock, [], False

    def is_set(self) -> bool:
        return self.set_

    def set(self) -> None:
        self.set_ = True

    def wait(self, timeout: float) -> bool:
        self.waits.append(timeout)
        self.clock[0] += timeout
        return self.set_


def _work(clock: list[float], seconds: float) -> None:
    clock[0] += seconds
    clock[1] += seconds


class TestPace:
    """Busy at most its share of the time, until released."""

    @given(st.floats(0.01, 1.0), st.lists(st.floats(0.0, 0.5), min_size=1, max_size=20))
    def test_busy_at_most_its_share(self, share: float, works: list[float]) -> None:
        """Over any run of pieces, the time slept makes the busy time at most ``share`` of
        the whole, less the last piece not yet paid for (< ``QUANTUM``)."""
        clock = [0.0, 0.0]
        original = pacing.time
        pacing.time = types.SimpleNamespace(  # type: ignore[assignment]
            thread_time=lambda: clock[1], perf_counter=lambda: clock[0])
        try:
            pace = Pace(share)
            event = _FakeEvent(clock)
            pace._released = event  # type: ignore[assignment]
            tail = 0.0  # work since the last sleep: not yet paid for
            for work in works:
                _work(clock, work)
                slept = len(event.waits)
                pace.pause()
                tail = 0.0 if len(event.waits) > slept else tail + work
        finally:
            pacing.time = original  # type: ignore[assignment]
        if share == 1.0:
            assert event.waits == []
            return
        # The pace sees busy time as a difference of clock readings, which rounds: a
        # tail of exactly QUANTUM may read as a hair less and not yet be paid for.
        assert tail < pacing.QUANTUM + 1e-9
        assert sum(works) - tail <= share * (clock[0] - tail) + 1e-9

    def test_no_sleep_once_released(self) -> None:
        clock = [0.0, 0.0]
        original = pacing.time
        pacing.time = types.SimpleNamespace(  # type: ignore[assignment]
            thread_time=lambda: clock[1], perf_counter=lambda: clock[0])
        try:
            pace = Pace(0.1)
            event = _FakeEvent(clock)
            pace._released = event  # type: ignore[assignment]
            _work(clock, 1.0)
            pace.pause()
            assert event.waits == [pytest.approx(9.0)]
            pace.release()
            _work(clock, 1.0)
            pace.pause()
            assert len(event.waits) == 1
        finally:
            pacing.time = original  # type: ignore[assignment]

    @pytest.mark.parametrize("share", [0.0, -0.5, 1.5, float("nan")])
    def test_refused(self, share: float) -> None:
        with pytest.raises(ValueError, match=r"share of the time must be in \(0, 1\]"):
            Pace(share)

    def test_waiting_for_the_write_wakes_it_from_its_pace(self) -> None:
        """A write paced at a thousandth of the time would sleep ~20 s after its first
        piece; ``result`` lifts the pace, so the loop waits only for the work."""
        pieces: list[int] = []

        def write() -> str:
            for i in range(3):
                end = time.thread_time() + pacing.QUANTUM * 1.5
                while time.thread_time() < end:
                    pass
                pieces.append(i)
                pause()
            return "done"

        writer = Writer(share=0.001)
        writer.start(write)
        while not pieces:
            time.sleep(0.01)
        start = time.perf_counter()
        assert writer.result() == "done"
        assert pieces == [0, 1, 2]
        assert time.perf_counter() - start < 10.0  # a paced write would take ~60 s


@pytest.fixture
def tiny_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of a few bytes and a pause after each: every paced path is taken."""
    monkeypatch.setattr(pacing, "PIECE", 7)
    monkeypatch.setattr(pacing, "QUANTUM", 0.0)


class TestSameBytes:
    """Paced writes and reused buffers write what an unpaced, fresh write does."""

    @settings(max_examples=20, deadline=None,  # the fixture only sets module constants
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(st.integers(0, 40), min_size=1, max_size=4))
    def test_paced_file_and_digest(self, tiny_pieces: None, sizes: list[int]) -> None:
        state = {f"t{i}": torch.arange(float(n)) for i, n in enumerate(sizes)}
        plain = io.BytesIO()
        torch.save(state, plain)
        expected = digest(state)
        paced_out = io.BytesIO()
        with paced(Pace(0.999)):
            torch.save(state, paced_file(paced_out))
            assert digest(state) == expected
        assert paced_out.getvalue() == plain.getvalue()

    def test_a_run_writes_the_same_files(self, tmp_path: Path, tiny_pieces: None,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
        """sync, async reusing buffers and paced, async fresh: byte-identical checkpoints."""
        monkeypatch.setattr(store_module, "time", types.SimpleNamespace(time=lambda: 1.0))
        monkeypatch.setattr(dispatch_module, "time",
                            types.SimpleNamespace(time=lambda: 1.0, monotonic=lambda: 0.0))
        runs: dict[str, dict[str, Any]] = {
            "sync": {"mode": "sync"},
            "reuse": {"checkpoint_staging": "reuse", "checkpoint_write_share": 0.999},
            "fresh": {"checkpoint_staging": "fresh", "checkpoint_write_share": 1.0}}
        for name, kw in runs.items():
            _trainer(tmp_path / name, keep=None, **kw).fit()
        files = {name: {p.name: p.read_bytes()
                        for p in (tmp_path / name / "checkpoints").iterdir()}
                 for name in runs}
        assert len(files["sync"]) == 4
        assert files["sync"] == files["reuse"] == files["fresh"]


class TestOptions:
    """The write share: its default by device, and bad values refused by name."""

    def test_default_by_device(self, tmp_path: Path) -> None:
        t = _trainer(tmp_path / "a")
        assert t.checkpoints.writer.share == CPU_WRITE_SHARE
        assert pacing.write_share(None, "cuda") == 1.0
        t = _trainer(tmp_path / "b", checkpoint_write_share=0.5, checkpoint_staging="fresh")
        assert t.checkpoints.writer.share == 0.5
        assert t.checkpoints.writer.staging.mode == "fresh"

    @pytest.mark.parametrize("share", [0, 1.5, float("nan"), True, "half"])
    def test_refused(self, tmp_path: Path, share: object) -> None:
        with pytest.raises(ValueError, match="`checkpoint_write_share`: expected a number"):
            _trainer(tmp_path, checkpoint_write_share=share)

    @pytest.mark.parametrize(("line", "expected"), [
        ("checkpoint_write_share = 0", "a number > 0 and <= 1"),
        ("checkpoint_write_share = 2.5", "a number > 0 and <= 1"),
        ('checkpoint_staging = "keep"', "'reuse' or 'fresh'")])
    def test_check_names_the_key(self, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 line: str, expected: str) -> None:
        spec = tmp_path / "s.toml"
        spec.write_text(f"[run]\nmax_epochs = 1\n{line}\n\n[callbacks.log]\n"
                        'type = "Log"\ntrigger = { every = "1 epoch" }\n')
        assert cli_main(["check", str(spec)]) != 0
        err = capsys.readouterr()
        out = err.out + err.err
        assert f"run.{line.split(' =', maxsplit=1)[0]}" in out and expected in out
        assert "Traceback" not in out
