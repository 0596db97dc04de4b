"""The Callback model and the built-ins, driven by the real loop on tiny data."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import pytest
import structlog
import structlog.testing
import torch
from torch.utils.data import DataLoader, TensorDataset
from training_helpers import Noop, UnevenData, tiny_model

from schedtrain import (
    FiringLog,
    Schedule,
    Scheduled,
    ScheduleError,
    StopTraining,
    at,
    every,
    on,
    plateau,
)
from schedtrain.callbacks import Callback
from schedtrain.callbacks.hyperparam import ScheduledHyperParamSetter
from schedtrain.callbacks.inference import InferenceRunner
from schedtrain.callbacks.progress import ProgressBar
from schedtrain.callbacks.saver import MaxSaver, MinSaver, ModelSaver
from schedtrain.callbacks.stopping import EarlyStopping, TerminateOnNaN
from schedtrain.monitors import MetricStore
from schedtrain.schedule import EnableCallbackIf, PeriodicTrigger
from schedtrain.training import Trainer

mse = torch.nn.functional.mse_loss


def _trainer(callbacks: list, epochs: int = 3, lengths: int = 5, **kw: object) -> Trainer:
    model, opt = tiny_model()
    return Trainer(model, opt, UnevenData([lengths] * epochs), mse, callbacks=callbacks,
                   max_epochs=epochs, **kw)  # type: ignore[arg-type]


def _classification(**kw: object) -> Trainer:
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = (x[:, 0] + x[:, 1] > 0).long()
    model = torch.nn.Linear(4, 2)
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.5),
                   DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True),
                   torch.nn.functional.cross_entropy,
                   val_data=DataLoader(TensorDataset(x, y), batch_size=32), **kw)  # type: ignore[arg-type]


class Recorder(Callback):
    """Records every hook call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def _setup(self) -> None:
        self.calls.append("setup")

    def _before_train(self) -> None:
        self.calls.append("before_train")

    def _after_train(self) -> None:
        self.calls.append("after_train")

    def _before_epoch(self) -> None:
        self.calls.append("before_epoch")

    def _after_epoch(self) -> None:
        self.calls.append("after_epoch")

    def _before_step(self, step: int, batch: object) -> None:
        self.calls.append(f"before_step{step}")

    def _after_step(self, step: int, outputs: object) -> None:
        self.calls.append(f"after_step{step}")

    def _trigger_step(self) -> None:
        self.calls.append("trigger_step")

    def _trigger_epoch(self) -> None:
        self.calls.append("trigger_epoch")

    def _trigger(self) -> None:
        self.calls.append(f"trigger@{self.now.step}")

    def _on_exception(self, exc: BaseException) -> None:
        self.calls.append(f"exception:{type(exc).__name__}")


class TestHooks:
    """Hooks run in the documented order; per-event hooks respect the gate."""

    def test_hook_order(self) -> None:
        """One epoch of two steps: the loop drawn in docs/callbacks.md."""
        rec = Recorder()
        _trainer([Scheduled(every("2 steps") | on("train_end"), rec)], epochs=1,
                 lengths=2).fit()
        assert rec.calls == [
            "setup", "before_train", "before_epoch",
            "before_step1", "after_step1", "trigger_step",
            "before_step2", "after_step2", "trigger_step", "trigger@2",
            "after_epoch", "trigger_epoch", "trigger@2", "after_train"]

    def test_enable_callback_if_gates_hooks(self) -> None:
        """EnableCallbackIf: per-event hooks and the trigger run only while the predicate holds.

        The recorder overrides ``_trigger_epoch``, so it is given its trigger explicitly:
        bare, its ``_trigger_epoch`` would replace the per-epoch ``_trigger`` (tensorpack)."""
        rec = Recorder()
        _trainer([EnableCallbackIf(Scheduled(every("1 epoch"), rec),
                                   lambda cb: cb.now.epoch >= 2)], epochs=3, lengths=1).fit()
        assert rec.calls.count("before_epoch") == 1  # before the third epoch only
        assert rec.calls.count("after_epoch") == 2  # the epoch counter already counts it
        assert [c for c in rec.calls if c.startswith("trigger@")] == ["trigger@2", "trigger@3"]

    def test_periodic_trigger(self) -> None:
        """PeriodicTrigger(cb, every_k_steps=2) fires at steps 2, 4, 6..."""
        rec = Recorder()
        t = _trainer([PeriodicTrigger(rec, every_k_steps=2)], epochs=1, lengths=6)
        t.fit()
        assert FiringLog(t.firings).steps("Recorder") == [2, 4, 6]

    def test_a_class_overriding_trigger_runs_its_override(self) -> None:
        """tensorpack's public ``trigger()`` may be overridden: a firing calls the override
        (which decides whether ``_trigger`` runs), never ``_trigger`` behind its back."""

        class Wrapped(Recorder):
            def trigger(self) -> None:
                self.calls.append(f"wrapped@{self.now.step}")
                if self.now.step != 2:
                    super().trigger()

        rec, plain = Wrapped(), Recorder()
        _trainer([Scheduled(every("2 steps"), rec), Scheduled(every("2 steps"), plain)],
                 epochs=1, lengths=6).fit()
        fired = [c for c in rec.calls if c.startswith(("wrapped@", "trigger@"))]
        assert fired == ["wrapped@2", "wrapped@4", "trigger@4", "wrapped@6", "trigger@6"]
        assert [c for c in plain.calls if c.startswith("trigger@")] == [
            "trigger@2", "trigger@4", "trigger@6"]

    def test_function_callbacks_and_custom_events(self) -> None:
        """A plain function is a callback; fire() runs a declared custom event's callbacks."""
        seen: list[int] = []
        schedule = Schedule({"kick": at("3 steps"), "swa": on("swa_start")},
                            events=("swa_start",))
        t = _trainer([], epochs=1, lengths=5, schedule=schedule,
                     bindings={"kick": lambda tr: tr.fire("swa_start"),
                               "swa": lambda tr: seen.append(tr.clock.step)})
        t.fit()
        assert seen == [3]
        with pytest.raises(ValueError, match="not declared"):
            t.fire("nope")


class TestStopAndFailure:
    """StopTraining ends cleanly; an exception runs _on_exception and writes no checkpoint."""

    def test_stop_training_still_runs_train_end(self) -> None:
        """Raising StopTraining ends training; train_end callbacks and after_train still run."""
        rec = Recorder()
        t = _trainer([Scheduled(at("4 steps"), lambda tr: (_ for _ in ()).throw(
            StopTraining())), Scheduled(on("train_end"), rec)], epochs=3)
        t.fit()
        assert t.stopped and t.clock.step == 4
        assert rec.calls[-2:] == ["trigger@4", "after_train"]

    def test_exception_runs_on_exception_and_leaves_no_checkpoint(self, tmp_path: Path) -> None:
        """A crash after a save request in the same event: no checkpoint, no temporary file."""
        rec = Recorder()

        def boom(_tr: Trainer) -> None:
            raise RuntimeError("boom")

        t = _trainer([Scheduled(at("3 steps"), ModelSaver()), Scheduled(at("3 steps"), boom),
                      Scheduled(on("train_end"), rec)], run_dir=tmp_path)
        with pytest.raises(RuntimeError, match="boom"):
            t.fit()
        assert "exception:RuntimeError" in rec.calls and rec.calls[-1] == "after_train"
        assert "trigger@3" not in rec.calls  # train_end does not fire on failure
        assert list((tmp_path / "checkpoints").glob("*")) == []

    def test_terminate_on_nan(self) -> None:
        """A NaN loss stops training at the next check."""
        model, opt = tiny_model()
        x = torch.randn(10, 3)
        x[6:] = math.nan
        data = [(x[i:i + 1], x[i:i + 1].sum(1, keepdim=True)) for i in range(10)]
        nan = TerminateOnNaN()
        t = Trainer(model, opt, data, mse, callbacks=[Scheduled(every("2 steps"), nan)],
                    max_epochs=3)
        t.fit()
        assert t.stopped and nan.triggered_at == 8

    def test_terminate_on_nan_default_trigger(self) -> None:
        """TerminateOnNaN reads its note every 100 steps, after evaluations and at the end
        by default (reading it syncs; the steps between are noted on the device)."""
        assert TerminateOnNaN.default_trigger == (every("100 steps") | on("eval_end")
                                                  | on("train_end"))


class TestBuiltins:
    """InferenceRunner, savers, hyper-parameter schedules, early stopping, progress bar."""

    def test_inference_runner_metrics(self) -> None:
        """val/loss, val/accuracy and val/error land in the store; accuracy + error == 1."""
        t = _classification(callbacks=[InferenceRunner()], max_epochs=3)
        t.fit()
        acc = t.metrics.history("val/accuracy")
        err = t.metrics.history("val/error")
        assert len(acc) == 3 and acc[-1][1] > 0.8
        assert acc[-1][1] + err[-1][1] == pytest.approx(1.0)

    def test_savers_keep_last_and_best(self, tmp_path: Path) -> None:
        """ModelSaver keeps the last N; MinSaver/MaxSaver write the best; no temp files."""
        t = _classification(callbacks=[InferenceRunner(), ModelSaver(keep=2), MinSaver(),
                                       MaxSaver()], max_epochs=4, run_dir=tmp_path)
        t.fit()
        kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
        assert kept == ["step-00000024.pt", "step-00000032.pt"]
        assert sorted(p.name for p in (tmp_path / "best").iterdir()) == [
            "max-val-accuracy.pt", "min-val-loss.pt"]

    def test_ordering_error_names_both(self) -> None:
        """A saver needing val/loss declared before the runner producing it is refused."""
        with pytest.raises(ScheduleError, match=r"'MinSaver'.*val/loss.*'InferenceRunner'"):
            _classification(callbacks=[MinSaver(), InferenceRunner()], max_epochs=1)

    def test_ordering_error_for_metric_triggers(self) -> None:
        """A trigger reading a metric produced by a later callback is refused as well."""
        with pytest.raises(ScheduleError, match="its trigger reads metric 'val/loss'"):
            _classification(callbacks=[Scheduled(plateau("val/loss", 2), EarlyStopping()),
                                       InferenceRunner()], max_epochs=1)

    @pytest.mark.parametrize(("interp", "step_based", "expected"), [
        (None, False, [0.1, 0.1, 0.01, 0.01]),
        ("linear", False, [0.1, 0.055, 0.01, 0.01]),
    ])
    def test_hyperparam_schedule(self, interp: str | None, step_based: bool,
                                 expected: list[float]) -> None:
        """Schedule [(0, 0.1), (2, 0.01)]: a value applies once that many epochs are done."""
        seen: list[float] = []
        setter = ScheduledHyperParamSetter("lr", [(0, 0.1), (2, 0.01)], interp=interp,
                                           step_based=step_based)

        class Spy(Callback):
            def _before_epoch(self) -> None:
                seen.append(self.optimizer.param_groups[0]["lr"])

        _trainer([setter, Spy()], epochs=4, lengths=2).fit()
        assert seen == pytest.approx(expected)

    def test_hyperparam_step_based(self) -> None:
        """Step-based piecewise schedules fire at the listed steps only."""
        setter = ScheduledHyperParamSetter("lr", [(3, 0.5), (6, 0.25)], step_based=True)
        t = _trainer([setter], epochs=2, lengths=5)
        t.fit()
        assert FiringLog(t.firings).steps("ScheduledHyperParamSetter") == [0, 3, 6]
        assert t.optimizer.param_groups[0]["lr"] == 0.25

    def test_hyperparam_bad_input(self) -> None:
        """Bad schedules are refused with the offending input named."""
        with pytest.raises(ValueError, match="must increase"):
            ScheduledHyperParamSetter("lr", [(2, 0.1), (1, 0.2)])
        with pytest.raises(ValueError, match=r"schedule\[0\]"):
            ScheduledHyperParamSetter("lr", [(1,)])
        with pytest.raises(ValueError, match="has no 'nope'"):
            _trainer([ScheduledHyperParamSetter("nope", [(0, 1.0)])]).fit()

    def test_early_stopping_with_plateau_trigger(self) -> None:
        """EarlyStopping fired by plateau(val/loss) stops once the loss stops improving."""
        t = _classification(callbacks=[
            InferenceRunner(),
            Scheduled(plateau("val/loss", 2, min_delta=10.0), EarlyStopping())],
            max_epochs=10)
        t.fit()
        assert t.stopped and t.clock.epoch == 3

    def test_early_stopping_own_patience(self) -> None:
        """With patience, EarlyStopping counts checks without a new best itself."""
        t = _classification(callbacks=[InferenceRunner(),
                                       EarlyStopping(patience=1, min_delta=10.0)],
                            max_epochs=10)
        t.fit()
        assert t.stopped and t.clock.epoch == 2

    def test_progress_bar_runs(self, capsys: pytest.CaptureFixture[str]) -> None:
        """Each epoch's bar counts that epoch's steps and ends showing its validation metrics."""
        _classification(callbacks=[InferenceRunner(), ProgressBar(tty_only=False)],
                        max_epochs=3).fit()
        err = capsys.readouterr().err
        first, _, rest = err.partition("epoch 2")
        assert "val/accuracy=" in first  # computed at epoch_end, shown before the bar closes
        third = rest.partition("epoch 3")[2]
        assert "4/8" in third  # the firing at step 20, 4 steps into the third epoch

    @staticmethod
    def _progress_lines(stream: io.StringIO) -> list[tuple[int, int, int, str]]:
        """``(epoch, step in epoch, step, values)`` of each plain progress line."""
        text = stream.getvalue()
        assert "\r" not in text and "\x1b" not in text  # no bar redraws, no escapes
        found = []
        for line in text.splitlines():
            m = re.fullmatch(r"epoch (\d+) step (\d+)/8 \(\d+%\)  \[step (\d+)\](.*)", line)
            assert m is not None, line
            found.append((int(m[1]), int(m[2]), int(m[3]), m[4]))
        return found

    def test_progress_lines_without_a_terminal(self) -> None:
        """On a stream that is not a terminal (a pipe, a log), plain lines replace the bar:
        one per firing, in order, each epoch ending with its validation metrics."""
        stream = io.StringIO()
        _classification(callbacks=[InferenceRunner(), ProgressBar(stream=stream)],
                        max_epochs=3).fit()
        lines = self._progress_lines(stream)
        steps = [step for _, _, step, _ in lines]
        assert steps == sorted(steps) and 20 in steps  # the 20-step firing is there
        for epoch in (1, 2, 3):
            last = [x for x in lines if x[0] == epoch][-1]
            assert last[1:3] == (8, 8 * epoch)
            assert "val/accuracy=" in last[3]
        for epoch, in_epoch, step, _ in lines:
            assert step == 8 * (epoch - 1) + in_epoch

    def test_progress_lines_on_a_dumb_terminal(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A terminal with ``TERM=dumb`` cannot redraw a bar: plain lines too; any other
        terminal gets the bar."""

        class Tty(io.StringIO):
            def isatty(self) -> bool:
                return True

        monkeypatch.setenv("TERM", "dumb")
        stream = Tty()
        _classification(callbacks=[ProgressBar(stream=stream)], max_epochs=2).fit()
        assert [x[:3] for x in self._progress_lines(stream)] == [(1, 8, 8), (2, 8, 16)]
        monkeypatch.setenv("TERM", "xterm-256color")
        stream = Tty()
        _classification(callbacks=[ProgressBar(stream=stream)], max_epochs=2).fit()
        assert "\r" in stream.getvalue()  # tqdm's redraws


class TestMonitors:
    """The metric store stays lazy; events.jsonl holds scalars and firings."""

    def test_store_lazy_until_read(self) -> None:
        """A tensor put stays a tensor until read; the count counts every value."""
        store = MetricStore()
        store.put("a", torch.tensor(1.5))
        store.put("a", torch.tensor(2.5))
        assert store.materialized() == {}
        got = store.latest("a")
        assert got is not None and (got.value, got.count) == (2.5, 2)
        assert store.history("a") == [(0, 1.5), (0, 2.5)]

    @pytest.mark.parametrize(("value", "error", "fragment"), [
        (torch.ones(3), ValueError, r"metric 'v' must be a scalar, got a tensor of shape \(3,\)"),
        ("high", TypeError, r"metric 'v' must be a number or a one-element tensor, got str"),
        ([1.0], TypeError, r"metric 'v' must be a number"),
        (None, TypeError, r"metric 'v' must be a number"),
    ])
    def test_store_refuses_non_scalars_at_put(self, value: object, error: type,
                                              fragment: str) -> None:
        """A vector, a string or anything not one number is refused when put, with the
        metric's name; the other metrics of the step are kept and flushed."""
        store = MetricStore()
        store.put("ok", 1.0)
        with pytest.raises(error, match=fragment):
            store.put("v", value)
        store.flush()
        assert store.history("ok") == [(0, 1.0)] and "v" not in store

    def test_events_jsonl(self, tmp_path: Path) -> None:
        """Every scalar and every firing is one line with step, epoch and a time."""
        _classification(callbacks=[InferenceRunner()], max_epochs=2, run_dir=tmp_path).fit()
        rows = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
        firings = [r for r in rows if r["kind"] == "firing"]
        scalars = [r for r in rows if r["kind"] == "scalar"]
        assert [(r["callback"], r["event"], r["epoch"]) for r in firings] == [
            ("InferenceRunner", "epoch_end", 1), ("InferenceRunner", "epoch_end", 2)]
        names = {r["name"] for r in scalars}
        assert names == {"train/loss", "val/loss", "val/accuracy", "val/error"}
        assert all({"value", "step", "epoch", "time"} <= set(r) for r in scalars)

    def test_firings_logged_through_structlog(self) -> None:
        """With structlog configured (the CLI does it), each firing is one structured event."""
        with structlog.testing.capture_logs() as logs:
            t = _trainer([PeriodicTrigger(Noop(), every_k_steps=4)], epochs=2)
            t.fit()
        events = [(e["callback"], e["trigger_event"], e["step"]) for e in logs
                  if e["event"] == "firing"]
        assert events == [(f.callback, f.event, f.step) for f in t.firings]
        assert [step for *_, step in events] == [4, 8]

    def test_nothing_logged_per_firing_when_unconfigured(
            self, capsys: pytest.CaptureFixture[str]) -> None:
        """Library code never configures structlog, and prints nothing per firing unless asked."""
        _trainer([PeriodicTrigger(Noop(), every_k_steps=1)], epochs=1).fit()
        assert not structlog.is_configured()
        out = capsys.readouterr()
        assert "firing" not in out.out + out.err

    def test_tensorboard_writer(self, tmp_path: Path) -> None:
        """The TensorBoard writer produces an event file."""
        pytest.importorskip("tensorboard")
        from schedtrain.monitors import TensorBoardWriter

        _classification(callbacks=[InferenceRunner()], max_epochs=1,
                        sinks=[TensorBoardWriter(tmp_path / "tb")]).fit()
        assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


class TestTrainerInput:
    """Bad trainer arguments are refused with the argument named."""

    @pytest.mark.parametrize(("kw", "match"), [
        ({"max_epochs": None}, "max_epochs"),
        ({"grad_accum": 0}, "grad_accum"),
        ({"precision": "fp8"}, "precision"),
        ({"device": "gpu"}, "device"),
        ({"grad_clip": -1.0}, "grad_clip"),
    ])
    def test_bad_arguments(self, kw: dict, match: str) -> None:
        """Each bad argument names itself."""
        model, opt = tiny_model()
        args = {"max_epochs": 1, **kw}
        with pytest.raises(ValueError, match=match):
            Trainer(model, opt, [], mse, **args)

    def test_unbound_schedule_name(self) -> None:
        """A schedule entry without a callback is named in the error."""
        model, opt = tiny_model()
        with pytest.raises(ScheduleError, match=r"callbacks\.report"):
            Trainer(model, opt, [], mse, schedule=Schedule({"report": every("1 epoch")}),
                    max_epochs=1)

    def test_noop_base(self) -> None:
        """A bare Callback runs by its default trigger (every epoch)."""
        t = _trainer([Noop()], epochs=2, lengths=1)
        t.fit()
        assert FiringLog(t.firings).epochs("Noop") == [1, 2]

    def test_fp16_and_bf16_and_clipping(self) -> None:
        """AMP precisions and gradient clipping train without errors on this device."""
        for precision in ("bf16", "fp16"):
            t = _trainer([], epochs=1, lengths=3, precision=precision, grad_clip=1.0)
            t.fit()
            assert t.clock.step == 3
