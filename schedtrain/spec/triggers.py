"""Trigger tables and named references -> triggers located at the keys they were written at.

A trigger value is a table of keys (``TERMS``, AND-ed) or the name of a
``[triggers.NAME]`` entry. Named triggers may reference each other; a name counts as
the table it names, so the nesting limit holds through them, and a cycle, or a trigger
too large written out, is an error (``spec.references`` knows both before anything is
built). Every node of the result carries the key path it came from, so a problem found
later names the place the user wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from schedtrain.errors import did_you_mean
from schedtrain.names import is_name
from schedtrain.schedule.analysis import Located, locate
from schedtrain.spec.hints import clock_condition_hint
from schedtrain.spec.problems import Problems, Rel, key_path
from schedtrain.spec.references import MAX_TABLES, MAX_TOTAL_TABLES, Graph, Shape, shape_of
from schedtrain.spec.vocabulary import (
    COMPOSITE_KEYS,
    NAMING_KEYS,
    TERMS,
    TRIGGER_KEYS,
    describe_key,
)
from schedtrain.time import Time
from schedtrain.triggers import MAX_DEPTH, AllOf, AnyOf, Not
from schedtrain.triggers.conditions import When

__all__ = ["TriggerReader"]

# What `_table` asks of each key, worked out once: a spec of thousands of callbacks reads
# thousands of tables, and scanning every term's keys for each was most of that time.
#: naming key -> the indexes in ``TERMS`` of the terms it names (none for all/any/not)
_NAMES: Final = {k: tuple(i for i, t in enumerate(TERMS) if k in t.keys) for k in NAMING_KEYS}
#: a term's key that is not all/any/not -> the indexes of the terms that own it
_OWNERS: Final = {k: frozenset(i for i, t in enumerate(TERMS) if k in t.keys)
                  for k in TRIGGER_KEYS if k not in COMPOSITE_KEYS}
_KNOWN: Final = frozenset(TRIGGER_KEYS)


def _joined(kind: type[AllOf | AnyOf], parts: list[Located], path: str) -> Located:
    """``all_of``/``any_of`` of located parts, spliced as the core splices them."""
    if len(parts) == 1 and not isinstance(parts[0].trigger, kind):
        return parts[0]  # most tables: one term, nothing to splice
    flat: list[Located] = []
    for p in parts:
        flat.extend(p.children if isinstance(p.trigger, kind) else [p])
    if len(flat) == 1:
        return flat[0]
    return Located(kind(tuple(p.trigger for p in flat)), path, tuple(flat))


def _too_large(rel: Rel, problems: Problems) -> None:
    problems.add(rel, f"this trigger has more than {MAX_TABLES:,} tables with its named "
                      f"triggers written out (each use of a name counts its tables again); at "
                      f"most {MAX_TABLES:,} are allowed", expected=f"at most {MAX_TABLES:,} tables",
                 found=f"more than {MAX_TABLES:,} tables")


class TriggerReader:
    """Reads trigger values of one spec; resolves each named trigger once.

    The reference graph (``spec.references``) is known before anything is built, so a
    name is followed only where the nesting and the size it brings stay in bounds:
    reading recurses at most ``MAX_DEPTH`` levels, and builds each name once.

    Args:
        named: the raw ``[triggers]`` tables by name.
        problems: where problems go.
    """

    def __init__(self, named: Mapping[str, Any], problems: Problems) -> None:
        self.named = named
        self.problems = problems
        self.done: dict[str, Located | None] = {}
        self.graph = Graph(named)
        self._quiet = 0  # names left unread: their problem is reported elsewhere
        self._total = 0  # tables of the callbacks' triggers read so far, written out
        for ref, names in self.graph.cycles:
            shown = names if len(names) <= 8 else (*names[:3], "...", *names[-3:])
            problems.add(ref.rel, f"cyclic trigger reference: {' -> '.join(shown)}"
                                  + (f" ({len(names) - 1} names)" if len(names) > 8 else ""),
                         expected="references without a cycle", found=ref.name)

    def named_trigger(self, name: str) -> Located | None:
        """The located ``[triggers.NAME]`` trigger (``None`` if it has problems)."""
        if name not in self.done:
            self.done[name] = None
            shape = self.graph.shapes[name]
            if name not in self.graph.broken and self._fits(("triggers", name), shape,
                                                            self.graph.written_out(shape)):
                self.done[name] = self.read(self.named[name], ("triggers", name))
        return self.done[name]

    def trigger(self, value: object, rel: Rel) -> Located | None:
        """A callback's trigger value at ``rel``, refused when too large written out,
        alone or with the callbacks' triggers before it."""
        shape = shape_of(value, rel)
        out = self.graph.written_out(shape)
        if not self._fits(rel, shape, out):
            return None
        if out is not None and out[0] <= MAX_DEPTH:
            before, self._total = self._total, self._total + out[1]
            if self._total > MAX_TOTAL_TABLES:
                if before <= MAX_TOTAL_TABLES:
                    self.problems.add(
                        rel, f"the callbacks' triggers up to here have more than "
                             f"{MAX_TOTAL_TABLES:,} tables in all with their named triggers "
                             f"written out; at most {MAX_TOTAL_TABLES:,} are allowed",
                        expected=f"at most {MAX_TOTAL_TABLES:,} tables in all",
                        found=f"{self._total:,} tables")
                return None
        return self.read(value, rel)

    def _fits(self, rel: Rel, shape: Shape, out: tuple[int, int] | None) -> bool:
        """Whether a value of ``shape`` (``out``: its ``Graph.written_out``) stays within
        ``MAX_TABLES`` written out; a problem when it is the first to cross it (a name it
        uses that crosses on its own is reported at that name)."""
        if out is None or out[0] > MAX_DEPTH or out[1] <= MAX_TABLES:
            return True  # too deep is reported where reading first crosses the limit
        if all(self.graph.tables.get(r.name, 0) <= MAX_TABLES for r in shape.refs):
            _too_large(rel, self.problems)
        return False

    def read(self, value: object, rel: Rel, depth: int = 1) -> Located | None:
        """A trigger value at ``rel`` (``depth`` tables deep): a table or a name."""
        if isinstance(value, str):
            return self._reference(value, rel, depth)
        if not isinstance(value, dict):
            self.problems.expect(rel, "a trigger table such as { every = \"500 steps\" } or "
                                      "the name of a [triggers] entry", value)
            return None
        if depth > MAX_DEPTH:
            self.problems.add(rel, f"triggers nest more than {MAX_DEPTH} levels deep here",
                              expected=f"at most {MAX_DEPTH} levels", found="deeper")
            return None
        if not value:
            self.problems.expect(rel, "a trigger table with at least one of "
                                      f"{', '.join(NAMING_KEYS)}", value)
            return None
        return self._table(value, rel, depth)

    def _reference(self, name: str, rel: Rel, depth: int) -> Located | None:
        problems = self.problems
        if not is_name(name):
            hint = ""
            try:
                Time.parse(name)
                hint = f"; to fire periodically write {{ every = {name!r} }}"
            except ValueError:
                pass
            problems.expect(rel, "a trigger table or the name of a [triggers] entry", name,
                            hint)
            return None
        if name not in self.named:
            problems.add(rel, f"unknown trigger {name!r}{did_you_mean(name, self.named)}; a "
                              f"string names a [triggers.{name}] table"
                              + ("" if self.named else " and this spec defines none"),
                         expected="the name of a [triggers] entry", found=name)
            return None
        graph = self.graph
        if name in graph.broken or graph.depth[name] > MAX_DEPTH \
                or graph.tables[name] > MAX_TABLES:
            self._quiet += 1  # reported where the cycle closes or the limit is first crossed
            return None
        levels = depth - 1 + graph.depth[name]
        if levels > MAX_DEPTH:
            problems.add(rel, f"triggers nest {levels} levels deep here with [triggers."
                              f"{name}] written out ({graph.depth[name]} levels itself); at "
                              f"most {MAX_DEPTH} are allowed, through named triggers too",
                         expected=f"at most {MAX_DEPTH} levels", found=f"{levels} levels")
            return None
        got = self.named_trigger(name)
        if got is None:
            self._quiet += 1  # its problems are reported at its definition
        return got

    def _table(self, table: dict[str, Any], rel: Rel, depth: int) -> Located | None:
        problems = self.problems
        start, quiet = len(problems.items), self._quiet
        for key in table:
            if key not in _KNOWN:
                problems.add((*rel, key), f"unknown trigger key {key!r}"
                                          f"{did_you_mean(key, TRIGGER_KEYS)}; expected one of "
                                          f"{', '.join(TRIGGER_KEYS)}",
                             expected="a trigger key", found=key)
        named = {i for key in table for i in _NAMES.get(key, ())}
        active = [TERMS[i] for i in sorted(named)]
        for key in table:
            owners = _OWNERS.get(key)
            if owners is not None and owners.isdisjoint(named):
                owner = describe_key(key)
                add = owner if " or " not in owner else "one of them"
                problems.add((*rel, key), f"`{key}` belongs to {owner}; add {add} or remove "
                                          f"`{key}`", found=key)
        for a, b in ((a, b) for i, a in enumerate(active) for b in active[i + 1:]):
            shared = [k for k in a.keys if k in b.keys]
            if shared:
                problems.add((*rel, b.key), f"`{a.key}` and `{b.key}` in one table would share "
                                            f"`{shared[0]}`; combine two tables with "
                                            "all = [...] or any = [...]", found=b.key)
                return None
        parts: list[Located] = []
        path = key_path(rel)  # rel is never empty: it starts at a callback or a name
        for term in active:
            trigger = term.read(table, rel, problems)
            if isinstance(trigger, When):
                hint = clock_condition_hint(trigger.tree)
                if hint is not None:
                    problems.add((*rel, "if"), hint, expected="a condition on metrics",
                                 found=trigger.text)
                    continue
            if trigger is not None:
                where = next(k for k in term.keys if k in table)
                # One key may build a composition (a window over two units, points in
                # several units): its parts are located under that key.
                parts.append(locate(trigger, f"{path}.{where}"))
        for key in ("all", "any"):
            if key in table:
                part = self._list(table[key], (*rel, key), key, depth)
                if part is not None:
                    parts.append(part)
        if "not" in table:
            inner = self.read(table["not"], (*rel, "not"), depth + 1)
            if inner is not None:
                if isinstance(inner.trigger, Not):  # ~~a is a
                    parts.append(inner.children[0])
                else:
                    parts.append(Located(Not(inner.trigger), f"{path}.not", (inner,)))
        if len(problems.items) > start or self._quiet > quiet:
            return None
        return self._combine(AllOf, parts, rel, path)

    def _list(self, items: object, rel: Rel, key: str, depth: int) -> Located | None:
        if not isinstance(items, list) or not items:
            self.problems.expect(rel, "a non-empty list of triggers", items)
            return None
        kids = [self.read(item, (*rel, i), depth + 1) for i, item in enumerate(items)]
        if any(k is None for k in kids):
            return None
        return self._combine(AllOf if key == "all" else AnyOf,
                             [k for k in kids if k is not None], rel, key_path(rel))

    def _combine(self, kind: type[AllOf | AnyOf], parts: list[Located],
                 rel: Rel, path: str) -> Located | None:
        try:
            return _joined(kind, parts, path)
        except ValueError as exc:  # nesting too deep through named triggers
            self.problems.add(rel, str(exc))
            return None
