"""Background checkpoint saves: the same files as synchronous ones, at most one in
flight, every way out of the loop waits for it, a failed write fails the run."""

from __future__ import annotations

import itertools
import json
import os
import signal
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from jobs import forked
from jobs.trials import compare, env, train, write_spec
from training_helpers import UnevenData

from schedtrain import Schedule, every
from schedtrain.callbacks import Callback, ModelSaver
from schedtrain.checkpoints import CheckpointError, newest_valid, read_checkpoint
from schedtrain.checkpoints import background as background_module
from schedtrain.checkpoints import mount as mount_module
from schedtrain.checkpoints.staging import snapshot
from schedtrain.clock import LoopClock
from schedtrain.errors import Preempted
from schedtrain.monitors import store as store_module
from schedtrain.training import Trainer
from schedtrain.training import dispatch as dispatch_module

mse = torch.nn.functional.mse_loss


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _trainer(run_dir: Path, *, mode: str = "async", steps: int = 12, save: str = "3 steps",
             extra: dict[str, tuple[str, Callback]] | None = None, keep: int | None = 2,
             **kw: Any) -> Trainer:
    model, opt = _model()
    ticks = itertools.count(0, 1_000_000)  # a fake clock: the files hold no real time
    entries = {"save": every(save), **{n: every(t) for n, (t, _) in (extra or {}).items()}}
    bindings = {"save": ModelSaver(keep=keep), **{n: cb for n, (_, cb) in (extra or {}).items()}}
    return Trainer(model, opt, UnevenData([steps]), mse, schedule=Schedule(entries),
                   bindings=bindings, max_epochs=1, run_dir=run_dir, checkpoint_mode=mode,
                   clock=LoopClock(time_source=lambda: next(ticks)), **kw)


@pytest.fixture
def slow_writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Background writes that wait for ``gate`` (set by the test) and record where they ran."""
    seen: dict[str, Any] = {"gate": threading.Event(), "threads": [], "done": []}
    real = mount_module.write_checkpoint

    def slow(state: dict[str, Any], path: Path) -> Path:
        seen["threads"].append(threading.current_thread().name)
        seen["gate"].wait(timeout=30)
        out = real(state, path)
        seen["done"].append(Path(path).name)
        return out

    monkeypatch.setattr(mount_module, "write_checkpoint", slow)
    yield seen
    seen["gate"].set()


class _Call(Callback):
    """Runs ``fn(trainer)`` when it fires."""

    def __init__(self, fn: Callable[[Any], None]) -> None:
        self.fn = fn

    def _trigger(self) -> None:
        self.fn(self.trainer)


class _Poison(Callback):
    """Turns the model's weights NaN once the step ``at`` is over."""

    def __init__(self, at: int) -> None:
        self.at = at

    def _trigger(self) -> None:
        if self.trainer.clock.step == self.at:
            with torch.no_grad():
                for p in self.trainer.model.parameters():
                    p.fill_(float("nan"))


def _events(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("time", "seconds", "duration")} for r in rows]


class TestSameAsSync:
    """The same run in both modes writes the same bytes and resumes alike."""

    def test_files_weights_and_log_are_identical(self, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
        """Every checkpoint file is byte-identical; final weights and events.jsonl match."""
        # Metric records carry the wall-clock time: fixed, so two runs can be compared.
        monkeypatch.setattr(store_module, "time", types.SimpleNamespace(time=lambda: 1.0))
        # and firing lines their start and duration (a measurement)
        monkeypatch.setattr(dispatch_module, "time",
                            types.SimpleNamespace(time=lambda: 1.0, monotonic=lambda: 0.0))
        runs = {}
        for mode in ("sync", "async"):
            t = _trainer(tmp_path / mode, mode=mode, keep=None)
            t.fit()
            runs[mode] = t
        folder = {m: tmp_path / m / "checkpoints" for m in runs}
        names = sorted(p.name for p in folder["sync"].iterdir())
        assert names == sorted(p.name for p in folder["async"].iterdir())
        assert len(names) == 4
        for name in names:
            assert (folder["sync"] / name).read_bytes() == (folder["async"] / name).read_bytes()
        for a, b in zip(runs["sync"].model.parameters(), runs["async"].model.parameters(),
                        strict=True):
            assert torch.equal(a, b)
        assert _events(tmp_path / "sync") == _events(tmp_path / "async")

    @settings(max_examples=8, deadline=None)
    @given(st.integers(1, 8), st.sampled_from([None, 1, 2]), st.sampled_from(["1 step",
                                                                              "2 steps"]))
    @example(1, 1, "2 steps")  # the step-6 save lands after step 8's is recorded
    def test_non_finite_weights_get_the_same_names_and_bytes(
            self, tmp_path_factory: pytest.TempPathFactory, at: int, keep: int | None,
            save: str) -> None:
        """Weights turned NaN after step ``at``: in either mode the same files, named
        ``-nonfinite`` from there on, byte for byte; the last finite one is kept."""
        root = tmp_path_factory.mktemp("nan")
        folders = {}
        with pytest.MonkeyPatch.context() as patch:  # metric records hold no real time,
            patch.setattr(store_module, "time", types.SimpleNamespace(time=lambda: 1.0))
            # nor firing lines (their duration is a measurement; the log's length is in
            # every checkpoint)
            patch.setattr(dispatch_module, "time",
                          types.SimpleNamespace(time=lambda: 1.0, monotonic=lambda: 0.0))
            for mode in ("sync", "async"):
                t = _trainer(root / mode, mode=mode, steps=8, save=save, keep=keep,
                             extra={"poison": ("1 step", _Poison(at))})
                t.fit()
                folders[mode] = root / mode / "checkpoints"
        names = sorted(p.name for p in folders["sync"].iterdir())
        assert names == sorted(p.name for p in folders["async"].iterdir())
        assert any("nonfinite" in n for n in names)
        for name in names:
            assert (folders["sync"] / name).read_bytes() == \
                (folders["async"] / name).read_bytes(), name
            state = read_checkpoint(folders["async"] / name)
            assert state["finite"] == ("nonfinite" not in name)
        every_ = 1 if save == "1 step" else 2
        finite = [s for s in range(every_, 9, every_) if s < at]  # the save of step
        good = newest_valid(folders["async"])  # `at` comes after the poison: not finite
        assert (good.name if good else None) == (
            f"step-{finite[-1]:08d}.pt" if finite else None)

    def test_the_finiteness_check_runs_in_the_writing_thread(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """The loop blocks only for the host copy: the weights are checked by the thread
        that writes them, and the name it chose reaches ``on_saved``."""
        seen: list[str] = []
        real = background_module.is_finite

        def spy(*args: Any) -> bool:
            seen.append(threading.current_thread().name)
            return real(*args)

        monkeypatch.setattr(background_module, "is_finite", spy)
        t = _trainer(tmp_path, steps=3, save="3 steps")
        t.fit()
        with torch.no_grad():
            for p in t.model.parameters():
                p.fill_(float("nan"))
        written: list[Path] = []
        t.checkpoints.write(tmp_path / "manual.pt", "manual", written.append)
        t.checkpoints.wait()
        assert seen and set(seen) == {"schedtrain-checkpoint"}
        assert written == [tmp_path / "manual-nonfinite.pt"]
        assert not (tmp_path / "manual.pt").exists()

    def test_resume_from_an_async_checkpoint_is_exact(self, tmp_path: Path) -> None:
        """A run resumed from a mid-run async checkpoint ends as the uninterrupted one."""
        whole = _trainer(tmp_path / "whole", keep=None)
        whole.fit()
        cut = _trainer(tmp_path / "cut", keep=None)
        cut.resume(tmp_path / "whole" / "checkpoints" / "step-00000006.pt")
        cut.fit()
        for a, b in zip(whole.model.parameters(), cut.model.parameters(), strict=True):
            assert torch.equal(a, b)


class TestSnapshot:
    """The snapshot is a host copy the training may change at once."""

    def test_live_state_changed_during_the_write_is_not_in_the_file(
            self, tmp_path: Path, slow_writes: dict[str, Any]) -> None:
        """Weights changed while the write waits leave the file with the saved ones."""
        t = _trainer(tmp_path, steps=3, save="3 steps")
        saved = {k: v.clone() for k, v in t.model.state_dict().items()}
        path = tmp_path / "manual.pt"
        t.checkpoints.write(path, "manual")
        with torch.no_grad():
            for p in t.model.parameters():
                p.add_(1.0)
        slow_writes["gate"].set()
        t.checkpoints.wait()
        state = read_checkpoint(path)
        assert slow_writes["threads"] == ["schedtrain-checkpoint"]
        for k, v in saved.items():
            assert torch.equal(state["model"][k], v)

    @settings(max_examples=50, deadline=None)
    @given(st.lists(st.integers(1, 6), min_size=1, max_size=5), st.data())
    def test_copies_share_storage_as_the_originals(self, sizes: list[int],
                                                   data: st.DataObject) -> None:
        """Equal values, new storage, and views of one tensor stay views of one copy."""
        base = [torch.arange(float(n)) for n in sizes]
        views = [data.draw(st.sampled_from(base))[: data.draw(st.integers(0, 1))]
                 for _ in sizes]
        tree = {"a": base, "b": (views, {"n": 3, "s": "x"})}
        copy = snapshot(tree)
        assert copy["b"][1] == {"n": 3, "s": "x"}
        for old, new in zip(base + views, copy["a"] + copy["b"][0], strict=True):
            assert torch.equal(old, new)
            assert new.untyped_storage().data_ptr() != old.untyped_storage().data_ptr()
        ptrs = {t.untyped_storage().data_ptr() for t in copy["a"] + copy["b"][0]}
        assert len(ptrs) == len({t.untyped_storage().data_ptr() for t in base})


    @pytest.mark.gpu
    def test_device_tensors_are_copied_to_pinned_host_memory(self) -> None:
        """A GPU state's snapshot is on the host, pinned, equal, and stays as it was."""
        live = {"w": torch.arange(6.0, device="cuda"), "b": torch.ones(2, device="cuda")}
        copy = snapshot(live)
        live["w"].add_(1.0)
        torch.cuda.synchronize()
        assert copy["w"].device.type == "cpu" and copy["w"].is_pinned()
        assert torch.equal(copy["w"], torch.arange(6.0))
        assert torch.equal(copy["b"], torch.ones(2))


class TestEveryWayOutWaits:
    """train_end, a preemption, a stop and an exception finish the save in flight."""

    def test_train_end(self, tmp_path: Path, slow_writes: dict[str, Any]) -> None:
        """fit returns only once the last checkpoint is committed."""
        t = _trainer(tmp_path, steps=6, save="3 steps",
                     extra={"open": ("6 steps", _Call(lambda _t: slow_writes["gate"].set()))})
        t.fit()
        assert slow_writes["done"] == ["step-00000003.pt", "step-00000006.pt"]
        assert read_checkpoint(tmp_path / "checkpoints" / "step-00000006.pt")["step"] == 6
        assert json.loads((tmp_path / "run.json").read_text())["status"] == "finished"

    def test_preemption(self, tmp_path: Path, slow_writes: dict[str, Any]) -> None:
        """SIGTERM: the save in flight and the preemption checkpoint are both committed."""
        def signal_then_open(_t: Any) -> None:
            os.kill(os.getpid(), signal.SIGTERM)
            slow_writes["gate"].set()

        t = _trainer(tmp_path, steps=12, save="3 steps",
                     extra={"term": ("4 steps", _Call(signal_then_open))})
        with pytest.raises(Preempted):
            t.fit()
        assert slow_writes["done"] == ["step-00000003.pt", "step-00000004.pt"]
        state = read_checkpoint(tmp_path / "checkpoints" / "step-00000004.pt")
        assert state["phase"] == "preempt"

    def test_stop(self, tmp_path: Path, slow_writes: dict[str, Any]) -> None:
        """A stop's checkpoint and the one in flight are committed before fit returns."""
        def stop(tr: Any) -> None:
            slow_writes["gate"].set()
            tr.request_stop("enough")

        t = _trainer(tmp_path, steps=12, save="3 steps",
                     extra={"stop": ("4 steps", _Call(stop))})
        t.fit()
        assert "step-00000003.pt" in slow_writes["done"]
        assert t.outcome == "stopped"
        assert not list(tmp_path.rglob("*.tmp"))

    def test_exception(self, tmp_path: Path, slow_writes: dict[str, Any]) -> None:
        """A callback's exception: the save in flight is committed, then the error raised."""
        def boom(_t: Any) -> None:
            slow_writes["gate"].set()
            raise RuntimeError("boom")

        t = _trainer(tmp_path, steps=12, save="3 steps",
                     extra={"boom": ("4 steps", _Call(boom))})
        with pytest.raises(RuntimeError, match="boom"):
            t.fit()
        assert slow_writes["done"] == ["step-00000003.pt"]
        assert read_checkpoint(tmp_path / "checkpoints" / "step-00000003.pt")["step"] == 3
        assert json.loads((tmp_path / "run.json").read_text())["status"] == "failed"


class TestBusy:
    """At most one save in flight: a new one waits, or is skipped by the declared rule."""

    def test_skip_drops_saves_asked_for_while_one_is_in_flight(
            self, tmp_path: Path, slow_writes: dict[str, Any]) -> None:
        """Step 2 is skipped while step 1's write waits; step 3, once it is over, is
        written."""
        def release(tr: Any) -> None:
            slow_writes["gate"].set()
            tr.checkpoints.wait()

        t = _trainer(tmp_path, steps=3, save="1 step", keep=None, checkpoint_busy="skip",
                     extra={"release": ("3 steps", _Call(release))})
        t.fit()
        names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
        assert names == ["step-00000001.pt", "step-00000003.pt"]

    def test_wait_writes_every_save(self, tmp_path: Path,
                                    slow_writes: dict[str, Any]) -> None:
        """With the default rule every save is written, in order."""
        t = _trainer(tmp_path, steps=4, save="1 step", keep=None,
                     extra={"release": ("2 steps", _Call(lambda _t: slow_writes["gate"].set()))})
        t.fit()
        assert slow_writes["done"] == [f"step-{i:08d}.pt" for i in (1, 2, 3, 4)]


class TestFailure:
    """A background write that fails fails the run, naming the checkpoint."""

    def test_failed_write_fails_the_run(self, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
        """The error names the file and its cause; run.json says failed; no temp file."""
        def full(_state: dict[str, Any], path: Path) -> Path:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(mount_module, "write_checkpoint", full)
        t = _trainer(tmp_path, steps=12, save="3 steps")
        with pytest.raises(CheckpointError, match=r"step-00000003\.pt.*No space left"):
            t.fit()
        assert json.loads((tmp_path / "run.json").read_text())["status"] == "failed"
        assert t.clock.step < 12


class TestOptions:
    """Bad modes and rules are refused with the argument's name."""

    @pytest.mark.parametrize(("key", "value"), [("checkpoint_mode", "later"),
                                                ("checkpoint_busy", "drop")])
    def test_refused(self, tmp_path: Path, key: str, value: str) -> None:
        """One line naming the argument and what it may be."""
        model, opt = _model()
        with pytest.raises(ValueError, match=f"`{key}`: expected '.*' or '.*', found"):
            Trainer(model, opt, UnevenData([2]), mse, max_epochs=1,
                    **{key: value})  # type: ignore[arg-type]


@pytest.mark.slow
def test_kill_9_during_a_background_write_then_resume_is_exact(tmp_path: Path) -> None:
    """A process killed while its third checkpoint is half written in the background: the
    checkpoints before it are valid, and --resume auto ends as the uninterrupted run. The
    runs are children forked from the test process (``jobs.forked``: torch imported once)."""
    spec = write_spec(tmp_path, 3)
    spec.write_text(spec.read_text().replace("jobs.crash:make_task",
                                             "jobs.stalled_write:make_task"))
    reference = tmp_path / "reference"
    assert train(spec, reference, resume=False, fork=True).returncode == 0
    run_dir, marker = tmp_path / "run", tmp_path / "stalled"
    proc = forked.schedtrain(["train", str(spec), "--run-dir", str(run_dir)], cwd=tmp_path,
                             env={**env(0), "STALL_WRITE": "3", "STALL_MARKER": str(marker)})
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, "the run ended before its third write"
            assert time.monotonic() < deadline, "no third write in 120 s"
            time.sleep(0.005)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL  # killed, not ended on its own
    thread, name = marker.read_text().split()
    assert thread == "schedtrain-checkpoint"  # it was a background write
    assert not (run_dir / "checkpoints" / name).exists()
    valid = newest_valid(run_dir / "checkpoints")
    assert valid is not None
    assert train(spec, run_dir, fork=True).returncode == 0
    assert compare(reference, run_dir) == []
