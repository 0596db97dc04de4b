"""A user's own trigger class in TOML: ``{ custom = "pkg.module:Class", args = { ... } }``.

The class is imported only when allowed (``schedtrain plan --import``, ``check
--import``, ``train``), and it must be a ``Trigger`` subclass before it is called.
Without the import, the spec still loads and checks; the trigger stays a placeholder
that cannot be simulated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from schedtrain.events import EventSet
from schedtrain.imports import IMPORT_PATH_RE, import_class
from schedtrain.spec.problems import Problems, Rel
from schedtrain.spec.toml_text import toml_value
from schedtrain.time import Timestamp
from schedtrain.triggers import Trigger
from schedtrain.triggers.protocol import Due, Explanation, Node, Point

__all__ = ["CustomTrigger"]

def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


class CustomTrigger(Trigger):
    """A user's trigger class named in TOML, with its arguments; behaves as the instance.

    ``inner`` is the instance once the class was imported, ``None`` before.
    """

    __slots__ = ("args", "inner", "target")

    def __init__(self, target: str, args: Mapping[str, Any], inner: Trigger | None) -> None:
        self.target = target
        self.args = dict(args)
        self.inner = inner

    @classmethod
    def declare(cls, target: str, args: Mapping[str, Any], where: Rel, problems: Problems,
                *, load: bool = False) -> CustomTrigger | None:
        """Check the shape of ``target``; with ``load``, import the class and build it."""
        if not IMPORT_PATH_RE.fullmatch(target):
            problems.add(where, f"invalid import path {target!r}: expected "
                                "'package.module:Class'", expected="'package.module:Class'",
                         found=target)
            return None
        if not load:
            return cls(target, args, None)
        try:
            klass = import_class(target, Trigger, "a trigger class")
        except (ImportError, TypeError) as exc:
            problems.add(where, str(exc), expected="a Trigger subclass", found=target)
            return None
        try:
            inner = klass(**args)
        except Exception as exc:
            problems.add(where, f"{klass.__name__}({', '.join(f'{k}=' for k in args)}...): "
                                f"{type(exc).__name__}: {exc}", found=target)
            return None
        return cls(target, args, inner)

    @property
    def loaded(self) -> bool:
        """Whether the class was imported and built."""
        return self.inner is not None

    def _get(self) -> Trigger:
        if self.inner is None:
            raise RuntimeError(f"custom trigger {self.target!r} was not imported; load the "
                               "spec with imports allowed (schedtrain plan --import)")
        return self.inner

    # Everything is the instance's, once there is one.
    def events(self) -> EventSet:
        return self.inner.events() if self.inner is not None else EventSet(default=True)

    def compile(self) -> Node:
        return self._get().compile()

    def evaluate(self, pt: Point) -> bool | None:
        return self._get().evaluate(pt)

    def bound(self, event: str, last: Timestamp) -> Due:
        return self._get().bound(event, last)

    def explain(self, pt: Point) -> Explanation:
        return self._get().explain(pt)

    @property
    def dynamic(self) -> bool:
        return self.inner.dynamic if self.inner is not None else True

    @property
    def pure(self) -> bool:
        return self.inner.pure if self.inner is not None else False

    def metrics(self) -> frozenset[str]:
        return self.inner.metrics() if self.inner is not None else frozenset()

    def predicates(self) -> frozenset[str]:
        return self.inner.predicates() if self.inner is not None else frozenset()

    def first_possible(self, counter: str, value: float) -> float:
        return self.inner.first_possible(counter, value) if self.inner is not None else value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CustomTrigger):
            return NotImplemented
        return (self.target, _freeze(self.args)) == (other.target, _freeze(other.args))

    def __hash__(self) -> int:
        return hash((self.target, _freeze(self.args)))

    def __repr__(self) -> str:
        if self.inner is not None and type(self.inner).__repr__ is not object.__repr__:
            return repr(self.inner)
        # Without a repr of its own the instance's is an address, another at each run:
        # the spec's own spelling names it instead.
        return toml_value({"custom": self.target, **({"args": self.args} if self.args else {})})
