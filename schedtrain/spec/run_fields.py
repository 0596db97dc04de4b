"""A run's options as fields, unchecked: the vocabularies of ``[run]`` and ``RunFields``.

``RunFields`` is what the spec's converter structures a ``[run]`` table (or ``Trainer``'s
keywords) into before ``spec.run_check`` checks it; the rules read it here, below
``RunConfig`` (``spec.run``), which is built only checked. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from schedtrain.spec.deadlines import DEFAULT_SIGNALS

__all__ = ["BUSY_RULES", "DEFAULT_KEEP_FIRINGS", "EXPORT_FORMATS", "MODES", "PRECISIONS",
           "PYTHON_ONLY", "SCHEDULE_CHANGES", "STAGING", "RunFields"]

# The vocabularies of the checkpoint options live here, not beside their torch-side
# users (checkpoints.background, .staging, .export import them), so `check` reads them
# without torch.
#: ``checkpoint_mode`` values: a background write, or the loop writes.
MODES: Final = ("async", "sync")
#: ``checkpoint_busy`` values: a save asked for while one is in flight waits or is skipped.
BUSY_RULES: Final = ("wait", "skip")
#: ``checkpoint_staging`` values: an async save's host buffers kept for the next or fresh.
STAGING: Final = ("reuse", "fresh")
#: ``export`` formats.
EXPORT_FORMATS: Final = ("safetensors",)
#: ``precision`` values.
PRECISIONS: Final = ("fp32", "bf16", "fp16")
#: ``schedule_change`` values: what a resume with another schedule does.
SCHEDULE_CHANGES: Final = ("refuse", "apply")
#: Firings a trainer keeps in memory for ``trainer.firings`` (``None``: all).
DEFAULT_KEEP_FIRINGS: Final = 100_000
#: Options set from Python or the command line, never by a spec's ``[run]``.
PYTHON_ONLY: Final = frozenset({"overwrite", "keep_firings", "handle_signals", "log_events",
                                "schedule_change"})




@attrs.frozen(kw_only=True)
class RunFields:
    """The fields of ``RunConfig``, not yet checked (see ``RunConfig`` for each)."""

    task: str | None = None
    max_epochs: int | None = None
    max_steps: int | None = None
    device: str = "auto"
    precision: str = "fp32"
    grad_accum: int = 1
    grad_clip: float | None = None
    seed: int = 0
    run_dir: str | None = None
    strategy: str = "auto"
    shard_data: bool = True
    reduce: Mapping[str, str] = attrs.field(factory=dict)
    sinks: tuple[str, ...] = ("jsonl",)
    sink_every: Mapping[str, str] = attrs.field(factory=dict)
    sanity_eval_batches: int = 0
    checkpoint_dir: str | None = None
    storage_options: Mapping[str, Any] = attrs.field(factory=dict)
    checkpoint_mode: str = "async"
    checkpoint_busy: str = "wait"
    checkpoint_staging: str = "reuse"
    checkpoint_write_share: float | None = None
    export: tuple[str, ...] = ()
    deadline: str | None = None
    preempt_signals: tuple[str, ...] = DEFAULT_SIGNALS
    preempt_notice: str | None = None
    overwrite: bool = False
    keep_firings: int | None = DEFAULT_KEEP_FIRINGS
    handle_signals: bool = True
    log_events: bool = True
    schedule_change: str = "refuse"
    mtbf: str | None = None
    failure_rate: float | None = None
    max_checkpoint_overhead: str | float | None = None
