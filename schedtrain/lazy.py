"""A package's public names, loaded from their modules on first use (PEP 562): importing
one module of the package does not import every other that the package names."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["LazyNames"]


class LazyNames:
    """``package``'s names in ``exports`` (name -> the module that defines it), loaded
    into ``namespace`` (the package's ``globals()``) when first read.

    The package sets ``__getattr__`` to :meth:`load` and ``__dir__`` to :meth:`names`;
    ``other`` answers a name that is not an export (an old name that warns), else
    ``AttributeError``.
    """

    def __init__(self, package: str, namespace: dict[str, Any], exports: Mapping[str, str],
                 *, other: Callable[[str], Any] | None = None) -> None:
        self._package, self._namespace, self._exports = package, namespace, exports
        self._other = other

    def load(self, name: str) -> Any:
        """The value of ``name``, imported from its module and kept in the package."""
        module = self._exports.get(name)
        if module is None:
            if self._other is not None:
                return self._other(name)
            raise AttributeError(f"module {self._package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        self._namespace[name] = value  # later lookups skip the package's __getattr__
        return value

    def names(self) -> list[str]:
        """What ``dir(package)`` lists: what it holds and every export."""
        return sorted([*self._namespace, *self._exports])
