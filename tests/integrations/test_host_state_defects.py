"""A host's driver state read back (issue 41): each defect class the host fuzzer found,
refused in one line naming its key path (a ``schedtrain.Error``), never a file outside
the checkpoints folder touched, never a crash later, never a shifted schedule where
Lightning's own counters tell."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from schedtrain import Error, Schedule, every, improved, plateau
from schedtrain.callbacks.stopping import EarlyStopping
from schedtrain.integrations.driver import ScheduleDriver
from schedtrain.integrations.driver_state import DriverStateError
from schedtrain.integrations.hosted import CallbackDriver
from schedtrain.integrations.keeping import HostKeep, load_keeps
from schedtrain.retention import parse_keep
from schedtrain.time import Timestamp


def _keeps() -> dict[str, HostKeep]:
    policy = parse_keep(2)
    assert policy is not None
    keep = HostKeep(policy)
    for step in (3, 6):
        keep.record(f"save-step={step}.ckpt", Timestamp.make(step, step, 0, step, 0, 0, 0), {})
    return {"save": keep}


def _refused(match: str) -> Any:
    return pytest.raises(DriverStateError, match=match)


# -- 1. a keep record naming a path outside the folder ---------------------------------
def test_a_keep_record_naming_a_path_outside_the_folder_deletes_nothing(tmp_path: Path
                                                                        ) -> None:
    folder = tmp_path / "ckpts"
    folder.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("a user's notes\n")
    keeps = _keeps()
    rows = keeps["save"].state()
    for name in ("../outside.txt", str(outside), "a/b.ckpt", "..", ""):
        crafted = copy.deepcopy(rows)
        crafted[0][0] = name
        with _refused(r"keep\.save\[0\]\[0\]: expected one plain file name"):
            load_keeps(keeps, {"save": crafted})
    (folder / "save-step=9.ckpt").write_text("x")
    keeps["save"].record("save-step=9.ckpt", Timestamp.make(9, 9, 0, 9, 0, 0, 0), {})
    keeps["save"].prune(folder, lambda p: p.unlink())
    assert outside.read_text() == "a user's notes\n"


# -- 2, 3. keep records of another shape, or missing -------------------------------------
@pytest.mark.parametrize(("where", "value", "key"), [
    ((), {"x": 1}, r"keep\.save:"),
    ((0,), "fuzz", r"keep\.save\[0\]:"),
    ((0,), [1, 2], r"keep\.save\[0\]:"),
    ((0, 0), 7, r"keep\.save\[0\]\[0\]:"),
    ((0, 0), "x" * 300, r"keep\.save\[0\]\[0\]:"),
    ((0, 0), "a\nb.ckpt", r"keep\.save\[0\]\[0\]:"),
    ((0, 2), "3", r"keep\.save\[0\]\[2\]:"),
    ((0, 2), -1, r"keep\.save\[0\]\[2\]:"),
    ((0, 2), True, r"keep\.save\[0\]\[2\]:"),
    ((0, 8), [], r"keep\.save\[0\]\[8\]:"),
])
def test_a_keep_record_of_another_shape_is_refused_by_key_path(
        where: tuple[int, ...], value: object, key: str) -> None:
    keeps = _keeps()
    rows: Any = keeps["save"].state()
    if not where:
        rows = value
    else:
        parent = rows
        for i in where[:-1]:
            parent = parent[i]
        parent[where[-1]] = value
    before = dict(keeps["save"].saved)
    with _refused(key):
        load_keeps(keeps, {"save": rows})
    assert keeps["save"].saved == before  # nothing restored


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "1", None])
def test_a_kept_value_that_is_no_finite_number_is_refused(value: object) -> None:
    keeps = _keeps()
    rows = keeps["save"].state()
    rows[0][8] = {"loss": value}
    with _refused(r"keep\.save\[0\]\[8\]\.loss:"):
        load_keeps(keeps, {"save": rows})


def test_missing_keep_records_are_refused() -> None:
    with _refused(r"keep\.save: expected the saves"):
        load_keeps(_keeps(), {})
    with _refused(r"keep: expected a table"):
        load_keeps(_keeps(), None)


# -- 4. a hosted callback's state ---------------------------------------------------------
def _hosted() -> tuple[CallbackDriver, dict[str, Any]]:
    def make() -> CallbackDriver:
        return CallbackDriver(Schedule({"early": every("1 step"), "best": improved("loss"),
                                        "calm": plateau("loss", patience=2)}),
                              {"early": EarlyStopping("loss", patience=10)}, record=True)
    d = make()
    d.train_start()
    d.epoch_start()
    for value in (3.0, 2.0, 2.5):
        d.put("loss", value)
        d.step(2)
    return make(), d.state_dict()


@pytest.mark.parametrize(("key", "value"), [
    ("wait", [1]), ("wait", "x"), ("wait", float("inf")), ("wait", -1), ("wait", 11),
    ("best", "x"), ("best", [1.0]),
])
def test_a_hosted_callbacks_damaged_state_is_refused_at_train_start(key: str, value: object
                                                                     ) -> None:
    fresh, state = _hosted()
    state["callbacks"]["early"][key] = value
    fresh.load_state_dict(state)
    with pytest.raises(Error, match=rf"driver state: callbacks\.early\.{key}: expected"):
        fresh.train_start()
    assert fresh.callbacks["early"].state_dict() == {"best": None, "wait": 0}


# -- 5. trigger states ----------------------------------------------------------------------
@pytest.mark.parametrize(("name", "key", "value"), [
    ("best", "best", "x"), ("best", "seen", -1), ("best", "seen", 1.5), ("best", "wait", 1),
    ("calm", "wait", 2), ("calm", "best", {"a": 1}), ("best", "seen", True),
    ("best", "seen", 4),  # more values looked at than the metrics counted
])
def test_a_trigger_state_of_another_type_or_out_of_bounds_is_refused(
        name: str, key: str, value: object) -> None:
    fresh, state = _hosted()
    state["table"]["triggers"][name][key] = value
    with _refused(rf"table\.triggers\.{name}\.{key}: expected"):
        fresh.load_state_dict(state)


# -- 6, 8. missing parts --------------------------------------------------------------------
def test_missing_trigger_states_are_refused_not_read_as_fresh() -> None:
    fresh, state = _hosted()
    del state["table"]["triggers"]
    with _refused(r"table\.triggers: expected the triggers' states, found nothing"):
        fresh.load_state_dict(state)
    fresh, state = _hosted()
    del state["table"]["triggers"]["calm"]
    with _refused(r"table\.triggers\.calm: expected the state this trigger saved"):
        fresh.load_state_dict(state)


def test_missing_top_keys_of_lightnings_state_are_refused() -> None:
    pytest.importorskip("lightning")
    from schedtrain.integrations.lightning import ScheduleCallback

    cb = ScheduleCallback(Schedule({"probe": every("2 steps")}), {"probe": lambda t, m: None})
    state = cb.state_dict()
    for key in ("driver", "last_read", "keep"):
        crafted = {k: v for k, v in state.items() if k != key}
        with _refused(rf"driver state: {key}: expected"):
            cb.load_state_dict(crafted)
    with _refused(r"last_read\.loss: expected a number"):
        cb.load_state_dict({**state, "last_read": {"loss": "x"}})


# -- 7. counters that cannot be the loop's ------------------------------------------------
def test_counters_that_contradict_each_other_are_refused() -> None:
    d = ScheduleDriver(Schedule({"probe": every("2 steps")}))
    d.train_start()
    d.epoch_start()
    d.step(2)
    d.step(2)
    state = d.state_dict()
    bad = copy.deepcopy(state)
    bad["clock"]["now"]["batch"] = 0
    with _refused(r"clock\.now\.batch: expected at least clock\.now\.step"):
        ScheduleDriver(Schedule({"probe": every("2 steps")})).load_state_dict(bad)
    bad = copy.deepcopy(state)
    bad["pending"] = [0, 5, 0]
    with _refused(r"pending\[1\]: expected no samples"):
        ScheduleDriver(Schedule({"probe": every("2 steps")})).load_state_dict(bad)


# -- 9. the key path named inside a part ---------------------------------------------------
@pytest.mark.parametrize(("where", "value", "key"), [
    (("counts", "loss"), -1, r"metrics\.counts\.loss"),
    (("counts", "loss"), True, r"metrics\.counts\.loss"),
    (("history", "loss", 0, 0), "x", r"metrics\.history\.loss\[0\]\[0\]"),
    (("history", "loss", 1, 2), "x", r"metrics\.history\.loss\[1\]\[2\]"),
    (("counts", "loss"), 0, r"metrics\.counts\.loss"),  # fewer than the values kept
])
def test_a_damaged_metric_store_is_refused_by_key_path(
        where: tuple[Any, ...], value: object, key: str) -> None:
    fresh, state = _hosted()
    parent = state["metrics"]
    for k in where[:-1]:
        parent = parent[k]
    parent[where[-1]] = value
    with _refused(rf"driver state: {key}"):
        fresh.load_state_dict(state)


def test_the_latest_values_of_a_plain_driver_are_refused_by_key_path() -> None:
    d = ScheduleDriver(Schedule({"best": improved("loss")}))
    d.train_start()
    d.put("loss", 1.0)
    d.step()
    state = d.state_dict()
    for value, key in ((["x", 1], r"loss\[0\]"), ([1.0, 0], r"loss\[1\]"), (3, "loss")):
        crafted = copy.deepcopy(state)
        crafted["metrics"]["loss"] = value
        with _refused(rf"driver state: metrics\.{key}: expected"):
            ScheduleDriver(Schedule({"best": improved("loss")})).load_state_dict(crafted)


def test_a_state_nested_past_the_cap_is_refused_before_lightning_copies_it() -> None:
    """Lightning deep-copies a callback's state before it reads it: a state nested past
    the cap is refused by key path in one line first (``on_load_checkpoint``), never a
    RecursionError inside Lightning."""
    from schedtrain.integrations.driver_state import MAX_NESTING, DriverStateError, check_nesting

    deep: list[object] = []
    inner = deep
    for _ in range(100_000):
        inner.append([])
        inner = inner[0]  # type: ignore[assignment]
    with pytest.raises(DriverStateError) as err:
        check_nesting({"driver": {"metrics": deep}})
    assert str(err.value).startswith("driver state: driver.metrics[0]")
    assert "\n" not in str(err.value)
    check_nesting({"driver": {"x": [[1]] * 3}, "depth": list(range(MAX_NESTING))})
