"""The main job: train from a loaded spec (``schedtrain train SPEC``).

All glue between the spec (``schedtrain.spec.Spec``) and the ``Trainer`` lives
here. The task is ``[run] task = "module:function"``; the module is looked up in the spec
file's folder, its parent (so ``specs/digits.toml`` next to ``examples/`` finds
``examples.digits:make_task``) and the current directory, then among installed
packages. The function takes no arguments and returns a ``Task``.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch

from schedtrain.checkpoints import CheckpointError, newest_valid
from schedtrain.checkpoints.storage import open_storage
from schedtrain.checkpoints.store import stored_newest_valid
from schedtrain.errors import Problem, ScheduleWarning, SpecError, did_you_mean
from schedtrain.imports import add_user_paths, import_module
from schedtrain.logs import get_logger
from schedtrain.monitors.cadence import build_sinks
from schedtrain.spec.metrics import metric_problems
from schedtrain.spec.model import Spec
from schedtrain.spec.readiness import train_problems
from schedtrain.training.binding import Bound, bind, order_problems, produced_metrics
from schedtrain.training.run_dir import RunDirectory

if TYPE_CHECKING:
    from schedtrain.training.trainer import Trainer

__all__ = [
    "Prepared",
    "Task",
    "build_callbacks",
    "count_steps_per_epoch",
    "interrupted_line",
    "load_task",
    "porting_notes",
    "prepare_run",
    "run_dir_of",
    "train_from_spec",
]

_log = get_logger("schedtrain.training")


@attrs.define
class Task:
    """What a task factory returns: the model, its optimizer, data and loss.

    Args:
        model: the module to train.
        optimizer: its optimizer.
        train_data: training batches (e.g. a ``DataLoader``).
        val_data: validation batches for ``InferenceRunner`` (optional).
        loss_fn: ``loss_fn(outputs, targets)`` (or give ``step_fn``).
        step_fn: ``step_fn(model, batch)`` returning the loss or ``{"loss": ...}``.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    train_data: Iterable[Any]
    val_data: Iterable[Any] | None = None
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None
    step_fn: Callable[[torch.nn.Module, Any], Any] | None = None


def _problem(spec: Any, path: str, message: str) -> SpecError:
    return SpecError([Problem(path, message, getattr(spec, "path", None))])


def load_task(spec: Any, target: str) -> Task:
    """Import and call the ``"module:function"`` task factory."""
    module_name, _, func_name = target.partition(":")
    if not module_name or not func_name:
        raise _problem(spec, "run.task", f"expected 'module:function', got {target!r}")
    if module_name.partition(".")[0] in sys.stdlib_module_names:
        # Never call into the standard library: `sys:exit` ends the run with exit 0 having
        # trained nothing, `os:system` runs a shell.
        raise _problem(spec, "run.task", f"{target!r} is in Python's standard library, not "
                       "a task factory: give 'module:function' of your own code, whose "
                       "function returns a schedtrain.training.Task")
    add_user_paths(getattr(spec, "path", None))
    try:
        module = import_module(module_name)
    except ImportError as exc:
        raise _problem(spec, "run.task", f"cannot import {module_name!r}: {exc}") from None
    factory = getattr(module, func_name, None)
    if not callable(factory):
        names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        raise _problem(spec, "run.task", f"{module_name!r} has no function {func_name!r}"
                       f"{did_you_mean(func_name, names)}")
    try:
        task = factory()
    except SystemExit as exc:  # the factory's exit is not the run's: nothing was trained
        raise _problem(spec, "run.task", f"task factory {target!r} exited (SystemExit("
                       f"{exc.code!r})) instead of returning a schedtrain.training.Task"
                       ) from None
    if not isinstance(task, Task):
        raise _problem(spec, "run.task", f"task factory {target!r} must return a "
                       f"schedtrain.training.Task, got {type(task).__name__}")
    return task


def count_steps_per_epoch(spec: Spec, task: Task | None = None,
                          nproc: int = 1) -> int | None:
    """Optimizer steps per epoch of ``spec``'s task on each of ``nproc`` processes: its
    training data's length, on several divided as the run divides it (``[run]
    shard_data``: a ``DistributedSampler``), over ``[run] grad_accum`` (``None`` without
    a task, or data without a length). Without ``task`` this builds the task (seeded as
    ``train`` seeds it)."""
    from schedtrain.training.data_position import seed_everything

    run = spec.run
    if run is None or not run.task:
        return None
    if task is None:
        seed_everything(run.seed)
        task = load_task(spec, run.task)
    data = task.train_data
    if nproc > 1 and run.shard_data:
        from schedtrain.distributed.wrap import rank_loader

        data = rank_loader(data, nproc, 0, run.seed)  # every rank takes as many batches
    try:
        n = len(data)  # type: ignore[arg-type]
    except TypeError:
        return None
    return -(-n // run.grad_accum)


def build_callbacks(spec: Spec, *, untyped_ok: bool = False) -> dict[str, Any]:
    """Instantiate every typed callback of ``spec``; every problem is listed.

    Args:
        spec: a loaded spec.
        untyped_ok: leave callbacks without a ``type`` out (Python binds them) instead
            of refusing them, as ``train`` does.
    """
    problems: list[Problem] = [] if untyped_ok else [
        p for p in train_problems(spec) if p.path.startswith("callbacks.")]
    if problems:
        raise SpecError(problems)
    classes = spec.callback_classes()  # imports, checks arguments; raises SpecError
    out: dict[str, Any] = {}
    for name, cls in classes.items():
        try:
            out[name] = cls(**dict(spec.callbacks[name].args))
        except (TypeError, ValueError) as exc:
            problems.append(Problem(f"callbacks.{name}", f"{cls.__name__}: {exc}", spec.path))
    if problems:
        raise SpecError(problems)
    return out


@attrs.frozen
class Prepared:
    """What ``prepare_run`` built and checked: the callbacks, the bound schedule, and the
    task (built last, after seeding).

    Args:
        bindings: callback name -> the built callback, in declared order.
        task: the task, or ``None`` when not asked for.
        notes: warnings about the spec, one sentence each.
        bound: the schedule bound to ``bindings``, order-checked, with the metrics
            produced and the seed applied before the task was built; the ``Trainer``
            reuses it (``Trainer(prepared=...)``), so nothing is bound or seeded twice.
    """

    bindings: dict[str, Any]
    task: Task | None
    notes: tuple[str, ...] = ()
    bound: Bound | None = None


def prepare_run(spec: Spec, *, build_task: bool = True) -> Prepared:
    """Everything ``train`` checks and builds before it trains; ``check --import`` runs
    this very function, so it finds all that ``train`` refuses.

    Cheap checks first, the task (the user's code, maybe slow) last: ``[run]`` has a task
    and an end and every callback a type; every callback's class imports, takes its
    arguments and is built; every metric read is produced by a built callback or the
    trainer; no callback reads a metric only a later one produces; every setter's
    ``param`` is a numeric hyper-parameter of the task's optimizer. A spec without
    ``[run]`` is checked as far as it goes: its typed callbacks (untyped ones are bound
    from Python and may produce anything: a metric only they could put is a note).

    Raises:
        SpecError: every problem found in one phase, with its key path.
    """
    trains = spec.run is not None
    problems = train_problems(spec) if trains else []
    if problems:
        raise SpecError(problems)
    # With [run], train_problems found every callback typed: nothing left to refuse here.
    bindings = build_callbacks(spec, untyped_ok=True)
    bound = _bind(spec, bindings)
    untyped = [n for n in spec.callbacks if n not in bindings]
    problems, notes = metric_problems(spec, set(bound.produced), untyped)
    problems += [Problem(f"callbacks.{name}", message, spec.path)
                 for name, message in order_problems(bound.schedule, list(bound.callbacks))]
    if problems:  # it would train and never save or stop on it: refuse before training
        raise SpecError(problems)
    notes += porting_notes(bindings)
    prepared = Prepared(bindings, None, tuple(notes), bound)
    return _with_task(spec, prepared) if trains and build_task else prepared


def _with_task(spec: Spec, prepared: Prepared) -> Prepared:
    """``prepared`` with the task built (seeded first), its optimizer checked."""
    from schedtrain.training.data_position import seed_everything

    assert spec.run is not None and spec.run.task and prepared.bound is not None
    seed_everything(spec.run.seed)  # before the task builds its model
    bound = attrs.evolve(prepared.bound, seeded=spec.run.seed)
    task = load_task(spec, spec.run.task)
    problems = _optimizer_problems(spec, prepared.bindings, task.optimizer)
    if problems:  # a setter of a key that is no number would fail its first firing
        raise SpecError(problems)
    return attrs.evolve(prepared, task=task, bound=bound)


def _optimizer_problems(spec: Spec, bindings: dict[str, Any],
                        optimizer: Any) -> list[Problem]:
    """Callbacks that set a hyper-parameter the task's optimizer does not hold as a
    number in every param group (``param = "params"``, a misspelt key)."""
    out = []
    for name, cb in bindings.items():
        check = getattr(cb, "optimizer_problem", None)
        problem = check(optimizer) if callable(check) else None
        if problem is not None:
            out.append(Problem(f"callbacks.{name}.param", problem, spec.path,
                               expected="a numeric hyper-parameter of the optimizer",
                               found=repr(getattr(cb, "param", None))))
    return out


def run_notes(spec: Spec, prepared: Prepared) -> list[str]:
    """Warnings only the run's shape shows: callbacks judging a metric at firings where
    it has no new value (``schedtrain.planning.staleness``), over the shape ``train``
    runs (``[run]``, the task's data)."""
    from schedtrain.planning.staleness import stale_notes
    from schedtrain.spec.shape import derive_clock

    counted = count_steps_per_epoch(spec, prepared.task) if prepared.task is not None else None
    shaped, _ = derive_clock(spec, counted)
    return stale_notes(shaped, {n: tuple(cb.produces) for n, cb in prepared.bindings.items()})


def porting_notes(bindings: dict[str, Any]) -> list[str]:
    """A line for each lineage hook a spec callback's class defines (or inherits) that
    schedtrain never calls (``PortingWarning``'s message, with the callback's key path), and
    for each class overriding both ``_trigger_epoch`` and ``_trigger`` (both run)."""
    from schedtrain.callbacks.base import Callback, overrides
    from schedtrain.callbacks.porting import porting_message, uncalled

    notes = []
    for name, cb in bindings.items():
        mro = type(cb).__mro__
        own = mro[:mro.index(Callback)] if isinstance(cb, Callback) else mro[:-1]
        notes += [f"callbacks.{name}: {porting_message(type(cb).__qualname__, hook)}"
                  for hook in uncalled(own)]
        if overrides(cb, "_trigger_epoch") and overrides(cb, "_trigger"):
            # A spec gives every callback a trigger: the tensorpack rule (the epoch call
            # replaces trigger()) applies only to callbacks given without one.
            notes.append(
                f"callbacks.{name}: {type(cb).__qualname__} overrides _trigger_epoch and "
                "_trigger: _trigger runs at this trigger and _trigger_epoch after every epoch "
                "as well (in tensorpack _trigger_epoch replaced the per-epoch trigger(); if "
                "it calls self.trigger(), that work runs twice: drop _trigger_epoch)")
    return notes


def _bind(spec: Spec, bindings: dict[str, Any]) -> Bound:
    """The spec's schedule of built callbacks, bound (untyped ones left out)."""
    from schedtrain.schedule.schedule import Schedule, Scheduled

    schedule, callbacks = bind(Schedule(
        [Scheduled(spec.callbacks[n].trigger, cb, n) for n, cb in bindings.items()],
        events=spec.events))
    return Bound(schedule, tuple(callbacks), produced_metrics(callbacks))


def train_from_spec(spec: Spec, run_dir: str | None, resume: str | None,
                    overwrite: bool = False, schedule_change: str = "refuse") -> Trainer:
    """Train as ``spec``'s ``[run]`` table says.

    Args:
        spec: a loaded ``schedtrain.spec.Spec``.
        run_dir: overrides ``[run] run_dir`` (default ``runs/<spec stem>``).
        resume: a checkpoint path, ``"auto"`` (the newest valid one in
            ``RUN_DIR/checkpoints``: it loads, matches its checksum and is finite; without
            one the run starts afresh in that directory) or ``None``.
        overwrite: start afresh in a run directory that holds a run.
        schedule_change: a checkpoint saved with another schedule: ``"refuse"`` or
            ``"apply"`` (``Trainer(schedule_change=...)``).

    Raises:
        SpecError: no ``[run]`` table or task, or callbacks that cannot be built.
        RunDirError: the run directory is in use, holds a run, or its run finished.
        Preempted: SIGTERM or SIGINT stopped the run after a checkpoint.
    """
    from schedtrain.training.trainer import Trainer

    if spec.unimported and spec.path:  # custom trigger classes: `train` imports them
        from schedtrain.spec.load import load_spec  # the loader: only the CLI has it already

        spec = load_spec(spec.path, imports=True)
    if spec.run is None:  # a spec for planning and Python
        raise SpecError(train_problems(spec))
    prepared = prepare_run(spec, build_task=False)
    out_dir = run_dir_of(spec, run_dir)
    # One process only: under torchrun the trainer's chief refuses, so every rank hears it
    if resume is None and not overwrite and os.environ.get("WORLD_SIZE", "1") == "1":
        RunDirectory(out_dir).refuse_fresh()  # before the task: its import may take seconds
    prepared = _with_task(spec, prepared)
    if os.environ.get("RANK", "0") == "0":  # the chief warns for every rank
        compiled = set(spec.analysis.notes) if spec.analysis is not None else set()
        for note in (*spec.warnings, *prepared.notes, *run_notes(spec, prepared)):
            if note not in compiled:  # the trainer warns those when it compiles
                warnings.warn(note, ScheduleWarning, stacklevel=2)
    run, task = spec.run, prepared.task
    assert run is not None and task is not None
    config = attrs.evolve(run, run_dir=str(out_dir), overwrite=overwrite,
                          log_events="jsonl" in run.sinks, schedule_change=schedule_change)
    trainer = Trainer(
        task.model, task.optimizer, task.train_data, task.loss_fn, task.step_fn,
        val_data=task.val_data, sinks=build_sinks(run.sinks, run.sink_every, out_dir),
        config=config, prepared=prepared.bound)
    try:
        _resume_and_fit(trainer, out_dir, resume)
    finally:
        trainer.close()
    return trainer


def run_dir_of(spec: Spec, run_dir: str | None) -> Path:
    """The run directory ``train`` uses: ``--run-dir``, else ``[run] run_dir``, else
    ``runs/<spec stem>``."""
    from schedtrain.spec.load import default_run_dir

    return Path(run_dir or (spec.run.run_dir if spec.run else None)
                or default_run_dir(spec.path))


def interrupted_line(spec: Spec, run_dir: str | None) -> str:
    """What a second Ctrl-C left: no checkpoint of the step in progress, and where a
    resume would continue."""
    out = run_dir_of(spec, run_dir)
    status = RunDirectory(out).status() or {}
    step = status.get("step")
    at = f" at step {step}" if step is not None else ""
    folder, found = _newest(spec, out)
    if found is None:
        then = "`--resume auto` would start again from step 0 (no valid checkpoint in " \
               f"{folder!r})"
    else:
        then = f"`--resume auto` continues from {found!r}"
    return f"interrupted{at} (a second Ctrl-C): no checkpoint was written for it; {then}"


def _newest(spec: Spec, out: Path) -> tuple[str, str | None]:
    """The checkpoint folder (path or URL) and its newest valid checkpoint."""
    run = spec.run
    if run is None or run.checkpoint_dir is None:
        found = newest_valid(out / "checkpoints")
        return str(out / "checkpoints"), None if found is None else str(found)
    try:
        storage = open_storage(run.checkpoint_dir, dict(run.storage_options))
        found = stored_newest_valid(storage, out / "checkpoints")
    except CheckpointError:
        return run.checkpoint_dir, None
    return run.checkpoint_dir, None if found is None else storage.url(found.name)


def _resume_and_fit(trainer: Trainer, out_dir: Path, resume: str | None) -> None:
    if resume == "auto":
        found = trainer.resume("auto")
        if found is not None:
            config = trainer.config
            ended = trainer.rank == 0 and RunDirectory(out_dir).ended(
                config.max_epochs, config.max_steps, trainer.clock.step)  # fit says so
            if trainer.rank == 0 and not ended:  # a plain line, as the CLI's others are
                print(f"resumed from {found} at step {trainer.clock.step}", file=sys.stderr)
        else:  # nothing valid to resume from: the run started again
            status = RunDirectory(out_dir).status() if trainer.rank == 0 else None
            if status is not None and status.get("status") not in ("finished", "stopped"):
                _log.warning("starting_over", run_dir=str(out_dir), step=0,
                             note="no valid checkpoint to resume from")
    elif resume is not None:
        trainer.resume(resume)
    trainer.fit()
