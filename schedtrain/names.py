"""The one rule for names: callbacks, named triggers and events."""

from __future__ import annotations

import re
from typing import Final

__all__ = ["NAME_RULE", "PLACEHOLDER_RE", "is_name"]

_NAME_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")

#: A ``{name}`` placeholder in a command argument (``SendStat``): any text but braces.
PLACEHOLDER_RE: Final = re.compile(r"\{([^{}]+)\}")

#: How the rule reads in error messages.
NAME_RULE: Final = "use letters, digits, '_', '-', '.' and start with a letter or '_'"


def is_name(value: object) -> bool:
    """Whether ``value`` is a valid name (``checkpoint``, ``swa_start``, ``val.best-1``)."""
    return isinstance(value, str) and _NAME_RE.fullmatch(value) is not None
