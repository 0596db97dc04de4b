"""One firing semantics: the reference, ``simulate()``, ``plan --format json`` and a real run.

Random schedules of every trigger kind (every/at in all units, on, windows, conditions
and metric triggers fed by a metric stream, all/any/not) over random runs (uneven
epochs, gradient accumulation, samples, tokens, wall time, ``max_steps`` cuts) must
fire exactly as the reference in ``tests/oracle.py`` says, in ``simulate()``, in
``schedtrain plan --format json`` and in a ``Trainer``; and a callback's firings must
not change when unrelated callbacks are added.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from oracle import CONDITIONS, RunSpec, firings
from training_helpers import tiny_model

from schedtrain import Schedule, ScheduleError, Time, Unit, simulate
from schedtrain.callbacks import Callback
from schedtrain.cli import main
from schedtrain.clock import LoopClock
from schedtrain.schedule import FiringLog
from schedtrain.spec import schedule_to_toml, toml_value
from schedtrain.training import Trainer
from schedtrain.triggers import (
    Trigger,
    all_of,
    any_of,
    at,
    every,
    improved,
    not_,
    on,
    plateau,
    when,
    window,
)

pytestmark = pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")

UNITS = [Unit.STEP, Unit.BATCH, Unit.EPOCH, Unit.SAMPLE, Unit.TOKEN, Unit.SECOND]
METRICS = ["m1", "m2"]
EVENTS = ["train_start", "epoch_start", "batch_end", "step_end", "epoch_end", "train_end"]


# -- schedules ----------------------------------------------------------------------------


def _amount(unit: Unit) -> st.SearchStrategy[int]:
    return st.integers(1, 12) if unit is not Unit.SECOND else st.integers(1, 6)


@st.composite
def periodic(draw: st.DrawFn) -> Trigger:
    unit = draw(st.sampled_from(UNITS))
    k = draw(_amount(unit))
    off = draw(st.integers(0, 2 * k))
    return every(Time(k, unit), offset=Time(off, unit) if off else None)


@st.composite
def points(draw: st.DrawFn) -> Trigger:
    """Points in one unit, or in several (an ``any`` of one ``at`` per unit)."""
    ps = draw(st.lists(st.tuples(st.integers(1, 40), st.sampled_from(UNITS)), min_size=1,
                       max_size=3))
    return at(*(Time(p, unit) for p, unit in ps))


@st.composite
def windows(draw: st.DrawFn) -> Trigger:
    """A window; start and stop may read two counters (then two windows AND-ed)."""
    units = [Unit.STEP, Unit.EPOCH, Unit.SAMPLE, Unit.BATCH]
    lo_unit, hi_unit = draw(st.sampled_from(units)), draw(st.sampled_from(units))
    start = draw(st.none() | st.integers(0, 30))
    stop = draw(st.none() | st.integers(1, 60))
    if start is None and stop is None:
        start = 1
    if lo_unit is hi_unit and start is not None and stop is not None and stop <= start:
        stop = start + 1
    return window(None if start is None else Time(start, lo_unit),
                  None if stop is None else Time(stop, hi_unit))


def _cond_tree() -> st.SearchStrategy[Any]:
    cmp = st.tuples(st.just("cmp"), st.sampled_from(METRICS),
                    st.sampled_from(["<", "<=", ">", ">=", "==", "!="]),
                    st.sampled_from([0.25, 0.5, 1.0]))
    return st.recursive(cmp, lambda c: st.one_of(
        st.tuples(st.sampled_from(["and", "or"]), st.lists(c, min_size=2, max_size=3)),
        st.tuples(st.just("not"), c)), max_leaves=3)


def _text(tree: Any) -> str:
    if tree[0] == "cmp":
        return f"{tree[1]} {tree[2]} {tree[3]}"
    if tree[0] == "not":
        return f"not ({_text(tree[1])})"
    return f" {tree[0]} ".join(f"({_text(c)})" for c in tree[1])


@st.composite
def conditions(draw: st.DrawFn) -> Trigger:
    tree = draw(_cond_tree())
    text = _text(tree)
    CONDITIONS[text] = tree
    return when(text)


#: Bands of 0, 1/4 and 1/2 against the stream's values, eighths up to 1 (and 2): a gain can
#: be smaller than the band, equal to it or beyond it, all exact in binary.
MIN_DELTAS = st.sampled_from([0.0, 0.25, 0.5])
VALUES = st.sampled_from([0.0, 0.125, 0.25, 0.375, 0.5, 0.75, 1.0, 2.0])
metric_triggers = st.one_of(
    st.builds(improved, st.sampled_from(METRICS), st.sampled_from(["min", "max"]), MIN_DELTAS),
    st.builds(plateau, st.sampled_from(METRICS), st.integers(1, 3),
              st.sampled_from(["min", "max"]), MIN_DELTAS),
)
leaves = st.one_of(periodic(), periodic(), points(), st.sampled_from(EVENTS).map(on),
                   windows(), conditions(), metric_triggers)
triggers = st.recursive(leaves, lambda c: st.one_of(
    st.lists(c, min_size=2, max_size=3).map(lambda ts: all_of(*ts)),
    st.lists(c, min_size=2, max_size=3).map(lambda ts: any_of(*ts)),
    c.map(not_)), max_leaves=5)


@st.composite
def schedules(draw: st.DrawFn, prefix: str = "cb", max_size: int = 3) -> Schedule:
    n = draw(st.integers(1, max_size))
    return Schedule({f"{prefix}{i}": draw(triggers) for i in range(n)})


# -- runs ---------------------------------------------------------------------------------


@st.composite
def runs(draw: st.DrawFn) -> RunSpec:
    lengths = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=4)))
    total = sum(lengths)
    cut = draw(st.none() | st.integers(1, total))
    records = draw(st.lists(st.tuples(
        st.one_of(st.tuples(st.just("step"), st.integers(0, total)),
                  st.tuples(st.just("epoch"), st.integers(0, len(lengths)))),
        st.sampled_from(METRICS), VALUES), max_size=8))
    return RunSpec(lengths, draw(st.integers(1, 3)), draw(st.integers(1, 3)),
                   draw(st.sampled_from([0, 3, 7])), draw(st.sampled_from([0.0, 0.35, 1.5])),
                   cut, tuple(records))


def _stream(run: RunSpec) -> list[tuple[str, str, float]]:
    return [(f"{k} {unit}s", name, value) for (unit, k), name, value in run.metrics]


def _simulate(schedule: Schedule, run: RunSpec) -> FiringLog:
    return simulate(schedule, epoch_lengths=list(run.epoch_lengths),
                    batches_per_step=run.batches_per_step,
                    samples_per_batch=run.samples_per_batch,
                    tokens_per_batch=run.tokens_per_batch,
                    seconds_per_step=run.seconds_per_step, max_steps=run.max_steps,
                    metrics=_stream(run))


def _as_tuples(log: FiringLog) -> list[tuple[str, str, Any]]:
    return [(f.callback, f.event, f.timestamp) for f in log]


def _checked(schedule: Schedule) -> bool:
    try:
        schedule.compile()
    except ScheduleError:
        return False
    return True


_SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


class TestReference:
    """``simulate()`` against the reference, and independence from other callbacks."""

    @_SETTINGS
    @given(schedules(), runs())
    def test_simulate_equals_the_reference(self, schedule: Schedule, run: RunSpec) -> None:
        """Every firing, with the clock at it, is the one the definitions give."""
        expected = firings(schedule, run)
        for entry in schedule:  # one refused as never firing indeed never fires
            if not _checked(Schedule([entry])):
                assert [f for f in expected if f[0] == entry.name] == []
        if _checked(schedule):
            assert _as_tuples(_simulate(schedule, run)) == expected

    @_SETTINGS
    @given(schedules(), schedules(prefix="other"), runs(), st.booleans())
    def test_unrelated_callbacks_change_nothing(self, schedule: Schedule, others: Schedule,
                                                run: RunSpec, before: bool) -> None:
        """A callback fires the same whatever other callbacks are declared around it."""
        both = Schedule(list(others) + list(schedule) if before
                        else list(schedule) + list(others))
        assume(_checked(both))
        mine = set(schedule.names)
        alone = _as_tuples(_simulate(schedule, run))
        assert [f for f in _as_tuples(_simulate(both, run)) if f[0] in mine] == alone


def _spec_text(schedule: Schedule, run: RunSpec) -> str:
    clock = {"epoch_lengths": list(run.epoch_lengths), "batches_per_step": run.batches_per_step,
             "samples_per_batch": run.samples_per_batch,
             "tokens_per_batch": run.tokens_per_batch,
             "seconds_per_step": run.seconds_per_step}
    if run.max_steps is not None:
        clock["max_steps"] = run.max_steps
    lines = ["[clock]", *(f"{k} = {toml_value(v)}" for k, v in clock.items()), ""]
    return "\n".join(lines) + schedule_to_toml(schedule)


class TestPlan:
    """``schedtrain plan --format json --metrics FILE`` prints what ``simulate()`` returns."""

    @_SETTINGS
    @given(schedules(), runs())
    def test_plan_json_equals_simulate(self, tmp_path_factory: pytest.TempPathFactory,
                                       schedule: Schedule, run: RunSpec) -> None:
        """The plan of the TOML form of a schedule lists the simulated firings."""
        assume(_checked(schedule))
        folder = tmp_path_factory.mktemp("plan")
        spec = folder / "s.toml"
        spec.write_text(_spec_text(schedule, run))
        stream = folder / "m.jsonl"
        stream.write_text("".join(json.dumps({"name": name, "value": value, unit: k}) + "\n"
                                  for (unit, k), name, value in run.metrics))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(["plan", str(spec), "--format", "json", "--metrics", str(stream)])
        assert code == 0
        assert json.loads(out.getvalue()) == json.loads(_simulate(schedule, run).to_json())


# -- a real training run -------------------------------------------------------------------


class FakeTime:
    """A nanosecond source that moves ``step_ns`` per reading: the loop reads it once when
    training starts and once per step end, so step ``s`` ends at ``s * step_ns``."""

    def __init__(self, step_ns: int) -> None:
        self.step_ns = step_ns
        self.now = 0

    def __call__(self) -> int:
        value = self.now
        self.now += self.step_ns
        return value


class Feeder(Callback):
    """Puts the stream's values where the reference makes them visible: a step's before its
    ``step_end`` is evaluated, an epoch's before its ``epoch_end``."""

    def __init__(self, records: tuple[Any, ...]) -> None:
        self.records = records

    def _put(self, unit: str, k: int) -> None:
        for (u, at_k), name, value in self.records:
            if (u, at_k) == (unit, k) and k > 0:
                self.metrics.put(name, value)

    def _before_train(self) -> None:
        for (_, at_k), name, value in self.records:  # step 0 and epoch 0: in stream order
            if at_k == 0:
                self.metrics.put(name, value)

    def _after_step(self, step: int, outputs: Any) -> None:
        self._put("step", step)

    def _after_epoch(self) -> None:
        self._put("epoch", self.now.epoch)


class Noop(Callback):
    """Does nothing; the trainer records its firings."""


class _Batches:
    """``lengths[e]`` micro-batches in the e-th pass; tuples, or dicts with ``num_tokens``."""

    def __init__(self, lengths: list[int], size: int, tokens: int) -> None:
        self.lengths, self.size, self.tokens, self.passes = lengths, size, tokens, 0
        self.x = torch.randn(max(lengths) * size, 3, generator=torch.Generator().manual_seed(0))

    def __iter__(self) -> Any:
        n = self.lengths[min(self.passes, len(self.lengths) - 1)]
        self.passes += 1
        for i in range(n):
            x = self.x[i * self.size:(i + 1) * self.size]
            y = x.sum(1, keepdim=True)
            yield {"x": x, "y": y, "num_tokens": self.tokens} if self.tokens else (x, y)


def _train(schedule: Schedule, run: RunSpec) -> list[tuple[str, str, Any]]:
    accum = run.batches_per_step
    data = _Batches([n * accum for n in run.epoch_lengths], run.samples_per_batch,
                    run.tokens_per_batch)
    step_ns = round(run.seconds_per_step * 10**9)
    bindings: dict[str, Callback] = {n: Noop() for n in schedule.names}
    entries = list(schedule)
    if run.metrics:
        from schedtrain import Scheduled

        entries.append(Scheduled(at("100000 steps"), None, "_feeder"))
        bindings["_feeder"] = Feeder(run.metrics)
    model, opt = tiny_model()
    loss_fn, step_fn = torch.nn.functional.mse_loss, None
    if run.tokens_per_batch:
        loss_fn, step_fn = None, lambda m, b: torch.nn.functional.mse_loss(m(b["x"]), b["y"])
    trainer = Trainer(model, opt, data, loss_fn, step_fn, schedule=Schedule(entries),
                      bindings=bindings, max_epochs=len(run.epoch_lengths),
                      max_steps=run.max_steps, grad_accum=accum,
                      clock=LoopClock(time_source=FakeTime(step_ns)))
    trainer.fit()
    # train_end's wall time is read when training stops, after the last step: not compared.
    return [(f.callback, f.event,
             attrs.evolve(f.timestamp, time_ns=0) if f.event == "train_end" else f.timestamp)
            for f in trainer.firings if f.callback != "_feeder"]


class TestTrainer:
    """A real ``Trainer`` fires exactly what ``simulate()`` predicts."""

    @_SETTINGS
    @given(schedules(), runs())
    def test_training_equals_simulate(self, schedule: Schedule, run: RunSpec) -> None:
        """All kinds of triggers, metric streams, accumulation, tokens, time and cuts."""
        assume(_checked(schedule))
        expected = [(n, e, attrs.evolve(t, time_ns=0) if e == "train_end" else t)
                    for n, e, t in _as_tuples(_simulate(schedule, run))]
        assert _train(schedule, run) == expected


def test_the_oracle_reads_the_examples_of_the_docs() -> None:
    """The reference agrees with the documented timelines it was written from."""
    from schedtrain import Schedule as S

    run = RunSpec((4, 4, 4))
    assert [f[2].step for f in firings(S({"x": every("3 steps")}), run)] == [3, 6, 9, 12]
    run = RunSpec((4,) * 5)
    log = firings(S({"x": every("1 epoch") & window(start="2 epochs", stop="4 epochs")}), run)
    assert [f[2].epoch for f in log] == [2, 3]
    run = RunSpec((12,), samples_per_batch=4)
    assert [f[2].step for f in firings(S({"x": every("10 samples")}), run)] == [3, 5, 8, 10]
    assert (Path(__file__).resolve().parents[1] / "oracle.py").exists()
