"""Event names: where in the loop triggers are evaluated.

The built-in events, in loop order::

    train_start
      epoch_start
        (batch_end)*        # after each micro-batch (only when a trigger names it)
        step_end            # after each optimizer step
      epoch_end
    train_end

Custom events are declared on a schedule and fired by user code with ``fire()``.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["BOUNDED_EVENTS", "BUILTIN_EVENTS", "check_event_name"]

BUILTIN_EVENTS: Final = (
    "train_start",
    "epoch_start",
    "batch_end",
    "step_end",
    "epoch_end",
    "train_end",
)
#: Events frequent enough that the table skips them with a precomputed due vector.
BOUNDED_EVENTS: Final = ("batch_end", "step_end", "epoch_end")

_NAME_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")


def check_event_name(name: object) -> str:
    """Return ``name`` if it is a valid event name, else raise ``ValueError``."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(
            f"invalid event name {name!r}: expected an identifier such as 'train_end' "
            "or a custom event such as 'swa_start'"
        )
    return name
