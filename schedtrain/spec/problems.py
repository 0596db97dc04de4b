"""Collecting problems while reading a spec: each with its key path, expected and found."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeAlias

import attrs

from schedtrain.errors import Problem, SpecError, describe

__all__ = ["Problems", "Rel", "describe", "key_path", "nesting"]

Rel: TypeAlias = tuple[str | int, ...]
"""A key path as steps: table keys and list indexes (``("callbacks", "a", "trigger")``)."""


def key_path(segs: Sequence[str | int]) -> str:
    """``callbacks.a.trigger.any[1]`` from its steps."""
    out = ""
    for s in segs:
        if isinstance(s, int):
            out += f"[{s}]"
        else:
            out += f".{s}" if out else s
    return out


def nesting(value: object, limit: int) -> int:
    """How many tables and lists deep ``value`` nests (counted up to ``limit + 1``),
    without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list) and depth <= limit + 1:
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict)
                                                  else item))
    return deepest


@attrs.define
class Problems:
    """Problems found so far while reading a spec, in the order found.

    Args:
        file: the spec file, named in each problem.
        imports: whether reading may import user classes (custom triggers).
    """

    file: str | None = None
    imports: bool = False
    items: list[Problem] = attrs.field(factory=list)

    def add(self, where: Rel | str, message: str, *, expected: str | None = None,
            found: object = None) -> None:
        """Record a problem at ``where`` (steps or a path); ``found`` is a TOML value or text."""
        path = where if isinstance(where, str) else key_path(where)
        shown = found if found is None or isinstance(found, str) else describe(found)
        self.items.append(Problem(path, message, self.file, expected=expected, found=shown))

    def expect(self, where: Rel, expected: str, found: object, hint: str = "") -> None:
        """Record ``expected X, found Y`` (with an optional hint after it)."""
        self.add(where, f"expected {expected}, found {describe(found)}{hint}",
                 expected=expected, found=found)

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Problem]:
        return iter(self.items)

    def raise_if_any(self) -> None:
        """Raise ``SpecError`` listing every problem, if there is one."""
        if self.items:
            raise SpecError(list(dict.fromkeys(self.items)))
