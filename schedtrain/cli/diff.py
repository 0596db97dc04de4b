"""``schedtrain diff OLD NEW``: read each side (a spec, a run directory, a checkpoint by
path or URL) and print ``planning.changes.diff_texts``' report. Exit 0 equal, 1 different,
2 bad input. A run directory or checkpoint compares from its checkpoint's step, as
``--resume auto`` would resume; a checkpoint URL is read with the spec's
``storage_options`` (or the environment's credentials).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs
import tomllib

from schedtrain.cli.preflight import (
    UsageError,
    derived_clock,
    one_process_note,
    processes,
)
from schedtrain.errors import RunDirError, describe
from schedtrain.planning.changes import canonical, diff_texts
from schedtrain.planning.deletions import Present, saved_records
from schedtrain.planning.run_status import read_status
from schedtrain.retention import Policy, parse_keep
from schedtrain.simulation.simclock import RunShape
from schedtrain.spec import Spec, load_spec
from schedtrain.spec.write import dump_spec

__all__ = ["NOT_COMPARED", "Side", "cmd_diff", "read_side"]

#: Said when no run shape is known (``diff``, ``retime``): only the spec's changes shown.
NOT_COMPARED: Final = ("note: firings not compared: give --epochs and --steps-per-epoch, or "
                       "a [clock] in a spec")


@attrs.frozen
class Side:
    """One side of a diff: its whole spec (a spec file) or only its schedule, and for a
    checkpoint where it was taken."""

    name: str
    schedule: str
    full: str | None = None
    spec: Spec | None = None
    step: int | None = None
    phase: str = "step_end"
    #: a checkpoint's callback states (its savers' records of their files), its folder
    states: Any = None
    folder: Path | None = None


def read_side(path: str, options: Mapping[str, Any] | None = None, *,
              do_import: bool = False) -> Side:
    """Read a spec file, a run directory (its newest valid checkpoint, else the one
    ``run.json`` names, else ``run.json``'s schedule) or a checkpoint (a ``.pt`` file, a
    sharded ``.dcp`` directory, or a URL of either or of a checkpoint folder, read with
    ``options``).

    Raises:
        UsageError: nothing there holds a schedule.
        SpecError: a spec file with problems.
    """
    from schedtrain.urls import is_url

    if is_url(path):
        return _url(path, options)
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{path}: no such spec, run directory or checkpoint")
    if p.is_file() and p.suffix == ".toml":
        # A schedule-only file (no [run]) is judged as a schedule: its run is the job's.
        spec = load_spec(p, imports=do_import, schedule_only=True)
        schedule = canonical(spec.schedule())
        assert schedule is not None  # a spec's triggers all have a TOML form
        raw = tomllib.loads(p.read_text(encoding="utf-8")).get("run", {})
        shown = spec
        if spec.run is not None and "run_dir" not in raw:  # the default comes from the
            shown = attrs.evolve(spec, run=attrs.evolve(spec.run, run_dir=None))  # name
        return Side(path, schedule, dump_spec(shown), spec)
    if p.is_dir() and not (p / "run.pt").exists():
        return _run_dir(path, p, options)
    return _checkpoint(path, p)


def _run_dir(path: str, p: Path, options: Mapping[str, Any] | None) -> Side:
    from schedtrain.checkpoints.files import NAME_RE
    from schedtrain.checkpoints.store import newest_valid
    from schedtrain.urls import is_url

    found = newest_valid(p / "checkpoints") if (p / "checkpoints").is_dir() else None
    if found is not None:
        side = _checkpoint(str(found), found)
        return attrs.evolve(side, name=f"{path} ({found.name})")
    try:  # never blocks (a FIFO is refused), every field checked (RunStatus)
        status = read_status(p)
    except RunDirError as exc:
        raise UsageError(str(exc)) from None
    named = status.checkpoint if status is not None else None
    if named is not None and is_url(named):  # the checkpoints are in a bucket
        with contextlib.suppress(UsageError):  # unreadable: run.json's copy, below
            return attrs.evolve(_url(named, options), name=f"{path} ({named})")
    text = status.schedule if status is not None else None
    if text is None:
        raise UsageError(f"{path}: a run directory without a stored schedule (no valid "
                         "checkpoint, and run.json has none: written by an earlier version?)")
    # Where --resume auto would resume: the checkpoint run.json names, by its name.
    m = NAME_RE.fullmatch(named.rsplit("/", 1)[-1]) if named is not None else None
    return Side(path, text, step=int(m[1]) if m is not None else None)


def _url(url: str, options: Mapping[str, Any] | None) -> Side:
    """A checkpoint (or the newest valid one of a checkpoint folder) in object storage."""
    from schedtrain.checkpoints.files import NAME_RE
    from schedtrain.checkpoints.format import CheckpointError
    from schedtrain.checkpoints.storage import open_storage
    from schedtrain.checkpoints.store import read_stored, stored_newest_valid

    folder, _, name = url.rstrip("/").rpartition("/")
    try:
        if NAME_RE.fullmatch(name) is None:  # a folder of checkpoints
            storage = open_storage(url.rstrip("/"), options)
            found = stored_newest_valid(storage, Path("checkpoints"))
            if found is None:
                raise UsageError(f"{url}: no valid checkpoint there")
            name = found.name
        else:
            storage = open_storage(folder, options)
        state = read_stored(storage, name)
    except CheckpointError as exc:
        raise UsageError(f"{url}: {exc.reason}") from None
    return _side_of(storage.url(name), state)


def _checkpoint(path: str, p: Path) -> Side:
    from schedtrain.checkpoints.format import CheckpointError
    from schedtrain.checkpoints.store import read_checkpoint

    try:
        state = read_checkpoint(p)
    except CheckpointError as exc:
        raise UsageError(f"{path}: {exc.reason}") from None
    return _side_of(path, state, p.parent)


def _side_of(path: str, state: Mapping[str, Any], folder: Path | None = None) -> Side:
    """A checkpoint's side of the diff; ``folder``: where its files are on this disk
    (``None`` for one in object storage: which files are there is not looked up)."""
    run = state.get("run", {})
    text = run.get("schedule")
    if not isinstance(text, str):
        why = ("a Python trigger (when(fn)) has no stored form" if "schedule" in run
               and run["schedule"] is None else "written by an earlier version"
               if "schedule" not in run else f"found {describe(run['schedule'])}")
        raise UsageError(f"{path}: the checkpoint holds no schedule ({why})")
    phase = "step_end" if run.get("epoch_open", True) else "epoch_end"
    return Side(path, text, step=int(state["step"]), phase=phase,
                states=run.get("callbacks"), folder=folder)


def _shape(args: argparse.Namespace, old: Side, new: Side) -> RunShape | None:
    """The run to simulate: the options, over NEW's ``[clock]`` (or OLD's), completed
    from its ``[run]`` (with ``--import``, its steps per epoch counted as ``plan``'s)."""
    counts = getattr(args, "do_import", False)  # retime's args have neither option
    given = getattr(args, "nproc", None)
    if given is not None and not counts:
        raise UsageError("--nproc divides the steps per epoch counted from a spec's [run] "
                         "task: give --import too")
    nproc = processes(given) if counts else None
    for side in (new, old):
        if side.spec is None:
            continue
        spec, _ = derived_clock(side.spec, counts, nproc=nproc)
        one_process_note(side.name, side.spec, nproc, counts)
        try:
            shape = spec.clock.shape(epochs=args.epochs, steps_per_epoch=args.steps_per_epoch)
        except ValueError as exc:
            raise UsageError(f"{side.name}: {exc}") from None
        if shape is not None:
            return shape
    if args.epochs is not None and args.steps_per_epoch is not None:
        return RunShape.build(epochs=args.epochs, steps_per_epoch=args.steps_per_epoch)
    return None


def _savers(side: Side) -> dict[str, Policy | None]:
    """The ``keep`` of each ``ModelSaver`` of a spec (a bad one: not followed)."""
    out: dict[str, Policy | None] = {}
    for name, cb in (side.spec.callbacks.items() if side.spec is not None else ()):
        if cb.type == "ModelSaver":
            try:
                out[name] = parse_keep(cb.args.get("keep", 3))
            except ValueError:
                continue
    return out


def _present(side: Side) -> Present | None:
    """Which files of a local checkpoint's folder are there (``ModelSaver``'s default
    folder; ``None``: not known here)."""
    folder = side.folder
    if folder is None:
        return None
    return lambda _saver, names: {n for n in names if (folder / n).exists()}


def cmd_diff(args: argparse.Namespace) -> int:
    """The ``diff`` command; its exit code."""
    do_import = getattr(args, "do_import", False)
    new = read_side(args.new, do_import=do_import)
    # A checkpoint URL is read with the storage options of the spec beside it.
    options = new.spec.run.storage_options if new.spec is not None and \
        new.spec.run is not None else None
    old = read_side(args.old, options, do_import=do_import)
    both_specs = old.full is not None and new.full is not None
    a = old.full if both_specs and old.full is not None else old.schedule
    b = new.full if both_specs and new.full is not None else new.schedule
    shape = _shape(args, old, new)
    start = args.from_step if args.from_step is not None else old.step
    phase = old.phase if args.from_step is None else "step_end"
    if shape is None:
        print(NOT_COMPARED, file=sys.stderr)
    keep = _savers(new)
    diff = diff_texts(a, b, shape=shape, from_step=start, phase=phase,
                      files=(args.old, args.new), keep=keep,
                      saved=saved_records(old.states, keep) if start == old.step else {},
                      present=_present(old))
    out: Any = (json.dumps(diff.to_dict(), indent=1) + "\n" if args.format == "json"
                else diff.table(args.first))
    sys.stdout.write(out)
    return 0 if diff.equal else 1
