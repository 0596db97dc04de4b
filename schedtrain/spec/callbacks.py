"""Reading ``[callbacks.NAME]`` tables: the type, its arguments and the trigger.

A built-in's arguments are checked here against its declared parameters (no import,
no torch); a ``"package.module:Class"`` type is checked for shape only until it is
imported (``check --import``, ``train``).
"""

from __future__ import annotations

from typing import Any, Final

from schedtrain.errors import did_you_mean
from schedtrain.retention import policy_problems
from schedtrain.schedule.analysis import Located
from schedtrain.spec import registry
from schedtrain.spec.problems import Problems, nesting
from schedtrain.spec.triggers import TriggerReader
from schedtrain.triggers import MAX_DEPTH

__all__ = ["CALLBACK_KEYS", "read_callback"]

CALLBACK_KEYS: Final = ("type", "trigger")


def _check_type(type_name: object, args: dict[str, Any], name: str, problems: Problems) -> None:
    where = ("callbacks", name, "type")
    if not isinstance(type_name, str):
        problems.expect(where, "a string such as 'ModelSaver' or 'package.module:Class'",
                        type_name)
    elif ":" in type_name:
        if not registry.is_import_path(type_name):
            problems.add(where, f"invalid import path {type_name!r}: expected "
                                "'package.module:Class'", expected="'package.module:Class'",
                         found=type_name)
    elif not registry.is_known(type_name):
        shown = ", ".join(list(registry.BUILTINS)[:4])
        problems.add(where, f"unknown callback type {type_name!r}"
                            f"{did_you_mean(type_name, registry.BUILTINS)}; expected a built-in "
                            f"({shown}, ... {len(registry.BUILTINS)} in all: docs/callbacks.md)"
                            " or 'package.module:Class'",
                     expected="a built-in or 'package.module:Class'", found=type_name)
    else:
        for at, message in registry.check_builtin_arguments(type_name, args):
            problems.add(("callbacks", name, *at), message, found=_at(args, at))


def _too_deep(name: str, args: dict[str, Any], problems: Problems) -> dict[str, Any]:
    """``args`` without the values nesting deeper than ``MAX_DEPTH``, each a problem."""
    kept = {}
    for key, value in args.items():
        if nesting(value, MAX_DEPTH) > MAX_DEPTH:
            problems.add(("callbacks", name, key), f"tables and lists nest more than "
                                                   f"{MAX_DEPTH} levels deep here",
                         expected=f"at most {MAX_DEPTH} levels", found="deeper")
        else:
            kept[key] = value
    return kept


def _at(args: dict[str, Any], where: tuple[str | int, ...]) -> object:
    """The TOML value at ``where`` below a callback's arguments (``None`` if absent)."""
    value: Any = args if where else None
    for step in where:
        try:
            value = value[step]
        except (KeyError, IndexError, TypeError):
            return None
    return value


def read_callback(name: str, table: object, reader: TriggerReader,
                  problems: Problems) -> tuple[str | None, dict[str, Any], Located] | None:
    """``(type, arguments, located trigger)`` of one callback table, or ``None``."""
    rel = ("callbacks", name)
    if not isinstance(table, dict):
        problems.expect(rel, "a table with `type`, `trigger` and arguments", table)
        return None
    start = len(problems.items)
    type_name = table.get("type")
    args = _too_deep(name, {k: v for k, v in table.items() if k not in CALLBACK_KEYS},
                     problems)
    if type_name is not None:
        _check_type(type_name, args, name, problems)
    else:
        # Without a type the callback is bound from Python, so any other key is a typo; but
        # `keep`: which of a host verb's checkpoints to keep (planned; the host applies it).
        if "keep" in args:
            for at, message in policy_problems(args["keep"], (*rel, "keep")):
                problems.add(at, message)
        for key in (k for k in args if k != "keep"):
            problems.add((*rel, key), f"unknown key {key!r}{did_you_mean(key, CALLBACK_KEYS)}; "
                                      "a callback without `type` is bound from Python by its "
                                      "name and takes no arguments here (only `keep`, for a "
                                      "host verb's checkpoints)", found=key)
    located: Located | None = None
    if "trigger" not in table:
        near = [k for k in table if did_you_mean(k, ["trigger"])]
        hint = f" (found {near[0]!r})" if near else ""
        problems.add((*rel, "trigger"), f"missing key 'trigger'{hint}: every callback needs "
                                        "one, e.g. trigger = { every = \"1 epoch\" }",
                     expected="a trigger", found="nothing")
    else:
        located = reader.trigger(table["trigger"], (*rel, "trigger"))
    if len(problems.items) > start or located is None:
        return None
    return (type_name if isinstance(type_name, str) else None), args, located
