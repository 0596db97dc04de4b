"""Reading a trigger table by lookups (a spec of thousands of callbacks reads thousands):
the rules the reader states, checked over every pair of keys a table may hold."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from schedtrain.spec.problems import Problems
from schedtrain.spec.references import Graph, Shape, shape_of
from schedtrain.spec.triggers import TriggerReader
from schedtrain.spec.vocabulary import COMPOSITE_KEYS, NAMING_KEYS, TRIGGER_KEYS, owners

#: A value each key of a term reads without a problem of its own.
SAMPLE: dict[str, Any] = {
    "every": "2 steps", "offset": "1 step", "at": "3 steps", "on": "train_end",
    "start": "1 step", "stop": "9 steps", "before_deadline": "10 min",
    "if": "val/loss < 1", "improved": "val/loss", "plateau": "val/loss", "patience": 3,
    "mode": "min", "min_delta": 0.1, "custom": "pkg.mod:Cls", "args": {},
}
TERM_KEYS = [k for k in TRIGGER_KEYS if k not in COMPOSITE_KEYS]


def _problems(table: dict[str, Any]) -> list[tuple[str, str]]:
    problems = Problems("s.toml")
    TriggerReader({}, problems).trigger(table, ("callbacks", "a", "trigger"))
    return [(p.path, p.message) for p in problems]


def test_every_term_key_has_a_sample() -> None:
    assert sorted(SAMPLE) == sorted(TERM_KEYS)


@pytest.mark.parametrize(("a", "b"), list(itertools.combinations_with_replacement(TERM_KEYS, 2)))
def test_a_modifier_needs_a_term_that_owns_it(a: str, b: str) -> None:
    """A key is reported as belonging elsewhere exactly when no term that owns it is
    named in the table (by its naming key, or `stop` for a window)."""
    table = {k: SAMPLE[k] for k in (a, b)}
    named = [k for k in table if k in NAMING_KEYS]
    expected = {k for k in table
                if not any(n in term.keys for term in owners(k) for n in named)}
    reported = {path.rsplit(".", 1)[1] for path, message in _problems(table)
                if " belongs to " in message}
    assert reported == expected


def test_two_terms_sharing_a_modifier_are_refused_once() -> None:
    """`improved` and `plateau` both own `mode`: one table cannot hold both."""
    found = _problems({"improved": "val/loss", "plateau": "val/loss", "patience": 2})
    assert found == [("callbacks.a.trigger.plateau", "`improved` and `plateau` in one table "
                      "would share `mode`; combine two tables with all = [...] or any = [...]")]


@pytest.mark.parametrize("table", [{k: SAMPLE[k]} for k in TERM_KEYS]
                         + [{"every": "2 steps", "all": "named"}, {}])
def test_a_table_without_nested_tables_is_one_table(table: dict[str, Any]) -> None:
    """Without a list under `all`/`any` or a `not`, a table's shape is itself alone,
    and written out it is one table one level deep."""
    shape = shape_of(table, ("callbacks", "a", "trigger"))
    assert shape == Shape(1, 1, ())
    assert Graph({}).written_out(shape) == (1, 1)


def test_nested_and_named_tables_are_counted() -> None:
    """Nested tables and the names they use still count as the general walk counts them."""
    graph = Graph({"t": {"any": [{"every": "1 step"}, {"every": "2 steps"}]}})
    shape = shape_of({"all": [{"every": "3 steps"}, "t"], "not": {"on": "train_end"}},
                     ("callbacks", "a", "trigger"))
    assert (shape.tables, shape.depth, [r.name for r in shape.refs]) == (3, 2, ["t"])
    assert graph.written_out(shape) == (3, 6)
