"""A ``RunConfig`` from Python's keywords, by the rules a ``[run]`` table is read with.

``Trainer(...)`` calls ``run_config``: each keyword is structured by the spec's strict
converter and range-checked by ``check_run``, so a bad value gets the same words from
Python as from TOML, naming the keyword instead of the key path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from os import PathLike
from typing import Any

import attrs

from schedtrain.spec.document import structure
from schedtrain.spec.problems import Problems
from schedtrain.spec.run import RunConfig, from_checked
from schedtrain.spec.run_check import argument_error, check_run
from schedtrain.spec.run_fields import RunFields

__all__ = ["run_config"]

_FIELDS = frozenset(a.name for a in attrs.fields(RunFields))
#: Fields where ``None`` is a value (not given, or "all" for ``keep_firings``).
_NULLABLE = frozenset(a.name for a in attrs.fields(RunFields) if "None" in str(a.type))
_LISTS = ("sinks", "export", "preempt_signals")
_TABLES = ("reduce", "sink_every", "storage_options")


def _plain(key: str, value: Any) -> Any:
    """A Python value in the form a TOML table holds it (paths as text, sequences as
    lists, mappings as dicts), so one converter reads both."""
    if value is None:
        return None
    if isinstance(value, PathLike):
        return str(value)
    if key in _LISTS and isinstance(value, Iterable) and not isinstance(value, str | bytes):
        return list(value)
    if key in _TABLES and isinstance(value, Mapping):
        return dict(value)
    return value


def run_config(**keywords: Any) -> RunConfig:
    """The checked ``RunConfig`` of ``keywords`` (``RunConfig``'s field names; ``None``
    for a field that cannot be ``None`` means "not given": its default).

    Raises:
        ArgumentError: a value that is not allowed, naming the keyword, what was expected
            and what was found (the first problem; the others are in ``__notes__``).
        TypeError: a keyword that is not an option.
    """
    unknown = sorted(set(keywords) - _FIELDS)
    if unknown:
        raise TypeError(f"unknown run option(s) {', '.join(map(repr, unknown))}; expected "
                        f"{', '.join(sorted(_FIELDS))}")
    given = {k: _plain(k, v) for k, v in keywords.items() if v is not None}
    problems = Problems()
    fields: RunFields | None = structure(given, RunFields, ("run",), problems)
    if fields is not None:
        nulls: dict[str, Any] = {k: None for k, v in keywords.items()
                                 if v is None and k in _NULLABLE}
        fields = attrs.evolve(fields, **nulls)
        check_run(fields, problems, in_process=True)
    if problems.items or fields is None:
        raise argument_error(problems)
    return from_checked(fields)
