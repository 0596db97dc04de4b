"""TOML schedules: loading, errors with key paths, and writing back."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from schedtrain import Schedule, SpecError, Time, Unit
from schedtrain.spec import (
    ClockSpec,
    RunConfig,
    Spec,
    dump_spec,
    load_spec,
    loads_spec,
    schedule_to_toml,
    toml_value,
    trigger_to_toml,
)
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

BAD_SPECS = sorted((Path(__file__).resolve().parents[1] / "bad_specs").glob("*.toml"))

DESIGN_EXAMPLE = """
[clock]
epochs = 10
steps_per_epoch = 100

[triggers.after_warmup]
every = "1 epoch"
start = "2 epochs"

[callbacks.checkpoint]
type = "ModelSaver"
keep = 3
trigger = { every = "500 steps" }

[callbacks.validate]
type = "InferenceRunner"
trigger = { any = [ "after_warmup", { on = "train_end" } ] }

[callbacks.report]
trigger = { every = "100 steps", if = "val/loss < 0.5" }
"""


def problems_of(text: str) -> list[tuple[str, str]]:
    """The (path, message) pairs ``loads_spec`` reports for ``text``."""
    with pytest.raises(SpecError) as info:
        loads_spec(text)
    return [(p.path, p.message) for p in info.value.problems]


class TestLoadsSpec:
    """``loads_spec``: TOML text to a checked ``Spec``."""

    def test_design_example_builds_the_python_schedule(self) -> None:
        """DESIGN §5's example loads to the schedule one would compose in Python."""
        spec = loads_spec(DESIGN_EXAMPLE)
        warm = every("1 epoch") & window(start="2 epochs")
        expected = Schedule({
            "checkpoint": every("500 steps"),
            "validate": warm | on("train_end"),
            "report": every("100 steps") & when("val/loss < 0.5"),
        })
        assert spec.schedule() == expected

    def test_callback_type_and_arguments(self) -> None:
        """``type`` is kept apart from the callback's own arguments."""
        cb = loads_spec(DESIGN_EXAMPLE).callbacks["checkpoint"]
        assert (cb.type, dict(cb.args)) == ("ModelSaver", {"keep": 3})

    def test_untyped_callback_is_bound_by_name(self) -> None:
        """A callback without ``type`` has ``type`` None and no arguments."""
        cb = loads_spec(DESIGN_EXAMPLE).callbacks["report"]
        assert (cb.type, dict(cb.args)) == (None, {})

    def test_callbacks_keep_declared_order(self) -> None:
        """Callbacks appear in the order the file declares them."""
        assert list(loads_spec(DESIGN_EXAMPLE).callbacks) == ["checkpoint", "validate", "report"]

    def test_clock_defaults(self) -> None:
        """``[clock]`` values are read; missing ones are None."""
        clock = loads_spec(DESIGN_EXAMPLE).clock
        assert clock == ClockSpec(epochs=10, steps_per_epoch=100)

    def test_nested_references(self) -> None:
        """Named triggers may reference other named triggers."""
        spec = loads_spec("""
            [triggers.epochly]
            every = "1 epoch"
            [triggers.late]
            all = ["epochly", { start = "5 epochs" }]
            [callbacks.a]
            trigger = { any = ["late", { on = "train_end" }] }
        """)
        assert spec.callbacks["a"].trigger == (
            (every("1 epoch") & window(start="5 epochs")) | on("train_end"))

    def test_keys_in_one_table_are_anded(self) -> None:
        """every, window, condition and metric keys of one table are AND-ed."""
        spec = loads_spec("""
            [callbacks.a.trigger]
            every = "2 epochs"
            offset = "1 epoch"
            start = "3 epochs"
            if = "ok"
            improved = "val/acc"
            mode = "max"
            min_delta = 0.01
        """)
        assert spec.callbacks["a"].trigger == all_of(
            every("2 epochs", offset="1 epoch"), window(start="3 epochs"), when("ok"),
            improved("val/acc", "max", 0.01))

    def test_plateau_and_not(self) -> None:
        """``plateau`` with ``patience`` and ``not`` build the core triggers."""
        spec = loads_spec("""
            [callbacks.a]
            trigger = { every = "1 epoch", not = { plateau = "val/loss", patience = 3 } }
        """)
        assert spec.callbacks["a"].trigger == every("1 epoch") & not_(plateau("val/loss", 3))

    def test_at_accepts_a_single_time_or_a_list(self) -> None:
        """``at`` takes one time or a list, singular or plural units."""
        one = loads_spec('[callbacks.a]\ntrigger = { at = "1 epoch" }').callbacks["a"].trigger
        many = loads_spec('[callbacks.a]\ntrigger = { at = ["1 epoch", "3 epochs"] }')
        assert one == at("1 epochs")
        assert many.callbacks["a"].trigger == at("1 epoch", "3 epoch")

    def test_custom_events(self) -> None:
        """Declared custom events may be named by ``on``."""
        spec = loads_spec('events = ["swa_start"]\n[callbacks.swa]\ntrigger = { on = "swa_start" }')
        assert spec.schedule().events == ("swa_start",)

    def test_run_table(self) -> None:
        """``[run]`` fills ``RunConfig`` with defaults and a run dir named after the file."""
        spec = loads_spec('[run]\ntask = "pkg.tasks:digits"\nmax_epochs = 3\n'
                          '[callbacks.a]\ntrigger = { every = "1 epoch" }', file="x/digits.toml")
        assert spec.run == RunConfig(task="pkg.tasks:digits", max_epochs=3,
                                   run_dir="runs/digits")

    def test_no_run_table(self) -> None:
        """Without ``[run]`` the spec's ``run`` is None."""
        assert loads_spec(DESIGN_EXAMPLE).run is None

    def test_metric_nobody_produces_is_not_an_error(self) -> None:
        """Loading never fails for metrics: metric producers are only known at run time."""
        spec = loads_spec('[callbacks.a]\ntrigger = { every = "1 epoch", if = "x < 1" }')
        assert spec.warnings == ()

    def test_every_problem_is_listed_at_once(self) -> None:
        """Problems in several tables are all reported in one ``SpecError``."""
        found = problems_of("""
            [clock]
            epochs = "ten"
            [callbacks.a]
            trigger = { every = "3 stepz" }
            [callbacks.b]
            type = "ModelSavr"
            trigger = { any = [{ on = "train_end" }, { evry = "1 epoch" }] }
        """)
        assert [p for p, _ in found] == [
            "clock.epochs", "callbacks.a.trigger.every", "callbacks.b.type",
            "callbacks.b.trigger.any[1].evry"]

    def test_file_is_attached_to_problems(self) -> None:
        """Each problem names the file it comes from."""
        with pytest.raises(SpecError) as info:
            loads_spec('[callbacks.a]\ntrigger = { every = "0 steps" }', file="s.toml")
        assert str(info.value).startswith("s.toml: callbacks.a.trigger.every:")

    def test_syntax_error_gives_line_and_column(self) -> None:
        """A TOML syntax error says where it is."""
        (path, message), = problems_of('[callbacks.a]\ntrigger = { every = "1 step" }\noops\n')
        assert path == ""
        assert "line 3, column 5" in message

    def test_named_trigger_problem_reported_once(self) -> None:
        """A broken named trigger used twice is reported once, at its definition."""
        found = problems_of("""
            [triggers.t]
            every = "1 epok"
            [callbacks.a]
            trigger = "t"
            [callbacks.b]
            trigger = "t"
        """)
        assert [p for p, _ in found] == ["triggers.t.every"]


@pytest.mark.parametrize("path", BAD_SPECS, ids=[p.stem for p in BAD_SPECS])
def test_bad_spec(path: Path) -> None:
    """Each malformed spec fails with the expected key path and message fragment."""
    expects = [line.removeprefix("# expect:").split("::")
               for line in path.read_text().splitlines() if line.startswith("# expect:")]
    assert expects, f"{path.name} has no '# expect: path :: fragment' line"
    with pytest.raises(SpecError) as info:
        load_spec(path)
    found = [(p.path, p.message, p.file) for p in info.value.problems]
    for want_path, fragment in expects:
        assert any(p == want_path.strip() and fragment.strip() in m and f == str(path)
                   for p, m, f in found), found


def test_there_are_at_least_thirty_bad_specs() -> None:
    """The malformed-spec corpus covers at least 30 cases."""
    assert len(BAD_SPECS) >= 30


class TestLoadSpec:
    """``load_spec``: reading a file."""

    def test_reads_a_file(self, tmp_path: Path) -> None:
        """A spec file loads, and the spec remembers its path."""
        path = tmp_path / "s.toml"
        path.write_text(DESIGN_EXAMPLE)
        assert load_spec(path).path == str(path)

    def test_missing_file(self, tmp_path: Path) -> None:
        """A missing file is a ``SpecError`` naming it, not an ``OSError``."""
        with pytest.raises(SpecError, match="cannot read the spec: No such file"):
            load_spec(tmp_path / "nope.toml")


class TestTorchFree:
    """The spec loader never imports torch."""

    def test_spec_and_registry_import_without_torch(self) -> None:
        """``schedtrain.spec``, ``registry`` and ``cli`` import with torch unimportable."""
        code = ("import sys; sys.modules['torch'] = None\n"
                "import schedtrain.spec, schedtrain.registry, schedtrain.cli\n"
                "schedtrain.spec.loads_spec('[callbacks.a]\\ntrigger = { every = \"1 step\" }')\n")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=False)
        assert result.returncode == 0, result.stderr


# -- writing TOML ----------------------------------------------------------------------------

UNITS = [Unit.STEP, Unit.EPOCH, Unit.BATCH, Unit.SAMPLE, Unit.TOKEN, Unit.SECOND, Unit.MINUTE]
METRICS = st.sampled_from(["val/loss", "val/acc", "train-loss", "m.x"])


@st.composite
def periodic(draw: st.DrawFn) -> Trigger:
    """``every`` with an optional offset."""
    unit = draw(st.sampled_from(UNITS))
    k = draw(st.integers(1, 10**6 if unit.is_time else 10**9))
    off = draw(st.none() | st.integers(0, 10**6))
    return every(k, unit, offset=off)


@st.composite
def points(draw: st.DrawFn) -> Trigger:
    """``at`` over one or several units."""
    ps = draw(st.lists(st.tuples(st.integers(1, 10**6), st.sampled_from(UNITS)), min_size=1,
                       max_size=4))
    return at(*(Time(v, u) for v, u in ps))


@st.composite
def windows(draw: st.DrawFn) -> Trigger:
    """``window`` with start, stop or both (possibly in two units)."""
    start = draw(st.none() | st.integers(0, 100).map(lambda v: Time(v, Unit.EPOCH)))
    stop = draw(st.none() | st.integers(101, 10**6).map(lambda v: Time(v, Unit.STEP)))
    if start is None and stop is None:
        start = Time(1, Unit.SAMPLE)
    return window(start, stop)


conditions = st.sampled_from(
    ["val/loss < 0.5", "is_chief", "0.1 < val/acc <= 0.9 and not done", "(a or b) and x != 1"]
).map(when)
metric_triggers = st.one_of(
    st.builds(improved, METRICS, st.sampled_from(["min", "max"]),
              st.sampled_from([0.0, 0.001, 1e-05, 2.5])),
    st.builds(plateau, METRICS, st.integers(1, 20), st.sampled_from(["min", "max"]),
              st.sampled_from([0.0, 0.1])),
)
leaves = st.one_of(periodic(), points(), windows(), conditions, metric_triggers,
                   st.sampled_from(["train_start", "epoch_end", "train_end", "swa"]).map(on))
trigger_trees = st.recursive(
    leaves,
    lambda kids: st.one_of(
        st.lists(kids, min_size=2, max_size=3).map(lambda ts: all_of(*ts)),
        st.lists(kids, min_size=2, max_size=3).map(lambda ts: any_of(*ts)),
        kids.map(not_),
    ),
    max_leaves=8,
)


class TestScheduleToToml:
    """``schedule_to_toml``: Python schedules written as TOML that loads back equal."""

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(trigger_trees, min_size=1, max_size=4))
    def test_round_trip(self, triggers: list[Trigger]) -> None:
        """Random trigger trees survive TOML and back unchanged."""
        schedule = Schedule({f"cb{i}": t for i, t in enumerate(triggers)}, events=("swa",))
        text = schedule_to_toml(schedule)
        loaded = _load_unchecked(text)
        assert loaded == schedule, text

    def test_callable_condition_is_refused(self) -> None:
        """``when(callable)`` cannot be written as TOML and says so."""
        schedule = Schedule({"a": every("1 epoch") & when(lambda pt: True)})
        with pytest.raises(ValueError, match="wraps a Python callable"):
            schedule_to_toml(schedule)

    def test_readable_output(self) -> None:
        """An AND of an ``every`` and a window is written as one table."""
        text = schedule_to_toml(Schedule({"v": every("1 epoch") & window(start="2 epochs")}))
        assert text == '[callbacks.v]\ntrigger = { every = "1 epoch", start = "2 epochs" }\n'


def _load_unchecked(text: str) -> Schedule:
    """Load a written schedule; never-firing random trees are fine for a round trip."""
    try:
        return loads_spec(text).schedule()
    except SpecError as exc:
        # The compile check may refuse a random tree that can never fire; the tree must
        # still have been read back, which the error's repr of it shows.
        assert all("can never fire" in p.message for p in exc.problems), exc
        assume(False)
        raise


class TestTriggerToToml:
    """``trigger_to_toml``: one trigger as an inline table."""

    def test_plateau(self) -> None:
        """A plateau trigger writes its metric, patience and mode."""
        assert trigger_to_toml(plateau("val/loss", 3)) == (
            '{ plateau = "val/loss", patience = 3, mode = "min" }')

    def test_not(self) -> None:
        """``not_`` writes a ``not`` table."""
        assert trigger_to_toml(not_(on("train_end"))) == '{ not = { on = "train_end" } }'


class TestDumpSpec:
    """``dump_spec``: a ``Spec`` written back as TOML."""

    def test_round_trip(self) -> None:
        """A loaded spec written and loaded again is equal (named triggers expanded)."""
        spec = loads_spec(DESIGN_EXAMPLE + '\n[run]\ntask = "pkg:build"\n')
        again = loads_spec(dump_spec(spec))
        assert (again.callbacks, again.triggers, again.clock, again.run) == (
            spec.callbacks, spec.triggers, spec.clock, spec.run)

    def test_specs_directory_round_trips(self) -> None:
        """Every shipped spec round-trips through ``dump_spec``."""
        for path in sorted((Path(__file__).resolve().parents[2] / "specs").glob("*.toml")):
            spec = load_spec(path)
            assert loads_spec(dump_spec(spec)).schedule() == spec.schedule(), path


class TestTomlValue:
    """``toml_value``: the emitter for argument values."""

    @settings(max_examples=100, deadline=None)
    @given(st.recursive(
        st.booleans() | st.integers(-(2**63), 2**63 - 1)
        | st.floats(allow_nan=False) | st.text(),
        lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(), kids, max_size=3),
        max_leaves=10))
    @example({"0\n": False})  # a key ending in a newline once passed for a bare key
    def test_values_parse_back(self, value: Any) -> None:
        """Any TOML-representable value is written so that tomllib reads it back."""
        import tomllib

        assert tomllib.loads(f"x = {toml_value(value)}")["x"] == value


# -- fuzzing the loader ----------------------------------------------------------------------

KEYS = st.sampled_from([
    "clock", "run", "events", "triggers", "callbacks", "every", "at", "on", "start", "stop",
    "offset", "if", "improved", "plateau", "patience", "mode", "min_delta", "all", "any",
    "not", "type", "trigger", "epochs", "steps_per_epoch", "task", "device", "a", "evry",
]) | st.text(max_size=6)
SCALARS = (st.integers(-5, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
           | st.booleans() | st.sampled_from([
               "500 steps", "1 epoch", "0 steps", "train_end", "ModelSaver", "x:Y", "a",
               "val/loss < 0.5", "__import__('os')", "min", "max", "3 stepz", "", "-1 h"]))
DOCS = st.recursive(
    SCALARS,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(KEYS, kids, max_size=4),
    max_leaves=25,
)


class TestFuzz:
    """Random TOML-shaped documents never crash the loader."""

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.dictionaries(KEYS, DOCS, max_size=5))
    def test_loads_spec_raises_only_spec_error(self, doc: dict[str, Any]) -> None:
        """Any document either loads or raises ``SpecError`` with located problems."""
        text = "\n".join(f"{toml_value({k: v})[2:-2]}" for k, v in doc.items())
        try:
            spec = loads_spec(text)
        except SpecError as exc:
            assert exc.problems
            assert all(isinstance(p.message, str) and p.message for p in exc.problems)
        else:
            assert isinstance(spec, Spec)

    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.dictionaries(KEYS, DOCS, max_size=4))
    def test_callback_tables(self, table: dict[str, Any]) -> None:
        """Random callback tables give ``SpecError`` paths under ``callbacks.x``."""
        text = "[callbacks.x]\n" + "\n".join(
            f"{toml_value({k: v})[2:-2]}" for k, v in table.items())
        try:
            loads_spec(text)
        except SpecError as exc:
            assert all(re.match(r"^(callbacks\.x|triggers)", p.path) or p.path == ""
                       for p in exc.problems), exc
