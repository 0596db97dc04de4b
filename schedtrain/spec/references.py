"""Named trigger references as a graph: cycles, and how deep and how large each named
trigger is once the names it uses are written out in its place.

Computed once per spec, without recursion, in time linear in the spec's size, so the
reader can refuse a chain of references that nests too deep, a cycle, or a trigger
that references a name twice at every level (``2**64`` tables written out) before it
builds anything. A name counts as the table it names: ``any = ["a"]`` places ``a``'s
table one level below the ``any``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

import attrs

from schedtrain.names import is_name
from schedtrain.spec.problems import Rel
from schedtrain.triggers import MAX_DEPTH

__all__ = ["MAX_TABLES", "MAX_TOTAL_TABLES", "Graph", "Ref", "Shape", "shape_of"]

#: The most trigger tables one trigger may have with its named triggers written out.
MAX_TABLES: Final = 1_000
#: The most trigger tables all callbacks' triggers may have together, written out: the
#: static checks walk each callback's trigger, so this bounds their work.
MAX_TOTAL_TABLES: Final = 20_000


@attrs.frozen
class Ref:
    """A string naming a ``[triggers]`` entry, at ``rel``, at table depth ``depth``."""

    name: str
    rel: Rel
    depth: int


@attrs.frozen
class Shape:
    """A raw trigger value's own tables (count, deepest level) and the names it uses."""

    tables: int
    depth: int
    refs: tuple[Ref, ...]


def _children(value: dict[str, Any], rel: Rel, depth: int) -> Iterator[tuple[object, Rel, int]]:
    for key in ("all", "any"):
        items = value.get(key)
        if isinstance(items, list):
            for i, item in enumerate(items):
                yield item, (*rel, key, i), depth + 1
    if "not" in value:
        yield value["not"], (*rel, "not"), depth + 1


_ONE_TABLE: Final = Shape(1, 1, ())


def shape_of(value: object, rel: Rel) -> Shape:
    """The shape of a raw trigger value at ``rel`` (its own tables, not the names')."""
    if isinstance(value, dict) and "all" not in value and "any" not in value \
            and "not" not in value:
        return _ONE_TABLE  # most triggers: read once per callback, so kept quick
    tables, deepest, refs = 0, 0, []
    stack: list[tuple[object, Rel, int]] = [(value, rel, 1)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, str):
            if is_name(item):
                refs.append(Ref(item, where, depth))
        elif isinstance(item, dict) and depth <= MAX_DEPTH + 1:  # deeper: the reader refuses
            tables += 1
            deepest = max(deepest, depth)
            stack.extend(reversed(list(_children(item, where, depth))))
    return Shape(tables, deepest, tuple(refs))


@attrs.define
class Graph:
    """The ``[triggers]`` entries' references: ``depth`` and ``tables`` of each name
    written out, and the cycles (each found once, at the reference that closes it).

    Args:
        named: the raw ``[triggers]`` tables by name.
    """

    named: Mapping[str, Any]
    shapes: dict[str, Shape] = attrs.field(init=False)
    #: name -> deepest table level with its names written out (root table at 1).
    depth: dict[str, int] = attrs.field(init=False, factory=dict)
    #: name -> its tables with its names written out (capped at ``MAX_TABLES + 1``).
    tables: dict[str, int] = attrs.field(init=False, factory=dict)
    #: ``(reference closing a cycle, the names around it)``, in the order found.
    cycles: list[tuple[Ref, tuple[str, ...]]] = attrs.field(init=False, factory=list)
    #: names in a cycle or reaching one: they have no depth or size.
    broken: set[str] = attrs.field(init=False, factory=set)

    def __attrs_post_init__(self) -> None:
        self.shapes = {n: shape_of(v, ("triggers", n)) for n, v in self.named.items()}
        for name in self.shapes:
            if name not in self.depth and name not in self.broken:
                self._visit(name)

    def _visit(self, root: str) -> None:
        """Depth-first from ``root`` with an explicit stack (no recursion to exhaust)."""
        path: list[str] = [root]
        on_path = {root}
        pending = [iter(self.shapes[root].refs)]
        while pending:
            name = path[-1]
            ref = next(pending[-1], None)
            if ref is None:
                self._finish(name)
                pending.pop()
                on_path.discard(path.pop())
                continue
            if ref.name not in self.shapes or ref.name in self.depth:
                continue
            if ref.name in on_path:
                self.cycles.append((ref, (*path[path.index(ref.name):], ref.name)))
                self.broken.add(ref.name)
            elif ref.name not in self.broken:
                path.append(ref.name)
                on_path.add(ref.name)
                pending.append(iter(self.shapes[ref.name].refs))

    def _finish(self, name: str) -> None:
        shape = self.shapes[name]
        known = [r for r in shape.refs if r.name in self.shapes]
        if name in self.broken or any(r.name in self.broken for r in known):
            self.broken.add(name)
            return
        self.depth[name] = max([shape.depth, *(r.depth - 1 + self.depth[r.name]
                                               for r in known)])
        self.tables[name] = min(MAX_TABLES + 1, shape.tables + sum(self.tables[r.name]
                                                                    for r in known))

    def written_out(self, shape: Shape) -> tuple[int, int] | None:
        """``(depth, tables)`` of a value of ``shape`` with its names written out, or
        ``None`` when it uses a broken name."""
        if not shape.refs:
            return shape.depth, min(MAX_TABLES + 1, shape.tables)
        known = [r for r in shape.refs if r.name in self.shapes]
        if any(r.name in self.broken for r in known):
            return None
        depth = max([shape.depth, *(r.depth - 1 + self.depth[r.name] for r in known)])
        tables = min(MAX_TABLES + 1, shape.tables + sum(self.tables[r.name] for r in known))
        return depth, tables
