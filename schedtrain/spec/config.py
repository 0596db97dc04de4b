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

from schedtrain.errors import ArgumentError, Problem
from schedtrain.spec.document import check_run, structure
from schedtrain.spec.problems import Problems
from schedtrain.spec.run import RunConfig

__all__ = ["check_config", "run_config"]

_FIELDS = frozenset(a.name for a in attrs.fields(RunConfig))
#: Fields where ``None`` is a value (not given, or "all" for ``keep_firings``).
_NULLABLE = frozenset(a.name for a in attrs.fields(RunConfig) if "None" in str(a.type))
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


def _argument_error(problem: Problem) -> ArgumentError:
    key = problem.path.removeprefix("run.").split(".")[0].split("[")[0]
    where = problem.path.removeprefix("run.")
    return ArgumentError(key, f"`{where}`: {problem.message}", expected=problem.expected,
                         found=problem.found)


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
    config: RunConfig | None = structure(given, RunConfig, ("run",), problems)
    if config is not None:
        nulls: dict[str, Any] = {k: None for k, v in keywords.items()
                                 if v is None and k in _NULLABLE}
        config = attrs.evolve(config, **nulls)
        check_run(config, problems, in_process=True)
    if problems.items or config is None:
        raise _first_of(problems)
    return config


def check_config(config: RunConfig) -> RunConfig:
    """``config`` if it keeps the rules of ``run_config`` (a ``RunConfig`` made directly
    is checked like the keywords).

    Raises:
        ArgumentError: as ``run_config``.
    """
    problems = Problems()
    check_run(config, problems, in_process=True)
    if problems.items:
        raise _first_of(problems)
    return config


def _first_of(problems: Problems) -> ArgumentError:
    first, *rest = problems.items
    error = _argument_error(first)
    for problem in rest:
        error.add_note(str(_argument_error(problem)))
    return error
