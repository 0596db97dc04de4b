"""Where a run is in its lifecycle (``training.fit``)."""

from __future__ import annotations

import enum

import attrs

__all__ = ["OWNS_DIRECTORY", "Stage", "Stopped"]


class Stage(enum.Enum):
    """Where a run is in its lifecycle."""

    NEW = "new"  # nothing done: fit starts a fresh run
    RESUMED = "resumed"  # a checkpoint is loaded: fit continues it
    STARTING_OVER = "starting over"  # fit starts again in a directory holding a run
    OPENED = "opened"  # the run directory is this run's
    SET_UP = "set up"  # callbacks are set up
    FITTING = "fitting"  # the loop runs
    ENDED = "ended"  # a fit ended; another fit continues this run


#: The stages in which the run directory is this run's.
OWNS_DIRECTORY = (Stage.OPENED, Stage.SET_UP, Stage.FITTING, Stage.ENDED)


@attrs.frozen
class Stopped:
    """How a ``fit`` stopped early (``trainer.stopped``; ``None`` when it did not).

    Args:
        reason: why (``StopTraining``'s message, ``request_stop``'s reason).
        place: where a callback raised ``StopTraining`` itself (``None``: ``request_stop``,
            or a resumed run that had stopped).
    """

    reason: str
    place: str | None = None
