"""The ``Trainer``'s renamed attributes, kept working for one minor version as moved import
paths are (``schedtrain.compat``).

``TRAINER`` lists the attributes that gave way to another spelling (CHANGELOG.md's
"Renamed names" table lists every renamed public name with its removal release).
``RenamedNames`` is the ``Trainer``'s base: its ``__getattr__`` answers only for those
names, after normal lookup failed, so the aliases add nothing to the ``Trainer``'s
methods and properties; each use warns with a ``DeprecationWarning`` naming the new
spelling. Type checkers do not see it: they keep flagging a mistyped attribute.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from schedtrain.compat import REMOVED_IN
from schedtrain.schedule.firings import FiringLog

__all__ = ["TRAINER", "RenamedNames"]


def _stopped(field: str) -> Callable[[Any], Any]:
    def get(trainer: Any) -> Any:
        stopped = trainer.stopped
        return None if stopped is None else getattr(stopped, field)
    return get


def _config(field: str) -> Callable[[Any], Any]:
    return lambda trainer: getattr(trainer.config, field)


#: Old ``Trainer`` attribute -> (its new spelling, what it reads).
TRAINER: Final[dict[str, tuple[str, Callable[[Any], Any]]]] = {
    "stopped_early": ("trainer.stopped is not None", lambda t: t.stopped is not None),
    "stop_reason": ("trainer.stopped.reason", _stopped("reason")),
    "stop_place": ("trainer.stopped.place", _stopped("place")),
    "firing_log": ("FiringLog(trainer.firings)", lambda t: FiringLog(t.firings)),
    **{name: (f"trainer.config.{name}", _config(name))
       for name in ("max_epochs", "max_steps", "grad_accum", "grad_clip", "seed")},
}


class RenamedNames:
    """The old names of ``TRAINER``, read with a warning naming the new spelling."""

    if not TYPE_CHECKING:  # to a type checker an unknown attribute stays an error
        def __getattr__(self, name: str) -> Any:
            renamed = TRAINER.get(name)
            if renamed is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute "
                                     f"{name!r}")
            spelling, get = renamed
            warnings.warn(f"trainer.{name} is now {spelling}; the old name stops working "
                          f"in {REMOVED_IN}", DeprecationWarning, stacklevel=2)
            return get(self)
