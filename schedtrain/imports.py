"""Importing a user's class named as ``"package.module:Class"``, checked before any use."""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
from pathlib import Path
from typing import Any, Final

from schedtrain.errors import did_you_mean

__all__ = ["IMPORT_PATH_RE", "add_user_paths", "import_class", "import_module", "user_roots"]

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
        obj: Any = import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"cannot import {target!r}: {exc}") from None
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise ImportError(f"cannot import {target!r}: {module_name!r} has no attribute "
                              f"{part!r}{did_you_mean(part, names)}") from None
    return obj


#: Where ``add_user_paths`` looked last, with what each folder is, in lookup order.
_looked: list[tuple[Path, str]] = []


def user_roots(spec_file: str | None) -> list[tuple[Path, str]]:
    """Where user modules of a spec are looked up, first first, with what each folder is:
    the spec file's folder, its parent (``specs/x.toml`` next to ``examples/`` finds
    ``examples.module``), then the current directory."""
    roots: list[tuple[Path, str]] = []
    if spec_file and not spec_file.startswith("<"):
        folder = Path(spec_file).resolve().parent
        roots += [(folder, "the spec's folder"), (folder.parent, "its parent")]
    roots.append((Path.cwd(), "the current directory"))
    unique: dict[Path, str] = {}
    for path, what in roots:
        unique.setdefault(path, what)
    return list(unique.items())


def add_user_paths(spec_file: str | None) -> None:
    """Put where user modules of a spec live (``user_roots``) on ``sys.path``, those not
    there yet first, in lookup order. ``train``, ``check --import`` and ``plan --import``
    all use this."""
    roots = user_roots(spec_file)
    for root, _ in reversed(roots):
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
    _looked[:] = roots


def import_module(name: str) -> Any:
    """Import module ``name``; when it is not found, say where it was looked for and the
    closest name that exists there.

    Raises:
        ImportError: the module is not found (or importing it raised: its error, named).
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing != name and not name.startswith(missing + "."):
            raise ImportError(f"importing {name!r} raised {type(exc).__name__}: {exc}") from None
        raise ImportError(_not_found(missing)) from None
    except Exception as exc:  # the module's own code failed
        raise ImportError(f"importing {name!r} raised {type(exc).__name__}: {exc}") from None


def _not_found(missing: str) -> str:
    parent = missing.rpartition(".")[0]
    if parent:  # the package exists (Python imported it first): look inside it
        package = sys.modules.get(parent)
        paths = list(getattr(package, "__path__", []))
        names = [f"{parent}.{m.name}" for m in pkgutil.iter_modules(paths)]
        where = f"in package {parent!r} ({', '.join(paths)})"
    else:
        roots = _looked or user_roots(None)
        names = [m.name for m in pkgutil.iter_modules([str(p) for p, _ in roots])]
        # The spec's folder and its parent are named by what they are (the spec's path
        # heads the line): the line stays within its 300 characters.
        where = ("in " + ", ".join(f"{p} ({what})" if what == "the current directory"
                                   else what for p, what in roots)
                 + " and the installed packages")
    return f"no module named {missing!r}{did_you_mean(missing, names)}; looked {where}"
