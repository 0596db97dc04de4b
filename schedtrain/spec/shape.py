"""The run's shape for ``plan`` and ``check`` from ``[run]``, so ``[clock]`` need not repeat it.

``[run]`` says how long training is (``max_epochs``, ``max_steps``, ``grad_accum``) and
whether ``sanity_eval`` fires (``sanity_eval_batches``); the task's data says how many
steps an epoch has (counted only when asked: it builds the task). A ``[clock]`` key that
is missing is taken from there; one that is given wins, and a value that disagrees with
``[run]`` or the data is reported as a warning (the plan would show another run than
``train`` trains).
"""

from __future__ import annotations

from typing import Any

import attrs

from schedtrain.spec.model import ClockSpec, Spec

__all__ = ["derive_clock"]


def derive_clock(spec: Spec, steps_per_epoch: int | None = None) -> tuple[Spec, list[str]]:
    """``spec`` with ``[clock]``'s missing keys taken from ``[run]`` and the counted
    ``steps_per_epoch`` (``None``: not counted), and a warning for each disagreement.

    Returns:
        ``(spec, warnings)``; ``spec`` unchanged when it has no ``[run]``.
    """
    run = spec.run
    if run is None:
        return spec, []
    clock, notes = spec.clock, []
    accum = run.grad_accum if run.grad_accum != 1 else None
    if clock.sanity_eval is not None and clock.sanity_eval != (run.sanity_eval_batches > 0):
        notes.append(f"clock.sanity_eval: [clock] sanity_eval = "
                     f"{str(clock.sanity_eval).lower()} but [run] sanity_eval_batches = "
                     f"{run.sanity_eval_batches}: plan and train disagree on sanity_eval; "
                     "drop clock.sanity_eval to plan what train runs")
    pairs = (("epochs", clock.epochs, "max_epochs", run.max_epochs),
             ("max_steps", clock.max_steps, "max_steps", run.max_steps),
             ("batches_per_step", clock.batches_per_step or 1, "grad_accum", run.grad_accum))
    for key, given, run_key, wanted in pairs:
        if given is not None and wanted is not None and given != wanted:
            notes.append(f"clock.{key}: [clock] {key} = {given} but [run] {run_key} = "
                         f"{wanted}: plan shows {given}, train runs {wanted}; drop "
                         f"clock.{key} to plan what train runs")
    if (steps_per_epoch is not None and clock.steps_per_epoch is not None
            and clock.steps_per_epoch != steps_per_epoch):
        notes.append(f"clock.steps_per_epoch: [clock] steps_per_epoch = "
                     f"{clock.steps_per_epoch} but the task's data makes {steps_per_epoch} "
                     "steps per epoch; drop clock.steps_per_epoch to plan what train runs")
    fill: dict[str, int | None] = {
        "epochs": run.max_epochs, "max_steps": run.max_steps, "batches_per_step": accum,
        # epochs of given lengths, or counted in batches, say their own steps
        "steps_per_epoch": None if clock.epoch_lengths or clock.per_batch else steps_per_epoch}
    if fill["epochs"] is None and run.max_steps is not None and steps_per_epoch:
        fill["epochs"] = -(-run.max_steps // steps_per_epoch)  # the epochs max_steps reaches
    if clock.epoch_lengths:
        fill["epochs"] = None  # the lengths say how many
    missing: dict[str, Any] = {k: v for k, v in fill.items()
                               if v is not None and getattr(clock, k) is None}
    if clock.sanity_eval is None and run.sanity_eval_batches > 0:
        missing["sanity_eval"] = True
    if not missing:
        return spec, notes
    derived: ClockSpec = attrs.evolve(clock, **missing)
    return attrs.evolve(spec, clock=derived), notes
