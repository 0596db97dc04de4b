"""``[run] sink_every``: a sink thinned to a period gets exactly one report per period."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest
from first_day_project import VALIDATE, spec
from hypothesis import given, settings
from hypothesis import strategies as st

from schedtrain.cli import main
from schedtrain.monitors.cadence import Every
from schedtrain.monitors.store import MetricStore, Record
from schedtrain.time import Timestamp


class Keep:
    """A sink that keeps the scalar records it is given."""

    def __init__(self) -> None:
        self.got: list[Record] = []

    def scalars(self, records: Sequence[Record]) -> None:
        assert records
        self.got.extend(records)

    def firing(self, *_: object) -> None:
        return None

    def close(self) -> None:
        return None


#: one epoch of a run: for each step, how many values are put at its step_end (0-2),
#: then how many at the epoch_end; and after which operations the store is flushed
epochs_st = st.lists(st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=5),
                               st.integers(0, 2)), min_size=1, max_size=5)


class _Run:
    """Drive a ``MetricStore`` with an ``Every`` sink like the loop does, optionally
    checkpointed after operation ``cut`` and resumed in a fresh store and sink."""

    def __init__(self, period: str) -> None:
        self.period, self.ts = period, Timestamp()
        self.keeps = [Keep()]
        self.store = self._store()

    def _store(self) -> MetricStore:
        return MetricStore(lambda: self.ts, [Every(self.keeps[-1], self.period)])

    def resume(self) -> None:
        state = self.store.state_dict()
        self.keeps.append(Keep())
        self.store = self._store()
        self.store.load_state_dict(state)

    def play(self, epochs: list[tuple[list[int], int]], flushes: list[bool],
             cut: int | None) -> list[Record]:
        ops = 0

        def op() -> bool:
            nonlocal ops
            if flushes[ops % len(flushes)]:
                self.store.flush()
            ops += 1
            if ops - 1 == cut:
                self.resume()
                return True
            return False

        step = 0
        for e, (puts, at_end) in enumerate(epochs):
            for i, n in enumerate(puts):
                step += 1
                self.ts = Timestamp(step=step, epoch=e, step_in_epoch=i + 1)
                for j in range(n):
                    self.store.put(f"m{j}", float(step))
                op()
            self.ts = Timestamp(step=step, epoch=e + 1, step_in_epoch=len(puts))
            for j in range(at_end):
                self.store.put(f"v{j}", float(step))
            # A run checkpointed during epoch_end resumes at the next epoch: the loop
            # does not end this one again.
            if not op():
                self.store.epoch_ended(self.ts)
        self.store.close()
        return [r for k in self.keeps for r in k.got]


def _reference(epochs: list[tuple[list[int], int]], unit: str, k: int) -> list[tuple[int, int]]:
    """The (step, epoch) of each report a sink of period ``k`` units gets."""
    reports: list[tuple[int, int, bool]] = []  # (step, epoch, made at an epoch_end)
    out: list[tuple[int, int]] = []
    step, last, held = 0, 0, None
    for e, (puts, at_end) in enumerate(epochs):
        for n in puts:
            step += 1
            if n:
                reports.append((step, e, False))
                held = (step, e)
        if at_end:
            reports.append((step, e + 1, True))
            held = (step, e + 1)
        if unit == "epochs" and (e + 1) % k == 0 and held is not None:
            out.append(held)
            held = None
    if unit == "steps":
        for s, ep, _ in reports:
            if s // k != last // k:
                out.append((s, ep))
                last = s
    return out


class TestEvery:
    """``Every`` passes one report per period, however the values are flushed."""

    @settings(max_examples=150, deadline=None)
    @given(epochs_st, st.sampled_from(["steps", "epochs"]), st.integers(1, 4),
           st.lists(st.booleans(), min_size=1, max_size=6), st.none() | st.integers(0, 30))
    def test_one_report_per_period(self, epochs: list[tuple[list[int], int]], unit: str,
                                   k: int, flushes: list[bool], cut: int | None) -> None:
        """Against a reference: "k steps" passes the first report whose step crosses a
        multiple of k, "k epochs" the last report at or before each k-th epoch_end; every
        value of a passed report goes; a run checkpointed anywhere and resumed passes the
        same."""
        got = _Run(f"{k} {unit}").play(epochs, flushes, cut)
        expected = _reference(epochs, unit, k)
        assert list(dict.fromkeys((r.step, r.epoch) for r in got)) == expected
        uncut = _Run(f"{k} {unit}").play(epochs, flushes, None)
        assert [(r.name, r.step, r.epoch) for r in got] == [
            (r.name, r.step, r.epoch) for r in uncut]
        for s, e in expected:  # all the values of each passed report
            names = [r.name for r in got if (r.step, r.epoch) == (s, e)]
            assert len(names) == len(set(names)) >= 1

    def test_step_end_and_epoch_end_at_one_step_are_one_period(self) -> None:
        """With "2 steps", the epoch_end report made at step 2 does not pass after the
        step_end report of step 2 did."""
        keep = Keep()
        sink = Every(keep, "2 steps")
        sink.scalars([Record("a", 1.0, 2, 0, 0.0), Record("v", 1.0, 2, 1, 0.0)])
        assert [r.name for r in keep.got] == ["a"]

    def test_epoch_period_passes_every_name_since_the_last_report(self) -> None:
        """With "1 epoch", the epoch's report holds the per-step values (``train/loss_ema``)
        beside the epoch_end's (validation), each at its newest value, stamped as the
        epoch_end's report: tensorpack's ``ScalarPrinter`` prints every name put since
        its last print."""
        keep = Keep()
        sink = Every(keep, "1 epoch")
        sink.scalars([Record("train/loss_ema", 1.0, 3, 0, 0.0),
                      Record("train/loss_ema", 0.9, 4, 0, 0.0),
                      Record("val/loss", 2.0, 4, 1, 0.0), Record("val/acc", 0.5, 4, 1, 0.0)])
        assert keep.got == []  # held until the epoch ends
        sink.epoch_end(Timestamp(step=4, epoch=1))
        assert [(r.name, r.value, r.step, r.epoch) for r in keep.got] == [
            ("train/loss_ema", 0.9, 4, 1), ("val/loss", 2.0, 4, 1), ("val/acc", 0.5, 4, 1)]

    @settings(max_examples=150, deadline=None)
    @given(epochs_st, st.integers(1, 4), st.lists(st.booleans(), min_size=1, max_size=6),
           st.none() | st.integers(0, 30))
    def test_epoch_report_is_what_scalar_printer_prints(
            self, epochs: list[tuple[list[int], int]], k: int, flushes: list[bool],
            cut: int | None) -> None:
        """Against tensorpack's ``ScalarPrinter`` (a dict of name -> newest value, printed
        and emptied at each k-th epoch end), however the store flushes, resumed anywhere."""
        expected: list[tuple[tuple[int, int], list[tuple[str, float]]]] = []
        printer: dict[str, float] = {}
        step, stamp = 0, (0, 0)
        for e, (puts, at_end) in enumerate(epochs):
            for n in puts:
                step += 1
                for j in range(n):
                    printer[f"m{j}"], stamp = float(step), (step, e)
            for j in range(at_end):
                printer[f"v{j}"], stamp = float(step), (step, e + 1)
            if (e + 1) % k == 0 and printer:
                expected.append((stamp, sorted(printer.items())))
                printer = {}
        got = _Run(f"{k} epochs").play(epochs, flushes, cut)
        reports: dict[tuple[int, int], list[tuple[str, float]]] = {}
        for r in got:
            reports.setdefault((r.step, r.epoch), []).append((r.name, r.value))
        assert [(s, sorted(v)) for s, v in reports.items()] == expected


TASK = '''
import torch
from torch.utils.data import DataLoader, TensorDataset

from schedtrain.callbacks import Callback
from schedtrain.training import Task


class PutEachStep(Callback):
    def _trigger(self):
        self.metrics.put("probe/step", float(self.trainer.clock.step))


def make_task():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    model = torch.nn.Linear(4, 1)
    return Task(model, torch.optim.SGD(model.parameters(), lr=0.1),
                DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8),
                loss_fn=torch.nn.functional.mse_loss)
'''


def test_console_one_line_per_epoch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A callback puts a metric every step (4 steps an epoch); the console with
    ``sink_every = "1 epoch"`` prints one line per epoch, each the epoch's last step."""
    module = f"cadence_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(TASK)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "s.toml").write_text(textwrap.dedent(f"""
        [run]
        task = "{module}:make_task"
        device = "cpu"
        max_epochs = 3
        sinks = ["console", "jsonl"]
        sink_every = {{ console = "1 epoch" }}
        [callbacks.probe]
        type = "{module}:PutEachStep"
        trigger = {{ every = "1 step" }}
        """))
    assert main(["train", "s.toml", "--run-dir", "out"]) == 0
    printed = [x for x in capsys.readouterr().out.splitlines() if x.startswith("epoch ")]
    assert [x.split()[:4] for x in printed] == [["epoch", "0", "step", "4"],
                                                ["epoch", "1", "step", "8"],
                                                ["epoch", "2", "step", "12"]]
    assert all("probe/step=" in x and "train/loss=" in x for x in printed)


class TestSinks:
    """``[run] sinks`` chooses where scalars go, ``sink_every`` how often. (first day, issue 12
    C)"""

    def test_bad_sinks_are_listed_with_key_paths(self) -> None:
        """Every problem of sinks and sink_every is reported at its key path."""
        from schedtrain import SpecError
        from schedtrain.spec import loads_spec

        with pytest.raises(SpecError) as info:
            loads_spec("""
                [run]
                sinks = ["jsonl", "consol", "jsonl"]
                sink_every = { jsonl = "1 epoch", tensorboard = "2 epochs", console = "30 s" }
                [callbacks.a]
                trigger = { every = "1 epoch" }
                """.replace("\n                ", "\n"))
        found = {p.path: p.message for p in info.value.problems}
        assert "did you mean 'console'" in found["run.sinks[1]"]
        assert "listed twice" in found["run.sinks[2]"]
        assert "events.jsonl keeps every value" in found["run.sink_every.jsonl"]
        assert "not in run.sinks" in found["run.sink_every.tensorboard"]
        assert "steps or epochs" in found["run.sink_every.console"]

    @pytest.mark.parametrize("period", ["0 steps", "1.5 epochs", "100 tokens", "soon"])
    def test_bad_periods(self, period: str) -> None:
        """A cadence is a whole number >= 1 of steps or epochs."""
        from schedtrain.spec.document import sink_period_problem

        assert sink_period_problem(period) is not None
        assert sink_period_problem("3 steps") is None

    def test_console_every_two_epochs(self, project: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
        """The console prints one report every second epoch; without "jsonl" no
        events.jsonl is written."""
        module = (project / "module_name").read_text()
        path = spec(project, f"""
            [run]
            task = "{module}:make_task"
            device = "cpu"
            max_epochs = 5
            sinks = ["console"]
            sink_every = {{ console = "2 epochs" }}
            """ + VALIDATE)
        assert main(["train", path, "--run-dir", "out"]) == 0
        printed = [x for x in capsys.readouterr().out.splitlines() if x.startswith("epoch ")]
        assert [x.split()[:4] for x in printed] == [["epoch", "2", "step", "8"],
                                                    ["epoch", "4", "step", "16"]]
        assert all("val/loss=" in x for x in printed)
        assert not (project / "out" / "events.jsonl").exists()

    @given(st.lists(st.integers(0, 50), min_size=1, max_size=40), st.integers(1, 7),
           st.integers(1, 5))
    def test_every_passes_one_report_per_period(self, deltas: list[int], k: int,
                                                chunk: int) -> None:
        """Of reports at non-decreasing steps, however they are flushed, exactly the first
        report (step) of each period that has one goes through, with all its values."""
        from schedtrain.monitors.cadence import Every
        from schedtrain.monitors.store import Record

        steps = [sum(deltas[: i + 1]) for i in range(len(deltas))]
        records = [Record(n, float(s), s, 0, 0.0) for s in steps for n in ("a", "b")]
        keep = Keep()
        sink = Every(keep, f"{k} steps")
        for i in range(0, len(records), chunk):
            sink.scalars(records[i:i + chunk])
        expected, last = [], 0
        for s in dict.fromkeys(steps):
            if s // k != last // k:
                expected.append(s)
                last = s
        # Every value of an accepted report goes, also when it comes in a later flush.
        assert keep.got == [r for r in records if r.step in expected]
