"""The one rule for names: callbacks, named triggers and events."""

from __future__ import annotations

import re
from typing import Final

__all__ = ["NAME_RULE", "PLACEHOLDER_RE", "is_callback_name", "is_name"]

_NAME_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
#: A name or, for the second unnamed callback of one class and on, ``Name#N`` (N >= 2).
_CALLBACK_NAME_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*(#[1-9][0-9]*)?")

#: A ``{name}`` placeholder in a command argument (``SendStat``): any text but braces.
PLACEHOLDER_RE: Final = re.compile(r"\{([^{}]+)\}")

#: How the rule reads in error messages.
NAME_RULE: Final = "use letters, digits, '_', '-', '.' and start with a letter or '_'"


def is_name(value: object) -> bool:
    """Whether ``value`` is a valid name (``checkpoint``, ``swa_start``, ``val.best-1``)."""
    return isinstance(value, str) and _NAME_RE.fullmatch(value) is not None


def is_callback_name(value: object) -> bool:
    """Whether ``value`` may name a callback: a name, or the ``Name#N`` a schedule gives
    the N-th unnamed callback of one class (so a stored schedule reads back)."""
    return isinstance(value, str) and _CALLBACK_NAME_RE.fullmatch(value) is not None
