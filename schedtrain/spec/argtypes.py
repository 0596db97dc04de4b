"""A callback class's argument types, checked against the TOML values a spec gives it.

``check --import`` and ``train`` import a ``"package.module:Class"`` callback before
building it; where its ``__init__`` declares plain types (``int``, ``str``, ``list[str]``,
``Literal["a", "b"]``, ``X | None``), a value of another kind is a problem at its key
path (``callbacks.a.k: expected an integer (Cb declares 'k' so), found string 'x'``)
instead of an error from inside the class. Other hints (classes, ``Any``) are not checked.
"""

from __future__ import annotations

import collections.abc
import inspect
import math
import types
import typing
from collections.abc import Callable
from typing import Any, Final

__all__ = ["hints", "mismatch"]


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def hints(cls: type) -> dict[str, Any]:
    """The type hints of ``cls``'s ``__init__`` parameters (those that resolve)."""
    init = next(vars(k)["__init__"] for k in cls.__mro__ if "__init__" in vars(k))
    try:
        raw = inspect.get_annotations(init)
    except Exception:  # not a plain function: nothing to check
        return {}
    out: dict[str, Any] = {}
    for name, written in raw.items():
        hint = written
        if isinstance(written, str):
            # A postponed hint, resolved in the class's module as typing.get_type_hints
            # does (the class's own source, not the spec's); one that does not resolve
            # is not checked.
            try:
                hint = eval(written, getattr(init, "__globals__", {}))
            except Exception:
                continue
        out[name] = hint
    return out


_SIMPLE: Final[dict[type, tuple[str, Callable[[Any], bool]]]] = {
    bool: ("true or false", lambda v: isinstance(v, bool)),
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a number", _is_number),
    str: ("a string", lambda v: isinstance(v, str)),
    list: ("a list", lambda v: isinstance(v, list)),
    tuple: ("a list", lambda v: isinstance(v, list)),
    dict: ("a table", lambda v: isinstance(v, dict)),
}


def mismatch(hint: Any, value: object) -> str | None:
    """What ``hint`` wants when ``value`` (a TOML value) does not fit it; ``None`` when it
    fits or the hint is not one TOML values are checked against (a class, ``Any``)."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        choices = typing.get_args(hint)
        return None if value in choices else " or ".join(repr(c) for c in choices)
    if origin in (typing.Union, types.UnionType):
        wants = [mismatch(h, value) for h in typing.get_args(hint) if h is not type(None)]
        return None if None in wants else " or ".join(dict.fromkeys(w for w in wants if w))
    base = origin or hint
    if isinstance(base, type) and issubclass(base, collections.abc.Mapping):
        base = dict
    elif isinstance(base, type) and issubclass(base, collections.abc.Sequence) \
            and base is not str:
        base = list
    simple = _SIMPLE.get(base) if isinstance(base, type) else None
    if simple is None:
        return None
    return None if simple[1](value) else simple[0]
