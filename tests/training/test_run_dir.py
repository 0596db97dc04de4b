"""A run directory belongs to one run: locked, never silently reused, never re-finished."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from training_helpers import Noop, UnevenData, tiny_model

from schedtrain import Schedule, every, on
from schedtrain.callbacks import ModelSaver
from schedtrain.spec import loads_spec
from schedtrain.training import RunDirError, Trainer
from schedtrain.training.from_spec import run_dir_of
from schedtrain.training.run_dir import RunDirectory

mse = torch.nn.functional.mse_loss


def _trainer(run_dir: Path, epochs: int = 2, **kw: object) -> Trainer:
    model, opt = tiny_model()
    return Trainer(model, opt, UnevenData([3] * 4), mse,
                   schedule=Schedule({"save": every("1 epoch"), "end": on("train_end")}),
                   bindings={"save": ModelSaver(), "end": Noop()}, max_epochs=epochs,
                   run_dir=run_dir, **kw)  # type: ignore[arg-type]


class TestOwnership:
    """A directory holding a run is refused without resume or overwrite."""

    def test_a_second_fresh_run_is_refused(self, tmp_path: Path) -> None:
        """Starting a run where one ran already says what to do, and changes nothing."""
        _trainer(tmp_path).fit()
        before = (tmp_path / "events.jsonl").read_text()
        with pytest.raises(RunDirError, match=r"holds a run \(finished at step 6\); resume it "
                                              r"\(--resume auto\) or start over \(--overwrite\)"):
            _trainer(tmp_path).fit()
        assert (tmp_path / "events.jsonl").read_text() == before

    def test_overwrite_starts_afresh(self, tmp_path: Path) -> None:
        """--overwrite removes what the run wrote and runs again from step 0."""
        _trainer(tmp_path).fit()
        (tmp_path / "notes.txt").write_text("mine")
        t = _trainer(tmp_path, overwrite=True)
        t.fit()
        assert (tmp_path / "notes.txt").read_text() == "mine"
        fired = [json.loads(x)["callback"] for x in
                 (tmp_path / "events.jsonl").read_text().splitlines()
                 if json.loads(x)["kind"] == "firing"]
        assert fired.count("end") == 1

    def test_a_finished_run_is_not_fired_again(self, tmp_path: Path) -> None:
        """Resuming a finished run whose end did not move is refused: train_end stays once."""
        _trainer(tmp_path).fit()
        t = _trainer(tmp_path)
        t.resume(tmp_path / "checkpoints" / "step-00000006.pt")
        with pytest.raises(RunDirError, match="finished at step 6; there is nothing left"):
            t.fit()

    def test_a_finished_run_can_be_extended(self, tmp_path: Path) -> None:
        """With more epochs asked for, it continues, and its log is that of the longer run."""
        _trainer(tmp_path, epochs=2).fit()
        longer = _trainer(tmp_path, epochs=3)
        longer.resume(tmp_path / "checkpoints" / "step-00000006.pt")
        longer.fit()
        straight = tmp_path / "straight"
        _trainer(straight, epochs=3).fit()

        def firings(folder: Path) -> list[tuple[str, str, int]]:
            rows = [json.loads(x) for x in (folder / "events.jsonl").read_text().splitlines()]
            return [(r["callback"], r["event"], r["step"]) for r in rows
                    if r["kind"] == "firing"]
        assert firings(tmp_path) == firings(straight)

    def test_status_is_recorded(self, tmp_path: Path) -> None:
        """run.json says finished, with the clock, after a run."""
        _trainer(tmp_path).fit()
        status = RunDirectory(tmp_path).status()
        assert status is not None
        assert (status["status"], status["step"], status["epoch"]) == ("finished", 6, 2)


def test_a_run_that_logs_nothing_leaves_an_empty_log(tmp_path: Path) -> None:
    """A run cut by max_steps before any firing or scalar still leaves events.jsonl
    (empty), created when it starts: readers find the file of every run."""
    model, opt = tiny_model()
    seen: list[bool] = []

    class Look(Noop):
        def _before_train(self) -> None:
            seen.append((tmp_path / "events.jsonl").is_file())

    Trainer(model, opt, UnevenData([3] * 4), mse,
            schedule=Schedule({"late": every("5 steps"), "look": every("9 epochs")}),
            bindings={"late": Noop(), "look": Look()}, max_steps=2, run_dir=tmp_path,
            handle_signals=False).fit()
    assert seen == [True]
    assert (tmp_path / "events.jsonl").read_bytes() == b""


class TestLock:
    """Two runs never write one directory at once."""

    def test_a_second_process_is_refused_at_once(self, tmp_path: Path) -> None:
        """While this process holds the directory, another one's run fails immediately."""
        directory = RunDirectory(tmp_path)
        directory.acquire()
        code = textwrap.dedent(f"""
            from schedtrain.training.run_dir import RunDirectory, RunDirError
            try:
                RunDirectory({str(tmp_path)!r}).acquire()
            except RunDirError as exc:
                print(exc)
        """)
        try:
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 timeout=60, check=True).stdout
        finally:
            directory.release()
        assert "is in use by process" in out

    def test_leftover_temporary_files_are_removed(self, tmp_path: Path) -> None:
        """Temporary files an interrupted write left are deleted when a run opens the dir."""
        folder = tmp_path / "checkpoints"
        folder.mkdir(parents=True)
        junk = folder / ".step-00000003.pt.abc123.tmp"
        junk.write_bytes(b"x" * 100)
        RunDirectory(tmp_path).acquire()
        assert not junk.exists()


@given(st.sampled_from(["finished", "stopped", "failed", "running", "preempted"]),
       st.integers(0, 5), st.integers(0, 30),
       st.one_of(st.none(), st.integers(1, 6)), st.one_of(st.none(), st.integers(1, 30)))
def test_ended_is_what_a_resume_refuses(status: str, epoch: int, step: int,
                                        max_epochs: int | None, max_steps: int | None) -> None:
    """``RunDirectory.ended`` (which decides whether ``--resume auto`` says it resumed) is
    true exactly when resuming there is refused with ``RunEnded``."""
    import tempfile

    from schedtrain.training import RunEnded

    with tempfile.TemporaryDirectory() as folder:
        directory = RunDirectory(Path(folder))
        directory.record(status, step=step, epoch=epoch)
        said = directory.ended(max_epochs, max_steps)
        try:
            directory.open_for_run(fresh=False, overwrite=False, ends_at=(max_epochs, max_steps))
            refused = False
        except RunEnded:
            refused = True
        finally:
            directory.release()
        assert said == refused


class TestProgressInRunJson:
    """run.json says how far a run got, even after kill -9."""

    @pytest.mark.parametrize("mode", ["sync", "async"])
    def test_each_checkpoint_is_recorded(self, tmp_path: Path, mode: str) -> None:
        """While training, run.json holds the step of the newest committed checkpoint:
        with sync saves the one just written; with async ones it is recorded once the
        background write is committed, never before."""
        seen: list[tuple[int, int]] = []

        class Read(Noop):
            def _trigger(self) -> None:
                status = json.loads((tmp_path / "run.json").read_text())
                seen.append((self.now.step, status["step"]))

        model, opt = tiny_model()
        Trainer(model, opt, UnevenData([3, 3]), mse,
                schedule=Schedule({"save": every("2 steps"), "read": every("1 step")}),
                bindings={"save": ModelSaver(keep=None), "read": Read()}, max_epochs=2,
                run_dir=tmp_path, handle_signals=False, checkpoint_mode=mode).fit()
        # The newest checkpoint before each step's reading: saves land after the event.
        newest = [(s, 2 * ((s - 1) // 2)) for s in range(1, 7)]
        if mode == "sync":
            assert seen == newest
        else:
            assert all(got in (want, want - 2, 0) for (_, got), (_, want)
                       in zip(seen, newest, strict=True))
        assert json.loads((tmp_path / "run.json").read_text())["checkpoint"].endswith(
            "step-00000006.pt")

    def test_a_dead_run_is_described_as_such(self, tmp_path: Path) -> None:
        """A plain train in the directory of a killed run names its step and its gone
        process, not 'running at step 0'."""
        _trainer(tmp_path, epochs=2).fit()
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)
        status = json.loads((tmp_path / "run.json").read_text())
        status.update(status="running", pid=int(gone.stdout))
        (tmp_path / "run.json").write_text(json.dumps(status))
        with pytest.raises(RunDirError, match=r"killed or lost at step 6 \(its process"):
            _trainer(tmp_path, epochs=2).fit()


@pytest.mark.parametrize("file", ["specs/lm.toml", "x.toml", "<string>", "deep/a.b.toml"])
def test_one_default_run_directory(file: str) -> None:
    """``train``'s run directory without ``--run-dir`` or ``[run] run_dir`` is the one the
    spec's ``[run]`` gets, with a ``[run]`` table or without one."""
    callbacks = '[callbacks.a]\ntrigger = { every = "1 step" }\n'
    with_run = loads_spec('[run]\nmax_steps = 2\n' + callbacks, file)
    without = loads_spec(callbacks, file)
    assert with_run.run is not None and with_run.run.run_dir is not None
    assert run_dir_of(with_run, None) == run_dir_of(without, None) == Path(
        with_run.run.run_dir)
    assert run_dir_of(without, "elsewhere") == Path("elsewhere")
