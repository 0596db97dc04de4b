"""The main job: train from a loaded spec (``schedtrain train SPEC``).

All glue between the spec (``schedtrain.spec.Spec``) and the ``Trainer`` lives
here. The task is ``[run] task = "module:function"``; the module is looked up in the spec
file's folder, its parent (so ``specs/digits.toml`` next to ``examples/`` finds
``examples.digits:make_task``) and the current directory, then among installed
packages. The function takes no arguments and returns a ``Task``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import structlog
import torch

from schedtrain.errors import Problem, SpecError, did_you_mean
from schedtrain.imports import add_user_paths, import_module
from schedtrain.monitors.cadence import build_sinks
from schedtrain.spec import Spec
from schedtrain.spec.metrics import TRAINER_METRICS, metric_problems
from schedtrain.training.checkpoint import newest_valid

if TYPE_CHECKING:
    from schedtrain.training.trainer import Trainer

__all__ = ["Task", "count_steps_per_epoch", "load_task", "train_from_spec"]

_log = structlog.get_logger("schedtrain.training")


def _skipped(path: Path, reason: str) -> None:
    _log.warning("checkpoint_skipped", checkpoint=str(path), reason=reason)


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
    task = factory()
    if not isinstance(task, Task):
        raise TypeError(f"task factory {target!r} must return a schedtrain.training.Task, "
                        f"got {type(task).__name__}")
    return task


def count_steps_per_epoch(spec: Spec) -> int | None:
    """Optimizer steps per epoch of ``spec``'s task: its training data's length over
    ``[run] grad_accum`` (``None`` without a task, or data without a length). This builds
    the task (seeded as ``train`` seeds it)."""
    from schedtrain.training.state import seed_everything

    run = spec.run
    if run is None or not run.task:
        return None
    seed_everything(run.seed)
    task = load_task(spec, run.task)
    try:
        n = len(task.train_data)  # type: ignore[arg-type]
    except TypeError:
        return None
    return -(-n // run.grad_accum)


def build_callbacks(spec: Spec) -> dict[str, Any]:
    """Instantiate every typed callback of ``spec``; every problem is listed."""
    problems: list[Problem] = [
        Problem(f"callbacks.{name}", "no `type`: only Python code can bind this callback; "
                "`schedtrain train` needs a type", spec.path)
        for name, cs in spec.callbacks.items() if cs.type is None
    ]
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


def train_from_spec(spec: Spec, run_dir: str | None, resume: str | None,
                    overwrite: bool = False) -> Trainer:
    """Train as ``spec``'s ``[run]`` table says.

    Args:
        spec: a loaded ``schedtrain.spec.Spec``.
        run_dir: overrides ``[run] run_dir`` (default ``runs/<spec stem>``).
        resume: a checkpoint path, ``"auto"`` (the newest valid one in
            ``RUN_DIR/checkpoints``: it loads, matches its checksum and is finite; without
            one the run starts afresh in that directory) or ``None``.
        overwrite: start afresh in a run directory that holds a run.

    Raises:
        SpecError: no ``[run]`` table or task, or callbacks that cannot be built.
        RunDirError: the run directory is in use, holds a run, or its run finished.
        Preempted: SIGTERM or SIGINT stopped the run after a checkpoint.
    """
    from schedtrain.training.state import seed_everything
    from schedtrain.training.trainer import Trainer

    run = spec.run
    if run is None or not run.task:
        raise _problem(spec, "run.task", "`schedtrain train` needs a [run] table with "
                       "task = 'module:function'")
    stem = Path(spec.path).stem if spec.path else "run"
    out_dir = Path(run_dir or run.run_dir or f"runs/{stem}")
    seed_everything(run.seed)  # before the task builds its model
    task = load_task(spec, run.task)
    bindings = build_callbacks(spec)
    produced = set(TRAINER_METRICS).union(*(cb.produces for cb in bindings.values()))
    problems, _ = metric_problems(spec, produced)
    if problems:  # it would train and never save or stop on it: refuse before training
        raise SpecError(problems)
    trainer = Trainer(
        task.model, task.optimizer, task.train_data, task.loss_fn, task.step_fn,
        schedule=spec.schedule(), bindings=bindings, val_data=task.val_data,
        max_epochs=run.max_epochs, max_steps=run.max_steps, device=run.device,
        precision=run.precision, grad_accum=run.grad_accum, grad_clip=run.grad_clip,
        seed=run.seed, run_dir=out_dir, overwrite=overwrite, strategy=run.strategy,
        shard_data=run.shard_data, reduce=dict(run.reduce),
        sinks=build_sinks(run.sinks, run.sink_every, out_dir),
        log_events="jsonl" in run.sinks)
    try:
        _resume_and_fit(trainer, out_dir, resume)
    finally:
        trainer.close()
    return trainer


def _resume_and_fit(trainer: Trainer, out_dir: Path, resume: str | None) -> None:
    if resume == "auto":
        found = newest_valid(out_dir / "checkpoints", _skipped)
        if found is not None:
            trainer.resume(found)
            if trainer.rank == 0:
                _log.warning("resumed", checkpoint=str(found), step=trainer.clock.step)
        else:
            trainer.start_over()  # nothing valid to resume from: the run starts again
    elif resume is not None:
        trainer.resume(resume)
    trainer.fit()
