"""The main job: train from a loaded spec (``schedtrain train SPEC``).

All glue between the spec (``schedtrain.spec.Spec``) and the ``Trainer`` lives
here. The task is ``[run] task = "module:function"``; the module is imported with
the current directory and the spec file's parent directory's parent on
``sys.path`` (so ``specs/digits.toml`` next to ``examples/`` finds
``examples.digits:make_task``). The function takes no arguments and returns a ``Task``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs
import torch

from schedtrain.errors import Problem, SpecError
from schedtrain.training.checkpoint import latest_checkpoint

__all__ = ["Task", "load_task", "train_from_spec"]


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
    roots = [str(Path.cwd())]
    if getattr(spec, "path", None):
        roots.append(str(Path(spec.path).resolve().parent.parent))
    for root in roots:
        if root not in sys.path:
            sys.path.insert(0, root)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise _problem(spec, "run.task", f"cannot import {module_name!r}: {exc}") from exc
    factory = getattr(module, func_name, None)
    if not callable(factory):
        raise _problem(spec, "run.task", f"{module_name!r} has no function {func_name!r}")
    task = factory()
    if not isinstance(task, Task):
        raise TypeError(f"task factory {target!r} must return a schedtrain.training.Task, "
                        f"got {type(task).__name__}")
    return task


def _resolve(type_name: str) -> type:
    """``schedtrain.registry.resolve``; a minimal stand-in until the registry lands."""
    try:
        from schedtrain.registry import resolve
    except ImportError:
        module, _, cls = (type_name if ":" in type_name else
                          _BUILTINS.get(type_name, type_name)).partition(":")
        if not cls:
            raise ValueError(f"unknown callback type {type_name!r}") from None
        return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]
    return resolve(type_name)


_BUILTINS = {
    "ModelSaver": "schedtrain.callbacks.saver:ModelSaver",
    "MinSaver": "schedtrain.callbacks.saver:MinSaver",
    "MaxSaver": "schedtrain.callbacks.saver:MaxSaver",
    "InferenceRunner": "schedtrain.callbacks.inference:InferenceRunner",
    "ScheduledHyperParamSetter": "schedtrain.callbacks.hyperparam:ScheduledHyperParamSetter",
    "EarlyStopping": "schedtrain.callbacks.stopping:EarlyStopping",
    "TerminateOnNaN": "schedtrain.callbacks.stopping:TerminateOnNaN",
    "ProgressBar": "schedtrain.callbacks.progress:ProgressBar",
}


def build_callbacks(spec: Any) -> dict[str, Any]:
    """Instantiate every typed callback of ``spec``; every problem is listed."""
    out: dict[str, Any] = {}
    problems: list[Problem] = []
    file = getattr(spec, "path", None)
    for name, cs in spec.callbacks.items():
        path = f"callbacks.{name}"
        if cs.type is None:
            problems.append(Problem(path, "no `type`: only Python code can bind this "
                                    "callback; `schedtrain train` needs a type", file))
            continue
        try:
            cls = _resolve(cs.type)
            out[name] = cls(**dict(cs.args))
        except (ImportError, TypeError, ValueError) as exc:
            problems.append(Problem(f"{path}.type" if isinstance(exc, ImportError) else path,
                                    f"{cs.type}: {exc}", file))
    if problems:
        raise SpecError(problems)
    return out


def train_from_spec(spec: Any, run_dir: str | None, resume: str | None) -> None:
    """Train as ``spec``'s ``[run]`` table says.

    Args:
        spec: a loaded ``schedtrain.spec.Spec``.
        run_dir: overrides ``[run] run_dir`` (default ``runs/<spec stem>``).
        resume: a checkpoint path, ``"auto"`` (the newest in ``RUN_DIR/checkpoints``,
            if any) or ``None``.

    Raises:
        SpecError: no ``[run]`` table or task, or callbacks that cannot be built.
    """
    from schedtrain.training.trainer import Trainer, seed_everything

    run = spec.run
    if run is None or not run.task:
        raise _problem(spec, "run.task", "`schedtrain train` needs a [run] table with "
                       "task = 'module:function'")
    stem = Path(spec.path).stem if getattr(spec, "path", None) else "run"
    out_dir = Path(run_dir or run.run_dir or f"runs/{stem}")
    seed_everything(run.seed)  # before the task builds its model
    task = load_task(spec, run.task)
    bindings = build_callbacks(spec)
    trainer = Trainer(
        task.model, task.optimizer, task.train_data, task.loss_fn, task.step_fn,
        schedule=spec.schedule(), bindings=bindings, val_data=task.val_data,
        max_epochs=run.max_epochs, max_steps=run.max_steps, device=run.device,
        precision=run.precision, grad_accum=run.grad_accum, grad_clip=run.grad_clip,
        seed=run.seed, run_dir=out_dir)
    if resume == "auto":
        found = latest_checkpoint(out_dir / "checkpoints")
        if found is not None:
            trainer.resume(found)
    elif resume is not None:
        trainer.resume(resume)
    trainer.fit()
