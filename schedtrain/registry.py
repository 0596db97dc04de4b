"""Callback types by name: the built-ins, and ``"package.module:Class"`` resolution.

Importing this module imports nothing heavy: built-in names map to import
paths, and a class is imported only by ``resolve()`` (when a schedule runs, or
``schedtrain check --import``), so ``schedtrain check`` works without torch.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Mapping
from typing import Any, Final

from schedtrain.errors import did_you_mean

__all__ = ["BUILTINS", "check_arguments", "is_import_path", "is_known", "resolve"]

#: Built-in callback type name -> ``"module:Class"``.
BUILTINS: Final[Mapping[str, str]] = {
    "ModelSaver": "schedtrain.callbacks.saver:ModelSaver",
    "MinSaver": "schedtrain.callbacks.saver:MinSaver",
    "MaxSaver": "schedtrain.callbacks.saver:MaxSaver",
    "InferenceRunner": "schedtrain.callbacks.inference:InferenceRunner",
    "ScheduledHyperParamSetter": "schedtrain.callbacks.hyperparam:ScheduledHyperParamSetter",
    "EarlyStopping": "schedtrain.callbacks.stopping:EarlyStopping",
    "TerminateOnNaN": "schedtrain.callbacks.stopping:TerminateOnNaN",
    "ProgressBar": "schedtrain.callbacks.progress:ProgressBar",
}

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_IMPORT_PATH_RE: Final = re.compile(rf"^{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*$")

#: Parameters the schedule itself supplies, never written among a callback's arguments.
SUPPLIED: Final = frozenset({"trigger", "name"})


def is_known(name: str) -> bool:
    """Whether ``name`` is a built-in callback type (imports nothing)."""
    return name in BUILTINS


def is_import_path(name: str) -> bool:
    """Whether ``name`` has the shape ``"package.module:Class"`` (imports nothing)."""
    return bool(_IMPORT_PATH_RE.match(name))


def resolve(type_name: str) -> type:
    """Import the class a callback type names.

    Args:
        type_name: a built-in name (``"ModelSaver"``) or ``"package.module:Class"``.

    Raises:
        ValueError: the name is neither a built-in nor an import path.
        ImportError: the module or the class cannot be imported.
        TypeError: the name resolves to something that is not a class.
    """
    target = BUILTINS.get(type_name, type_name)
    if not is_import_path(target):
        raise ValueError(
            f"unknown callback type {type_name!r}{did_you_mean(type_name, BUILTINS)}; "
            f"expected a built-in ({', '.join(BUILTINS)}) or 'package.module:Class'"
        )
    module_name, _, qualname = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise ImportError(f"cannot import {target!r}: {type(exc).__name__}: {exc}") from None
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise ImportError(
                f"cannot import {target!r}: {module_name!r} has no attribute {part!r}"
                f"{did_you_mean(part, names)}"
            ) from None
    if not isinstance(obj, type):
        raise TypeError(f"{target!r} is not a class, it is {type(obj).__name__} {obj!r}")
    return obj


def check_arguments(cls: type, args: Mapping[str, Any]) -> list[tuple[str | None, str]]:
    """Check a callback's TOML arguments against its class's ``__init__`` signature.

    Args:
        cls: the callback class.
        args: the arguments written in the spec (without ``type`` and ``trigger``).

    Returns:
        ``(argument or None, message)`` for each unknown argument and each missing
        required one; empty when the arguments fit.
    """
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):  # builtins without a signature: nothing to check
        return []
    params = sig.parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    accepted = [
        n for n, p in params.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    problems: list[tuple[str | None, str]] = []
    if not takes_any:
        for key in args:
            if key not in accepted:
                choices = [n for n in accepted if n not in SUPPLIED]
                problems.append((key, (
                    f"unknown argument {key!r} for {cls.__name__}{did_you_mean(key, choices)}; "
                    f"it takes {', '.join(choices) or 'no arguments'}")))
    missing = [
        n for n in accepted
        if params[n].default is inspect.Parameter.empty and n not in args and n not in SUPPLIED
    ]
    if missing:
        problems.append((None, (
            f"{cls.__name__} needs the argument{'s' if len(missing) > 1 else ''} "
            f"{', '.join(repr(m) for m in missing)}")))
    return problems
