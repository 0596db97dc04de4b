"""tensorpack's ResNet list: HumanHyperParamSetter, SendStat, GPUUtilizationTracker,
InjectShell and MovingAverageSummary, driven by the real loop on tiny data."""

from __future__ import annotations

import io
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import structlog.testing
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import UnevenData, tiny_model

from schedtrain import SpecError, every
from schedtrain.callbacks import (
    Callback,
    DeviceStatsMonitor,
    GPUUtilizationTracker,
    HumanHyperParamSetter,
    InjectShell,
    MovingAverageSummary,
    SendStat,
)
from schedtrain.callbacks.human import read_value
from schedtrain.spec import loads_spec
from schedtrain.training import Trainer

mse = torch.nn.functional.mse_loss


def _trainer(callbacks: list, epochs: int = 2, steps: int = 4, **kw: Any) -> Trainer:
    model, opt = tiny_model()
    return Trainer(model, opt, UnevenData([steps] * epochs), mse, callbacks=callbacks,
                   max_epochs=epochs, **kw)


class AtStep(Callback):
    """Calls ``action(step)`` after every step (a person acting while training runs)."""

    def __init__(self, action: Any) -> None:
        self.action = action

    def _after_step(self, step: int, outputs: Any) -> None:
        self.action(step)


class LrLog(Callback):
    """Records the learning rate after every step."""

    def __init__(self) -> None:
        self.lrs: list[float] = []

    def _after_step(self, step: int, outputs: Any) -> None:
        self.lrs.append(self.optimizer.param_groups[0]["lr"])


class TestHumanHyperParamSetter:
    """The value in the run directory's file reaches the optimizer at each firing."""

    @settings(max_examples=50, deadline=None)
    @given(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(["=", ":"]),
           st.lists(st.sampled_from(["# note", "", "momentum = 0.9", "lrx = 3"]), max_size=3))
    def test_reads_its_line_among_others(self, value: float, sep: str, noise: list[str]) -> None:
        """``lr = v`` / ``lr: v`` gives v, whatever comments and other params surround it."""
        text = "\n".join([*noise, f"lr {sep} {value!r}  # set by hand", *noise])
        assert read_value(text, "lr") == value
        assert read_value("\n".join(noise), "lr") is None

    def test_change_mid_run_applies_at_next_firing(self, tmp_path: Path) -> None:
        """Writing the file after step 3 sets the lr from the next firing (every 2 steps)."""
        log = LrLog()
        writer = AtStep(lambda s: s == 3 and (tmp_path / "run" / "hyper.txt").write_text(
            "lr = 0.5\n"))
        setter = HumanHyperParamSetter()
        setter.default_trigger = every("2 steps")  # type: ignore[misc]
        t = _trainer([writer, setter, log], run_dir=tmp_path / "run")
        t.fit()
        assert log.lrs == [0.01] * 4 + [0.5] * 4  # the firing at step 4 runs after step 4's log
        assert setter.value == 0.5

    def test_bad_or_missing_file_is_logged_once_and_not_fatal(self, tmp_path: Path) -> None:
        """A missing file, then a bad value: each logged once over many firings; lr kept."""
        setter = HumanHyperParamSetter(file="h.txt")
        setter.default_trigger = every("1 step")  # type: ignore[misc]
        writer = AtStep(lambda s: s == 4 and (tmp_path / "h.txt").write_text("lr = fast\n"))
        with structlog.testing.capture_logs() as logs:
            t = _trainer([writer, setter], run_dir=tmp_path)
            t.fit()
        said = [e["event"] for e in logs if e["event"].startswith("human_hyperparam")]
        assert said == ["human_hyperparam_no_file", "human_hyperparam_bad_file"]
        assert "line 1: lr = 'fast' is not a number" in next(
            e["message"] for e in logs if e["event"] == "human_hyperparam_bad_file")
        assert t.optimizer.param_groups[0]["lr"] == 0.01

    def test_state_resumes_last_value(self, tmp_path: Path) -> None:
        """The last applied value is saved and restored with the checkpoint."""
        (tmp_path / "hyper.txt").write_text("lr = 0.2\n")
        setter = HumanHyperParamSetter()
        _trainer([setter], run_dir=tmp_path).fit()
        again = HumanHyperParamSetter()
        again.load_state_dict(setter.state_dict())
        assert again.value == 0.2

    def test_unknown_param_is_refused_at_start(self) -> None:
        """A param the optimizer's groups lack is refused before training."""
        with pytest.raises(ValueError, match="has no 'betas'"):
            _trainer([HumanHyperParamSetter("betas")]).fit()


def _command(out: Path, *args: str) -> list[str]:
    """A harmless command: writes its arguments as JSON to ``out``."""
    return [sys.executable, "-c",
            "import json, sys; open(sys.argv[1], 'w').write(json.dumps(sys.argv[2:]))",
            str(out), *args]


class Put(Callback):
    """Puts a fixed metric when fired."""

    produces = ("val-error-top1",)

    def _trigger(self) -> None:
        self.metrics.put("val-error-top1", 0.125 + self.now.epoch)


class TestSendStat:
    """Runs an argument list (no shell) with metric values substituted; never fatal."""

    def test_values_substituted_without_shell(self, tmp_path: Path) -> None:
        """Placeholders become the newest values; shell syntax stays literal text."""
        out = tmp_path / "sent.json"
        send = SendStat(_command(out, "err={val-error-top1}", "at {epoch}/{step}", "; rm -rf x",
                                 "{run_dir}"), ["val-error-top1"])
        _trainer([Put(), send], run_dir=tmp_path / "run").fit()
        assert json.loads(out.read_text()) == ["err=2.125", "at 2/8", "; rm -rf x",
                                               str(tmp_path / "run")]

    @pytest.mark.parametrize(("command", "reason"), [
        (["python-that-does-not-exist-st"], "cannot run"),
        ([sys.executable, "-c", "raise SystemExit(3)"], "exited with 3"),
        ([sys.executable, "-c", "import time; time.sleep(30)"], "over its timeout"),
    ])
    def test_failures_are_logged_not_fatal(self, command: list[str], reason: str) -> None:
        """A missing program, a failure or a timeout: a warning, and training finishes."""
        with structlog.testing.capture_logs() as logs:
            t = _trainer([SendStat(command, timeout=0.5)], epochs=1)
            t.fit()
        failed = [e for e in logs if e["event"] == "send_stat_failed"]
        assert len(failed) == 1 and reason in failed[0]["reason"]
        assert t.clock.step == 4

    def test_metric_without_value_skips(self, tmp_path: Path) -> None:
        """Before its metric has a value, a firing is skipped with a log line."""
        out = tmp_path / "x"
        with structlog.testing.capture_logs() as logs:
            _trainer([SendStat(_command(out, "{m}"), ["m"])], epochs=1).fit()
        assert not out.exists()
        assert [e["event"] for e in logs if e["event"].startswith("send_stat")] == [
            "send_stat_skipped"]

    def test_chief_only(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """On a process other than the chief nothing runs."""
        monkeypatch.setattr(SendStat, "is_chief", property(lambda self: False))
        out = tmp_path / "x"
        _trainer([SendStat(_command(out, "{step}"))], epochs=1).fit()
        assert not out.exists()

    def test_refusals(self) -> None:
        """A shell string, an unknown placeholder and a bad timeout are refused."""
        with pytest.raises(ValueError, match="non-empty list of strings"):
            SendStat("curl x")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"`command\[1\]` names \{val\}"):
            SendStat(["echo", "{val}"], ["loss"])
        with pytest.raises(ValueError, match="`timeout` must be"):
            SendStat(["echo"], timeout=0)

    def test_toml_placeholders_checked(self) -> None:
        """``schedtrain check`` refuses a placeholder naming no listed metric, with its path."""
        with pytest.raises(SpecError) as info:
            loads_spec('[callbacks.s]\ntype = "SendStat"\ncommand = ["echo", "{val-err}"]\n'
                       'metrics = ["val/loss"]\ntrigger = { every = "1 epoch" }\n')
        assert [(p.path, p.message) for p in info.value.problems] == [
            ("callbacks.s.command[1]", "{val-err} is not in `metrics` ['val/loss'] "
                                       "(nor step, epoch, run_dir)")]


class TestGPUUtilizationTracker:
    """Host figures always; GPU figures where there is a GPU."""

    def test_without_gpu_says_so_once_and_records_host(self, monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
        """No GPU: one log line, and host CPU/RAM at each firing."""
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        tracker = GPUUtilizationTracker()
        tracker.default_trigger = every("2 steps")  # type: ignore[misc]
        with structlog.testing.capture_logs() as logs:
            t = _trainer([tracker])
            t.fit()
        assert next(e["message"] for e in logs if e["event"] == "device_stats").startswith(
            "no GPU")
        assert tracker.produces == ("host/cpu_percent", "host/ram_used_gb", "host/ram_percent")
        for name in tracker.produces:
            values = [v for _, v in t.metrics.history(name)]
            assert len(values) == 4
            assert all(v >= 0 for v in values)
        assert all(0 <= v <= 100 for _, v in t.metrics.history("host/ram_percent"))

    def test_psutil_used_when_installed(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """With psutil the figures are the whole host's, as psutil reports them."""
        vm = types.SimpleNamespace(total=8 * 1024**3, available=6 * 1024**3, percent=25.0)
        fake = types.SimpleNamespace(cpu_percent=lambda interval=None: 37.5,
                                     virtual_memory=lambda: vm)
        monkeypatch.setitem(sys.modules, "psutil", fake)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monitor = DeviceStatsMonitor()
        monitor.default_trigger = every("1 epoch")  # type: ignore[misc]
        t = _trainer([monitor], epochs=1)
        t.fit()
        assert t.metrics.value("host/cpu_percent") == 37.5
        assert t.metrics.value("host/ram_used_gb") == 2.0
        assert t.metrics.value("host/ram_percent") == 25.0

    def test_nvml_and_allocator_figures(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Each GPU's NVML handle is found by its PCI bus id; its figures are put in GB."""
        gb = 1024**3
        asked: list[str] = []
        nvml = types.SimpleNamespace(
            nvmlInit=lambda: None, nvmlShutdown=lambda: None,
            nvmlDeviceGetHandleByPciBusId=lambda bus: asked.append(bus) or bus,
            nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=42),
            nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=3 * gb, total=80 * gb))
        monkeypatch.setitem(sys.modules, "pynvml", nvml)
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "device_count", lambda: 2)
        monkeypatch.setattr(cuda, "get_device_properties", lambda i: types.SimpleNamespace(
            pci_bus_id=0x3B + i, pci_domain_id=0, pci_device_id=0))
        monkeypatch.setattr(cuda, "memory_allocated", lambda i: (i + 1) * gb)
        monkeypatch.setattr(cuda, "memory_reserved", lambda i: 2 * gb)
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda i: 4 * gb)
        tracker = GPUUtilizationTracker()
        tracker.default_trigger = every("1 epoch")  # type: ignore[misc]
        t = _trainer([tracker], epochs=1, device="cpu")
        t.fit()
        assert asked == ["00000000:3b:00.0", "00000000:3c:00.0"]
        got = {n: t.metrics.value(n) for n in tracker.produces if n.startswith("device/")}
        assert got == {f"device/gpu{i}/{k}": v for i in (0, 1) for k, v in [
            ("util", 42.0), ("mem_used_gb", 3.0), ("mem_total_gb", 80.0),
            ("allocated_gb", i + 1.0), ("reserved_gb", 2.0), ("max_allocated_gb", 4.0)]}

    @pytest.mark.gpu
    def test_gpu_metrics_recorded(self) -> None:
        """On a GPU machine each device's memory figures (and NVML's when present) appear."""
        tracker = GPUUtilizationTracker()
        tracker.default_trigger = every("2 steps")  # type: ignore[misc]
        t = _trainer([tracker], device="cuda")
        t.fit()
        assert t.metrics.value("device/gpu0/allocated_gb") > 0
        if "device/gpu0/util" in t.metrics:
            assert 0 <= t.metrics.value("device/gpu0/util") <= 100
            assert t.metrics.value("device/gpu0/mem_total_gb") > 0


class FakeStdin(io.StringIO):
    """A stdin that says whether it is a terminal."""

    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


class TestInjectShell:
    """Touching the file opens a shell at the next firing, on a terminal only."""

    def test_touch_opens_shell_with_loop_in_scope(self, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
        """The hook gets trainer, model, optimizer and metrics; the file is removed."""
        monkeypatch.setattr(sys, "stdin", FakeStdin(tty=True))
        opened: list[tuple[int, dict[str, Any]]] = []
        shell = InjectShell(hook=lambda ns, banner: opened.append((ns["trainer"].clock.step, ns)))
        shell.default_trigger = every("2 steps")  # type: ignore[misc]
        touch = AtStep(lambda s: s == 3 and (tmp_path / "shell").touch())
        t = _trainer([touch, shell], run_dir=tmp_path)
        t.fit()
        assert [step for step, _ in opened] == [4]
        ns = opened[0][1]
        assert ns["model"] is t.model and ns["optimizer"] is t.optimizer
        assert ns["metrics"] is t.metrics
        assert not (tmp_path / "shell").exists()

    def test_not_a_terminal_skips_and_logs_once(self, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
        """Without a terminal no shell opens; one log line; the file stays."""
        monkeypatch.setattr(sys, "stdin", FakeStdin(tty=False))
        (tmp_path / "shell").touch()
        opened: list[object] = []
        shell = InjectShell(hook=lambda ns, banner: opened.append(ns))
        shell.default_trigger = every("1 step")  # type: ignore[misc]
        with structlog.testing.capture_logs() as logs:
            _trainer([shell], run_dir=tmp_path).fit()
        assert opened == []
        assert [e["event"] for e in logs if "inject_shell" in e["event"]] == [
            "inject_shell_skipped"]
        assert (tmp_path / "shell").exists()

    def test_chief_only(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A process other than the chief never opens a shell nor removes the file."""
        monkeypatch.setattr(sys, "stdin", FakeStdin(tty=True))
        monkeypatch.setattr(InjectShell, "is_chief", property(lambda self: False))
        (tmp_path / "shell").touch()
        opened: list[object] = []
        shell = InjectShell(hook=lambda ns, banner: opened.append(ns))
        shell.default_trigger = every("1 step")  # type: ignore[misc]
        _trainer([shell], run_dir=tmp_path).fit()
        assert opened == []
        assert (tmp_path / "shell").exists()

    @pytest.mark.parametrize("shell", ["python", "ipython"])
    def test_default_shell_falls_back_to_python(self, shell: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
        """Without IPython (or asked for Python) the shell is ``code.interact`` on the
        namespace, saying why when IPython was asked for."""
        import code

        from schedtrain.callbacks.shell import open_shell

        monkeypatch.setitem(sys.modules, "IPython", None)
        monkeypatch.setitem(sys.modules, "IPython.terminal.embed", None)
        calls: list[tuple[str, dict[str, Any]]] = []
        monkeypatch.setattr(code, "interact",
                            lambda banner, local, exitmsg: calls.append((banner, local)))
        open_shell({"model": 1}, "paused", shell)
        assert [local for _, local in calls] == [{"model": 1}]
        assert ("IPython is not installed" in calls[0][0]) == (shell == "ipython")

    def test_bad_shell_refused(self) -> None:
        """Only 'ipython' and 'python' shells exist."""
        with pytest.raises(ValueError, match="'ipython' or 'python'"):
            InjectShell(shell="bash")


def _loss_run(run_dir: Path | None, decay: float, save_at: int | None = None) -> Trainer:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Dropout(0.3),
                                torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    callbacks: list[Any] = [MovingAverageSummary(decay=decay)]
    if save_at is not None:
        saver = _SaveAt(save_at)
        callbacks.append(saver)
    return Trainer(model, opt, UnevenData([5, 5, 5]), mse, callbacks=callbacks, max_epochs=3,
                   run_dir=run_dir)


class _SaveAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step
        self.default_trigger = every("1 step")  # type: ignore[misc]

    def _trigger(self) -> None:
        if self.now.step == self.step:
            self.trainer.save_checkpoint(self.trainer.run_dir / "ckpt.pt")  # type: ignore[operator]


class TestMovingAverageSummary:
    """``train/loss_ema`` follows the EMA rule and resumes bit for bit."""

    @settings(max_examples=10, deadline=None)
    @given(st.floats(0, 0.99))
    def test_ema_rule(self, decay: float) -> None:
        """Each step's average is decay * previous + (1 - decay) * that step's loss."""
        t = _loss_run(None, decay)
        t.fit()
        losses = [v for _, v in t.metrics.history("train/loss")]
        emas = [v for _, v in t.metrics.history("train/loss_ema")]
        assert len(emas) == len(losses) == 15
        expected = losses[0]
        for loss, ema in zip(losses, emas, strict=True):
            expected = loss if ema is emas[0] else decay * expected + (1 - decay) * loss
            assert ema == pytest.approx(expected, rel=1e-5)

    @pytest.mark.parametrize("save_at", [3, 5, 11])
    def test_resume_continues_exactly(self, tmp_path: Path, save_at: int) -> None:
        """A run resumed from a checkpoint puts exactly the uninterrupted run's averages."""
        full = _loss_run(tmp_path / "a", 0.9, save_at)
        full.fit()
        resumed = _loss_run(tmp_path / "b", 0.9, save_at)
        resumed.resume(tmp_path / "a" / "ckpt.pt")
        resumed.fit()
        a = full.metrics.history("train/loss_ema")
        b = resumed.metrics.history("train/loss_ema")
        assert b == a  # the history up to the checkpoint comes back with it

    def test_refusals(self) -> None:
        """A decay outside [0, 1) or no metrics are refused."""
        with pytest.raises(ValueError, match=r"`decay` must be a number in \[0, 1\)"):
            MovingAverageSummary(decay=1.0)
        with pytest.raises(ValueError, match="`metrics` must be"):
            MovingAverageSummary(metrics=[])


class TestToml:
    """Each callback is usable from TOML by name, its arguments checked with key paths."""

    def test_all_load(self) -> None:
        """The documented tables load."""
        spec = loads_spec("""
[callbacks.human]
type = "HumanHyperParamSetter"
param = "lr"
file = "hyper.txt"
trigger = { every = "1 epoch" }
[callbacks.send]
type = "SendStat"
command = ["echo", "{val/loss}"]
metrics = ["val/loss"]
timeout = 5
trigger = { every = "1 epoch" }
[callbacks.gpu]
type = "GPUUtilizationTracker"
trigger = { every = "100 steps" }
[callbacks.shell]
type = "InjectShell"
shell = "python"
trigger = { every = "100 steps" }
[callbacks.ema]
type = "MovingAverageSummary"
metrics = ["train/loss"]
decay = 0.9
trigger = { every = "1 step" }
""")
        assert [c.type for c in spec.callbacks.values()] == [
            "HumanHyperParamSetter", "SendStat", "GPUUtilizationTracker", "InjectShell",
            "MovingAverageSummary"]

    @pytest.mark.parametrize(("table", "path", "message"), [
        ('type = "SendStat"\ncommand = "curl x"', "callbacks.c.command",
         "expected a non-empty list of strings"),
        ('type = "SendStat"', "callbacks.c", "SendStat needs the argument 'command'"),
        ('type = "MovingAverageSummary"\ndecay = 1', "callbacks.c.decay",
         "expected a number in [0, 1)"),
        ('type = "InjectShell"\nhook = "x"', "callbacks.c.hook", "only from Python"),
        ('type = "HumanHyperParamSetter"\nparam = ""', "callbacks.c.param",
         "expected an optimizer param-group key"),
    ])
    def test_bad_arguments(self, table: str, path: str, message: str) -> None:
        """A bad argument is reported at its key path with what was expected."""
        with pytest.raises(SpecError) as info:
            loads_spec(f'[callbacks.c]\n{table}\ntrigger = {{ every = "1 epoch" }}\n')
        assert any(p.path == path and message in p.message for p in info.value.problems), [
            str(p) for p in info.value.problems]
