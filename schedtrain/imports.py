"""Importing a user's class named as ``"package.module:Class"``, checked before any use."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Any, Final

from schedtrain.errors import did_you_mean

__all__ = ["IMPORT_PATH_RE", "add_user_paths", "import_class"]

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
IMPORT_PATH_RE: Final = re.compile(rf"{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*")


def import_class(target: str, base: type | str, what: str) -> type:
    """Import ``"package.module:Class"`` and check it is a subclass of ``base``.

    Nothing from the module is called: a function, or a class of another kind, is
    refused before any use. ``base`` may itself be named ``"package.module:Class"``: the
    torch-free core names ``Callback`` so, importing it only with the class it checks.

    Raises:
        ImportError: the module or the name cannot be imported.
        TypeError: the name is not a ``base`` subclass.
    """
    obj = _import_object(target)
    if isinstance(base, str):
        base = _import_object(base)
    assert isinstance(base, type)
    if not isinstance(obj, type) or not issubclass(obj, base):
        kind = f"class {obj.__name__}" if isinstance(obj, type) else type(obj).__name__
        raise TypeError(f"{target!r} is not {what} (a subclass of {base.__module__}."
                        f"{base.__qualname__}); it is the {kind}")
    return obj


def _import_object(target: str) -> Any:
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
            raise ImportError(f"cannot import {target!r}: {module_name!r} has no attribute "
                              f"{part!r}{did_you_mean(part, names)}") from None
    return obj


def add_user_paths(spec_file: str | None) -> None:
    """Put where user modules of a spec live on ``sys.path``: the current directory and
    the spec file's parent's parent (``specs/x.toml`` next to ``examples/`` finds
    ``examples.module``). ``train``, ``check --import`` and ``plan --import`` all use this.
    """
    roots = [str(Path.cwd())]
    if spec_file and not spec_file.startswith("<"):
        roots.append(str(Path(spec_file).resolve().parent.parent))
    for root in roots:
        if root not in sys.path:
            sys.path.insert(0, root)
