"""Fix hints for specs that mean something else than they say: an OR written as one
table, a clock counter in a condition. Each hint's own TOML loads and does what was
meant."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from schedtrain import SpecError, simulate
from schedtrain.spec import loads_spec

SHAPE = {"epochs": 4, "steps_per_epoch": 5}


def _refused(trigger: str) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        loads_spec(f"[callbacks.a]\ntrigger = {trigger}\n")
    return {p.path: p.message for p in info.value.problems}


def _steps(trigger: str) -> list[tuple[str, int]]:
    log = simulate(loads_spec(f"[callbacks.a]\ntrigger = {trigger}\n").schedule(), **SHAPE)
    return [(f.event, f.step) for f in log]


#: Trigger keys that hold at one event each: step_end, epoch_end, train_end, train_start.
CLOCKED = ['every = "2 steps"', 'at = ["3 steps", "7 steps"]', 'every = "1 epoch"',
           'at = "2 epochs"', 'on = "train_end"', 'on = "train_start"']
EVENT = {0: "step", 1: "step", 2: "epoch", 3: "epoch", 4: "end", 5: "start"}


@given(st.lists(st.sampled_from(range(len(CLOCKED))), min_size=2, max_size=3, unique=True),
       st.sampled_from(["", 'start = "1 epoch"']))
def test_or_written_as_one_table(picked: list[int], window: str) -> None:
    """Keys of one table at different events are refused with a hint; the hinted table
    loads and fires exactly where any of the keys fires alone (within the window)."""
    keys = [CLOCKED[i] for i in picked]
    # the same event (a real AND, no hint), or a key twice (not TOML): not this property
    assume(len({EVENT[i] for i in picked}) >= 2 and len({k.split()[0] for k in keys}) == len(keys))
    table = "{ " + ", ".join([*keys, *([window] if window else [])]) + " }"
    message = _refused(table)["callbacks.a.trigger"]
    assert "must all hold at once (AND)" in message, message
    hinted = message.partition("to fire at any of them write ")[2]
    alone = {f for k in keys for f in _steps("{ " + ", ".join(filter(None, [k, window])) + " }")}
    assert sorted(set(_steps(hinted)), key=lambda f: (f[1], f[0])) == sorted(
        alone, key=lambda f: (f[1], f[0]))


def test_explicit_all_gets_no_or_hint() -> None:
    """``all = [...]`` says AND on purpose: the never-fires error has no OR hint."""
    message = _refused('{ all = [{ every = "1 epoch" }, { on = "train_end" }] }')[
        "callbacks.a.trigger"]
    assert "it can never fire" in message and "any of them" not in message


def _window_of(message: str) -> tuple[int | None, int | None]:
    start = re.search(r'start = "(\d+) ', message)
    stop = re.search(r'stop = "(\d+) ', message)
    return (int(start[1]) if start else None, int(stop[1]) if stop else None)


@given(st.sampled_from(["step", "epoch", "batch", "sample", "token", "steps"]),
       st.sampled_from(["<", "<=", ">", ">=", "=="]), st.integers(1, 30), st.booleans())
def test_clock_counter_in_condition(counter: str, op: str, n: int, flipped: bool) -> None:
    """A counter compared with a number is refused at the ``if`` key; the hinted window
    holds at exactly the counter values the comparison holds at, and loads."""
    text = f"{n} {dict(zip('<>', '><', strict=True)).get(op[0], op[0])}{op[1:]} {counter}" \
        if flipped else f"{counter} {op} {n}"
    message = _refused(f'{{ every = "1 step", if = "{text}" }}')["callbacks.a.trigger.if"]
    assert f"{counter!r} is a clock counter, not a metric" in message
    start, stop = _window_of(message)
    compare = {"<": int.__lt__, "<=": int.__le__, ">": int.__gt__, ">=": int.__ge__,
               "==": int.__eq__}[op]
    for t in range(n + 5):
        inside = (start is None or start <= t) and (stop is None or t < stop)
        assert inside == compare(t, n), (text, message, t)
    keys = message.partition("write ")[2].partition(" in this trigger table")[0]
    hinted = f'[callbacks.a]\ntrigger = {{ every = "1 step", {keys} }}\n'
    try:
        loads_spec(hinted)
    except SpecError as exc:  # only a window the run never reaches, as the condition
        assert "it can never fire" in str(exc)
        assert not any(compare(t, n) for t in range(1, n + 5))


@pytest.mark.parametrize(("condition", "written"), [
    ("val/loss < 0.5 and epoch > 2", 'start = "3 epochs", if = "val/loss < 0.5"'),
    ("epoch >= 2 and (ok or val/acc >= 0.25) and epoch < 9",
     'start = "2 epochs", stop = "9 epochs", if = "ok or val/acc >= 0.25"'),
    ("epoch > 2 or val/loss < 0.1",
     'any = [{ start = "3 epochs" }, { if = "val/loss < 0.1" }]'),
])
def test_metric_part_is_kept(condition: str, written: str) -> None:
    """The condition's metric part stays in ``if``; the clock part becomes the window."""
    message = _refused(f'{{ every = "1 epoch", if = "{condition}" }}')[
        "callbacks.a.trigger.if"]
    assert f"write {written} in this trigger table" in message, message
    loads_spec(f'[callbacks.a]\ntrigger = {{ every = "1 epoch", {written} }}\n')


def test_counter_under_not_gets_general_advice() -> None:
    """A counter the hint cannot turn into a window is still refused, with the rule."""
    message = _refused('{ every = "1 epoch", if = "not epoch > 2" }')["callbacks.a.trigger.if"]
    assert "start/stop keys" in message


@st.composite
def _conditions(draw: st.DrawFn, depth: int = 3) -> str:
    """Random condition text over metrics, numbers and predicates."""
    operand = st.one_of(st.sampled_from(["val/loss", "acc", "lr"]),
                        st.floats(-1e6, 1e6, allow_nan=False).map(repr))
    if depth == 0 or draw(st.booleans()):
        if draw(st.booleans()):
            return draw(st.sampled_from(["ok", "is_chief"]))
        parts = [draw(st.sampled_from(["val/loss", "acc"]))]
        for _ in range(draw(st.integers(1, 2))):
            parts += [draw(st.sampled_from(["<", "<=", ">", ">=", "==", "!="])), draw(operand)]
        return " ".join(parts)
    kind = draw(st.sampled_from(["and", "or", "not"]))
    if kind == "not":
        return f"not ({draw(_conditions(depth - 1))})"
    terms = [draw(_conditions(depth - 1)) for _ in range(draw(st.integers(2, 3)))]
    return f" {kind} ".join(f"({t})" for t in terms)


@given(_conditions())
def test_unparse_reads_back(text: str) -> None:
    """The condition text a hint writes parses back to the same condition."""
    from schedtrain.spec.hints import unparse
    from schedtrain.triggers.conditions import parse_condition

    tree = parse_condition(text)
    assert parse_condition(unparse(tree)) == tree
