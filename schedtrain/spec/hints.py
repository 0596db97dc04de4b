"""Fix hints for specs that say something other than what was surely meant.

* Keys of one trigger table are AND-ed; keys naming different events
  (``{ every = "1 epoch", on = "train_end" }``) can never hold at once: the hint writes
  the table with ``any = [...]``.
* A condition compares metrics; a clock counter in it (``if = "epoch >= 3"``) is not a
  metric: the hint writes the window (``start = "3 epochs"``) that restricts the clock,
  and the condition that remains.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Final

import attrs

from schedtrain.schedule.analysis import Analysis, Located
from schedtrain.spec.write import toml_value, trigger_table
from schedtrain.triggers import AllOf
from schedtrain.triggers.conditions import BoolOp, Compare, Condition, PredicateRef

__all__ = ["CLOCK_NAMES", "and_table_hint", "clock_condition_hint", "unparse", "with_hints"]

#: Names of the clock's counters as a user may write them in a condition, and the
#: unit a window on that counter is written in.
CLOCK_NAMES: Final = {
    "step": "steps", "steps": "steps", "batch": "batches", "batches": "batches",
    "epoch": "epochs", "epochs": "epochs", "sample": "samples", "samples": "samples",
    "token": "tokens", "tokens": "tokens", "seconds": "s", "time": "s",
}
#: ``counter OP n`` as a window: (key, offset added to n); ``>`` on a count is ``>= n + 1``.
_WINDOW: Final = {">=": (("start", 0),), ">": (("start", 1),), "<": (("stop", 0),),
                  "<=": (("stop", 1),), "==": (("start", 0), ("stop", 1))}
_FLIP: Final = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


def with_hints(analysis: Analysis, roots: Iterable[Located]) -> Analysis:
    """``analysis`` with the fix hint of each trigger table a problem or note is about
    (``and_table_hint``) added to its message."""
    nodes = {n.path: n for root in roots for n in root.walk()}

    def hint(path: str) -> str:
        node = nodes.get(path)
        found = and_table_hint(node) if node is not None else None
        return f"; {found}" if found else ""

    problems = tuple(attrs.evolve(p, message=p.message + hint(p.path))
                     for p in analysis.problems)
    notes = tuple(n + hint(n.partition(": ")[0]) for n in analysis.notes)
    return attrs.evolve(analysis, problems=problems, notes=notes)


def and_table_hint(node: Located) -> str | None:
    """For one trigger table whose keys name different events (so their AND is never
    true), the table written with ``any``; ``None`` for anything else."""
    t = node.trigger
    if not isinstance(t, AllOf) or not t.events().empty:
        return None
    prefix = node.path + "."
    if not all(c.path.startswith(prefix) and c.path[len(prefix):].isidentifier()
               for c in node.children):
        return None  # an explicit `all = [...]` says AND on purpose
    clocked = [c.trigger for c in node.children if not c.trigger.events().default]
    rest = [c.trigger for c in node.children if c.trigger.events().default]
    if len(clocked) < 2:
        return None
    table: dict[str, Any] = {}
    for r in rest:
        table.update(trigger_table(r))
    table["any"] = [trigger_table(c) for c in clocked]
    keys = ", ".join(f"`{c.path[len(prefix):]}`" for c in node.children
                     if not c.trigger.events().default)
    return (f"the keys of one trigger table must all hold at once (AND), and {keys} hold at "
            f"different events; to fire at any of them write {toml_value(table)}")


def clock_condition_hint(tree: Condition) -> str | None:
    """For a condition naming a clock counter, how to write it with a window; ``None``
    when it names none."""
    named = sorted({o for n in _walk(tree) if isinstance(n, Compare)
                    for o in n.operands if isinstance(o, str) and o in CLOCK_NAMES})
    if not named:
        return None
    what = (f"{named[0]!r} is a clock counter, not a metric" if len(named) == 1 else
            f"{', '.join(map(repr, named))} are clock counters, not metrics")
    head = f"{what}: a condition compares metrics, a window (start <= t < stop) restricts the clock"
    if isinstance(tree, BoolOp) and tree.op == "or":
        tables = [_as_table(t) for t in tree.terms]
        if all(t is not None for t in tables):
            return (f"{head}; write any = {toml_value(tables)} in this trigger table in place "
                    "of `if`")
    else:
        table = _as_table(tree)
        if table is not None:
            keys = ", ".join(f"{k} = {toml_value(v)}" for k, v in table.items())
            return f"{head}; write {keys} in this trigger table in place of `if`"
    return (f"{head}; write the clock part as start/stop keys of trigger tables (combined "
            "with any/all/not), and only metrics in `if`")


def _as_table(tree: Condition) -> dict[str, str] | None:
    """A conjunction of counter comparisons and metric terms as trigger table keys
    (``start``, ``stop``, ``if``); ``None`` when it cannot be written so."""
    terms = list(tree.terms) if isinstance(tree, BoolOp) and tree.op == "and" else [tree]
    window: dict[str, str] = {}
    kept: list[Condition] = []
    for term in terms:
        got = _as_window(term)
        if got is None and _names_clock(term):
            return None
        if got is None:
            kept.append(term)
        elif window.keys() & got.keys():
            return None
        else:
            window.update(got)
    table: dict[str, str] = {k: window[k] for k in ("start", "stop") if k in window}
    if kept:
        table["if"] = unparse(kept[0] if len(kept) == 1 else BoolOp("and", tuple(kept)))
    return table


def _as_window(term: Condition) -> dict[str, str] | None:
    """``counter OP number`` (either side, or chained) as window keys, else ``None``."""
    if not isinstance(term, Compare):
        return None
    out: dict[str, str] = {}
    for i, written in enumerate(term.ops):
        a, b, op = term.operands[i], term.operands[i + 1], written
        if isinstance(a, float) and isinstance(b, str):
            a, b, op = b, a, _FLIP[op]
        if not (isinstance(a, str) and a in CLOCK_NAMES and isinstance(b, float)):
            return None
        unit = CLOCK_NAMES[a]
        if op not in _WINDOW or (unit != "s" and not b.is_integer()) or not math.isfinite(b):
            return None
        for key, extra in _WINDOW[op]:
            value = b + (extra if unit != "s" else 0)
            if key in out or value < 0:
                return None
            out[key] = f"{_number(value)} {unit}"
    return out


def _names_clock(term: Condition) -> bool:
    return any(isinstance(n, Compare) and any(o in CLOCK_NAMES for o in n.operands
                                               if isinstance(o, str)) for n in _walk(term))


def _number(value: float) -> str:
    """``3`` for 3.0, ``0.1`` for 0.1: text that reads back as the same number."""
    return str(int(value)) if value.is_integer() and abs(value) < 2**63 else repr(value)


def _walk(node: Condition) -> list[Condition]:
    out: list[Condition] = [node]
    if isinstance(node, BoolOp):
        for t in node.terms:
            out += _walk(t)
    return out


def unparse(node: Condition) -> str:
    """Condition text that parses back to ``node``."""
    if isinstance(node, PredicateRef):
        return node.name
    if isinstance(node, Compare):
        parts = [_number(o) if isinstance(o, float) else o for o in node.operands]
        return " ".join(x for i, p in enumerate(parts)
                        for x in ([p] if i == 0 else [node.ops[i - 1], p]))
    if node.op == "not":
        return f"not {_grouped(node.terms[0])}"
    return f" {node.op} ".join(_grouped(t) for t in node.terms)


def _grouped(node: Condition) -> str:
    return f"({unparse(node)})" if isinstance(node, BoolOp) and node.op != "not" else unparse(node)
