"""``simulate()`` models every shape the hosts' counter table describes: an epoch that
ends on a partial accumulation step (``batches_per_epoch``: 10 batches, 3 a step, make
steps of 3, 3, 3 and 1) and an uneven last batch (``samples_per_batch=[4, 4, 2]``), against
the step-by-step reference in ``tests/oracle.py``, and through ``[clock]`` in TOML."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from oracle import RunSpec, firings
from test_agreement import METRICS, VALUES, _as_tuples, _checked, _stream, schedules

from schedtrain import Schedule, every, simulate
from schedtrain.cli import main
from schedtrain.errors import SpecError
from schedtrain.schedule import FiringLog
from schedtrain.simulation import RunShape
from schedtrain.spec import loads_spec, schedule_to_toml, toml_value
from schedtrain.testing import assert_resumes_exactly

pytestmark = pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")
_SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def uneven_runs(draw: st.DrawFn) -> RunSpec:
    """Equal epochs of ``batches_per_epoch`` batches, often not a multiple of the
    accumulation, with samples and tokens per batch as a number or one epoch's list."""
    per_step = draw(st.integers(1, 4))
    batches = draw(st.integers(1, 9))
    epochs = draw(st.integers(1, 4))
    steps = -(-batches // per_step)
    total = steps * epochs

    def rate(low: int, high: int) -> st.SearchStrategy[int | tuple[int, ...]]:
        return st.integers(low, high) | st.lists(
            st.integers(low, high), min_size=batches, max_size=batches).map(tuple)

    records = draw(st.lists(st.tuples(
        st.one_of(st.tuples(st.just("step"), st.integers(0, total)),
                  st.tuples(st.just("epoch"), st.integers(0, epochs))),
        st.sampled_from(METRICS), VALUES), max_size=6))
    return RunSpec((steps,) * epochs, per_step, draw(rate(0, 5)), draw(rate(0, 7)),
                   draw(st.sampled_from([0.0, 0.35])), draw(st.none() | st.integers(1, total)),
                   tuple(records), batches)


def _simulate(schedule: Schedule, run: RunSpec) -> FiringLog:
    return simulate(schedule, epochs=len(run.epoch_lengths),
                    batches_per_epoch=run.batches_per_epoch,
                    batches_per_step=run.batches_per_step,
                    samples_per_batch=run.samples_per_batch,
                    tokens_per_batch=run.tokens_per_batch,
                    seconds_per_step=run.seconds_per_step, max_steps=run.max_steps,
                    metrics=_stream(run))


class TestUnevenShapes:
    @_SETTINGS
    @given(schedules(), uneven_runs())
    def test_simulate_equals_the_reference(self, schedule: Schedule, run: RunSpec) -> None:
        """Every firing of every trigger kind, with the clock at it (step, batch, sample
        and token counters included), is the one the step-by-step walk gives."""
        assume(_checked(schedule))
        assert _as_tuples(_simulate(schedule, run)) == firings(schedule, run)

    @_SETTINGS
    @given(schedules(), uneven_runs())
    def test_plan_json_of_the_clock_table(self, tmp_path_factory: pytest.TempPathFactory,
                                          schedule: Schedule, run: RunSpec) -> None:
        """``[clock] batches_per_epoch`` and a ``samples_per_batch`` list plan as
        ``simulate()`` runs."""
        assume(_checked(schedule))
        clock: dict[str, object] = {
            "epochs": len(run.epoch_lengths), "batches_per_epoch": run.batches_per_epoch,
            "batches_per_step": run.batches_per_step,
            "samples_per_batch": list(run.samples_per_batch)
            if isinstance(run.samples_per_batch, tuple) else run.samples_per_batch,
            "tokens_per_batch": list(run.tokens_per_batch)
            if isinstance(run.tokens_per_batch, tuple) else run.tokens_per_batch,
            "seconds_per_step": run.seconds_per_step}
        if run.max_steps is not None:
            clock["max_steps"] = run.max_steps
        folder = tmp_path_factory.mktemp("plan")
        spec = folder / "s.toml"
        spec.write_text("\n".join(["[clock]", *(f"{k} = {toml_value(v)}"
                                                 for k, v in clock.items()), ""])
                        + schedule_to_toml(schedule))
        stream = folder / "m.jsonl"
        stream.write_text("".join(json.dumps({"name": name, "value": value, unit: k}) + "\n"
                                  for (unit, k), name, value in run.metrics))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(["plan", str(spec), "--format", "json", "--metrics", str(stream)])
        assert code == 0
        assert json.loads(out.getvalue()) == json.loads(_simulate(schedule, run).to_json())

    @given(st.integers(1, 6), st.integers(1, 5), st.integers(1, 4), st.integers(0, 9))
    def test_whole_steps_are_the_old_shape(self, steps: int, per_step: int, epochs: int,
                                           samples: int) -> None:
        """An epoch of whole steps and equal batches is the shape given as before."""
        new = RunShape.build(epochs=epochs, batches_per_epoch=steps * per_step,
                             batches_per_step=per_step,
                             samples_per_batch=[samples] * (steps * per_step))
        old = RunShape.build(epochs=epochs, steps_per_epoch=steps, batches_per_step=per_step,
                             samples_per_batch=samples)
        assert new.runs == old.runs
        for s in range(new.total_steps + 1):
            assert new.at_steps(s, 0, 0) == old.at_steps(s, 0, 0)
        for due in range(new.samples_at(new.batches_at(new.total_steps)) + 2):
            assert new.min_steps("sample", due) == old.min_steps("sample", due)


def test_the_counter_tables_example() -> None:
    """10 batches, 3 a step: 4 steps of 3, 3, 3 and 1 batches an epoch."""
    shape = RunShape.build(epochs=2, batches_per_epoch=10, batches_per_step=3)
    assert [shape.batches_at(s) for s in range(9)] == [0, 3, 6, 9, 10, 13, 16, 19, 20]
    shape = RunShape.build(epochs=2, samples_per_batch=[4, 4, 2])
    assert [shape.samples_at(b) for b in range(7)] == [0, 4, 8, 10, 14, 18, 20]


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"epochs": 2, "batches_per_epoch": 10, "batches_per_step": 3, "steps_per_epoch": 3},
     "steps_per_epoch=3 but 10 batches"),
    ({"epochs": 2, "batches_per_epoch": 4, "samples_per_batch": [1, 2]},
     "samples_per_batch lists 2 batches but batches_per_epoch is 4"),
    ({"epochs": 2, "samples_per_batch": [1, 2], "tokens_per_batch": [1, 2, 3]},
     "list different numbers"),
    ({"epochs": 2, "samples_per_batch": []}, "one number per batch"),
    ({"epochs": 2, "samples_per_batch": [1, -1]}, "samples_per_batch[1]"),
    ({"epochs": 2, "batches_per_epoch": 0}, "batches_per_epoch must be"),
])
def test_bad_shapes_are_refused(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        RunShape.build(**kwargs)  # type: ignore[arg-type]
    assert words in str(info.value)


def test_lists_need_epochs_of_one_length() -> None:
    with pytest.raises(TypeError, match="not epoch_lengths"):
        RunShape.build(epoch_lengths=[2, 3], samples_per_batch=[1, 2])



CALLBACK = '[callbacks.a]\ntrigger = { every = "1 step" }\n'


@pytest.mark.parametrize(("clock", "words"), [
    ("epochs = 2\nbatches_per_epoch = 3\nsamples_per_batch = [1, 2]",
     "clock.batches_per_epoch: samples_per_batch lists 2 batches but batches_per_epoch is 3"),
    ("epoch_lengths = [2, 3]\nsamples_per_batch = [1, 2]",
     "clock.batches_per_epoch: give batches_per_epoch (or per-batch lists) with epochs"),
    ("epochs = 2\nsteps_per_epoch = 2\nbatches_per_epoch = 7\nbatches_per_step = 2",
     "clock.batches_per_epoch: steps_per_epoch=2 but 7 batches per epoch, 2 a step, make 4"),
    ("epochs = 2\nsamples_per_batch = [4, -1]",
     "clock.samples_per_batch[1]: expected a whole number >= 0, found -1"),
    ("epochs = 2\ntokens_per_batch = []",
     "clock.tokens_per_batch: expected a number, or a non-empty list"),
    ("epochs = 2\nsamples_per_batch = [4, \"a\"]", "clock.samples_per_batch: expected an integer"),
    ("epochs = 2\nbatches_per_epoch = 0", "clock.batches_per_epoch: expected a whole number >= 1"),
])
def test_bad_clock_tables_are_refused(clock: str, words: str) -> None:
    """Each in one line naming the key path, found when the spec is read."""
    with pytest.raises(SpecError) as info:
        loads_spec(f"[clock]\n{clock}\n\n{CALLBACK}")
    assert words in str(info.value)


def test_a_problem_elsewhere_still_checks_the_clock() -> None:
    """The keys' fit is checked whatever else the spec gets wrong."""
    with pytest.raises(SpecError) as info:
        loads_spec("[clock]\nepochs = 2\nbatches_per_epoch = 3\nsamples_per_batch = [1, 2]"
                   f"\n\n{CALLBACK}\n[nonsense]\n")
    assert "clock.batches_per_epoch" in str(info.value)
    assert "nonsense" in str(info.value)


def test_plan_refuses_a_bad_clock_in_one_line(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text(f"[clock]\nepochs = 2\nbatches_per_epoch = 3\nsamples_per_batch = [1, 2]"
                    f"\n\n{CALLBACK}")
    assert main(["plan", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "clock.batches_per_epoch" in err
    assert "Traceback" not in err


def test_the_run_shape_keywords_are_declared_once() -> None:
    """``simulate`` takes ``RunShape.build``'s keywords with the same defaults
    (``SHAPE_DEFAULTS``, read from ``build``), and ``assert_resumes_exactly`` names the
    same list: a keyword added to ``build`` and not to ``simulate`` is caught here."""
    import inspect

    from schedtrain.simulation.simulate import SHAPE_DEFAULTS

    build = inspect.signature(RunShape.build).parameters
    sim = inspect.signature(simulate).parameters
    assert dict(SHAPE_DEFAULTS) == {n: p.default for n, p in build.items()}
    assert {n: sim[n].default for n in SHAPE_DEFAULTS if n in sim} == dict(SHAPE_DEFAULTS)
    with pytest.raises(TypeError, match=re.escape(str(sorted(SHAPE_DEFAULTS)))):
        assert_resumes_exactly(every("1 step"), epochs_count=2)
