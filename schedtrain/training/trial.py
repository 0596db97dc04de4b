"""A checkpoint's run state tried on the run's own parts before a resume trusts it.

The typed records (``run_records``) bound what the loop itself reads. The rest of a
run's state is each part's own: a callback's, a trigger's, a sink's, the generators'.
Each part reads its state back with its own ``load_state_dict``, which knows its shape
best, so the resume tries it: every part's state now is kept, the checkpoint's is
loaded, and the kept one is put back whatever happened. A part that cannot take its
state makes the checkpoint damaged, by key path — before anything is restored, so
``--resume auto`` can still pass it over for the previous one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from schedtrain.checkpoints.rng import rng_state, set_rng_state
from schedtrain.readback import DamagedFile, PartStateError, printable

__all__ = ["GENERATORS", "Stateful", "missing_key", "refusals", "run_trials", "try_states"]


class Stateful(Protocol):
    """A part whose state a checkpoint holds."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


class _Generators:
    """The process's random generators as a part (``set_rng_state`` checks the form)."""

    def state_dict(self) -> Any:
        return rng_state()

    def load_state_dict(self, state: Any) -> None:
        set_rng_state(state)


GENERATORS = _Generators()


def _cause(exc: BaseException) -> str:
    first = (str(exc).splitlines() or [""])[0]
    return printable(f"{type(exc).__name__}: {first}" if first else type(exc).__name__)[:120]


def refusals(trials: Iterator[tuple[str, Stateful, Any]]) -> Iterator[tuple[str, str]]:
    """Load each ``(key path, part, state)`` into its part, then put the part's own state
    back; yields ``(key path, why)`` of each part that refused its state."""
    for key, part, state in trials:
        kept = part.state_dict()
        try:
            part.load_state_dict(state)
        except PartStateError as exc:  # the part named the key inside its state
            yield (f"{key}.{exc.key}" if exc.key else key), printable(exc.reason)
        except Exception as exc:  # the part's own words for what is wrong with its state
            yield key, f"cannot be restored ({_cause(exc)})"
        finally:
            part.load_state_dict(kept)


def try_states(trials: Iterator[tuple[str, Stateful, Any]], shown: Path | str) -> None:
    """``refusals`` of ``trials``, the first raised.

    Raises:
        DamagedFile: a part refused its state (named by key path, with the part's words).
    """
    for key, why in refusals(trials):
        raise DamagedFile(shown, key, why)


def missing_key(mine: Any, saved: Any, where: str = "") -> str | None:
    """The first key path (``.name.0``) of a table in ``mine`` (a part's state now) that
    ``saved`` (the same part's state read back) lacks: a part of the same schedule keeps
    the same tables, and one that loads a state without it starts that part afresh."""
    if not isinstance(mine, Mapping):
        return None
    if not isinstance(saved, Mapping):
        return where or "."
    for key, value in mine.items():
        if key not in saved:
            return f"{where}.{printable(str(key))}"
        gap = missing_key(value, saved[key], f"{where}.{printable(str(key))}")
        if gap is not None:
            return gap
    return None


def run_trials(run: Mapping[str, Any], parts: Mapping[str, Stateful],
               callbacks: Mapping[str, Stateful]) -> Iterator[tuple[str, Stateful, Any]]:
    """The trials of a checkpoint's ``run``: each of ``parts`` (``"clock"``,
    ``"metrics"``...) with its key, each callback of ``callbacks`` it holds a state of,
    and every rank's generators (the run's, the epoch's, the division's)."""
    for key, owner in parts.items():
        if key in run:
            yield f"run.{key}", owner, run[key]
    saved = run.get("callbacks")
    if isinstance(saved, Mapping):
        for name, state in saved.items():
            if name in callbacks:
                yield f"run.callbacks.{printable(str(name))}", callbacks[name], state
    ranks = run.get("ranks")
    each = [("run", run)] if not isinstance(ranks, list | tuple) else [
        (f"run.ranks[{i}]", part) for i, part in enumerate(ranks)]
    for where, part in each:
        if not isinstance(part, Mapping):
            continue
        if part.get("rng") is not None:
            yield f"{where}.rng", GENERATORS, part["rng"]
        position = part.get("data")
        if not isinstance(position, Mapping):
            continue
        if position.get("epoch_rng") is not None:
            yield f"{where}.data.epoch_rng", GENERATORS, position["epoch_rng"]
        split = position.get("split")
        order = split.get("order") if isinstance(split, Mapping) else None
        if isinstance(order, Mapping) and order.get("rng") is not None:
            yield f"{where}.data.split.order.rng", GENERATORS, order["rng"]
