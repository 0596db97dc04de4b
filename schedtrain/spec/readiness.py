"""What ``schedtrain train`` refuses in a spec, known without importing anything.

A ``[run]`` table says the spec is meant to be trained, so ``check`` reports what
``train`` would refuse in it: no task, no end (neither ``max_epochs`` nor
``max_steps``), a callback without a ``type`` (only Python can bind it). ``train``
runs the same function first, before it imports or builds anything. A spec without
``[run]`` is for planning and Python; ``train`` refuses it (needs a ``[run]`` table).
"""

from __future__ import annotations

from schedtrain.errors import Problem
from schedtrain.spec.model import Spec

__all__ = ["train_problems"]


def train_problems(spec: Spec) -> list[Problem]:
    """Every reason ``schedtrain train`` would refuse ``spec`` before importing anything."""
    run = spec.run
    if run is None:
        return [Problem("run", "`schedtrain train` needs a [run] table with task = "
                               "\"module:function\" and max_epochs or max_steps", spec.path,
                        expected="a [run] table", found="none")]
    problems = []
    if not run.task:
        problems.append(Problem(
            "run.task", "missing key 'task': `schedtrain train` needs task = "
                        "\"module:function\", a function returning a schedtrain.training.Task",
            spec.path, expected="task = \"module:function\"", found="none"))
    if run.max_epochs is None and run.max_steps is None:
        problems.append(Problem(
            "run", "missing key 'max_epochs' or 'max_steps': training must end; give "
                   "max_epochs = N or max_steps = N (or both)", spec.path,
            expected="max_epochs or max_steps", found="neither"))
    problems += [
        Problem(f"callbacks.{name}", "no `type`: only Python code can bind this callback "
                                     "(Trainer(bindings=...)); `schedtrain train` needs a type",
                spec.path, expected="type = \"Name\" or \"package.module:Class\"", found="none")
        for name, cb in spec.callbacks.items() if cb.type is None]
    return problems
