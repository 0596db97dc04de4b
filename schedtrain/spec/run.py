"""``RunConfig``: a run's options, one record from ``[run]`` or ``Trainer(...)`` to the parts.

Torch-free, in the spec layer, so ``check`` and ``plan`` read it without torch. The TOML
keys of ``[run]`` are its fields (``spec.run_fields``); the few that only Python and the
command line set (``PYTHON_ONLY``) are refused in a spec. It is valid by construction:
building one (``RunConfig(...)``, ``attrs.evolve``) checks it by the one rule set of
``spec.run_check``, so a bad value is an ``ArgumentError`` naming the keyword; the
loaders check a ``[run]`` table first, with every problem at its key path
(``SpecError``), and build the record from the checked fields without checking again.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from schedtrain.spec.problems import Problems
from schedtrain.spec.run_check import argument_error, check_run
from schedtrain.spec.run_fields import (
    BUSY_RULES,
    DEFAULT_KEEP_FIRINGS,
    EXPORT_FORMATS,
    MODES,
    PRECISIONS,
    PYTHON_ONLY,
    SCHEDULE_CHANGES,
    STAGING,
    RunFields,
)

__all__ = ["BUSY_RULES", "DEFAULT_KEEP_FIRINGS", "EXPORT_FORMATS", "MODES", "PRECISIONS",
           "PYTHON_ONLY", "SCHEDULE_CHANGES", "STAGING", "CheckpointOptions", "RunConfig",
           "from_checked", "toml_fields"]


@attrs.frozen(kw_only=True)
class CheckpointOptions:
    """The checkpoint owner's section of a run's options (``RunConfig.checkpoint_options``):
    the flat ``[run]`` keys of the same names (``checkpoint_*``, ``storage_options``,
    ``export``) and the run directory, checked with the rest of ``RunConfig``."""

    run_dir: Path | None = None
    checkpoint_dir: str | None = None
    storage_options: Mapping[str, Any] = attrs.field(factory=dict)
    checkpoint_mode: str = "async"
    checkpoint_busy: str = "wait"
    checkpoint_staging: str = "reuse"
    checkpoint_write_share: float | None = None
    export: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class RunConfig(RunFields):
    """A run's options: the ``[run]`` table, or ``Trainer``'s keywords of the same names.

    Args:
        task: ``"module:function"`` building the model, data and optimizer (``train``).
        max_epochs: stop after this many epochs.
        max_steps: stop after this many optimizer steps.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``.
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        grad_accum: micro-batches per optimizer step.
        grad_clip: clip the gradient norm to this value.
        seed: random seed, 0 to 2**63 - 1.
        run_dir: where checkpoints and logs go; ``train``'s default ``runs/<spec stem>``.
        strategy: on several processes: ``"auto"`` (``"ddp"``), ``"ddp"`` or ``"fsdp"``.
        shard_data: on several processes, shard a plain ``DataLoader`` across ranks.
        reduce: metric name -> how it is combined across ranks (``"mean"`` by default,
            ``"sum"``, ``"max"``, ``"min"``).
        sinks: where scalars go: ``"jsonl"`` (``RUN_DIR/events.jsonl``), ``"console"``
            (a line per report on stdout), ``"tensorboard"`` (``RUN_DIR/tensorboard``).
        sink_every: sink name -> at most one report per this period (``"1 epoch"``,
            ``"100 steps"``); a sink not named reports every value.
        sanity_eval_batches: with N > 0, ``sanity_eval`` fires once before ``train_start``
            (not on resume); an ``InferenceRunner`` it fires evaluates at most N batches.
        checkpoint_dir: where ``RUN_DIR/checkpoints`` really is: a folder or an fsspec
            URL (``s3://bucket/run/checkpoints``); default the run directory's.
        storage_options: the URL's filesystem options (``client_kwargs``, credentials).
        checkpoint_mode: ``"async"`` (the loop blocks only for a host copy; a background
            thread writes) or ``"sync"``.
        checkpoint_busy: a save asked for while another is in flight ``"wait"``s for it
            or is ``"skip"``ped.
        checkpoint_staging: ``"reuse"`` the host buffers of an async save's snapshot for
            the next one (held between saves) or take ``"fresh"`` ones each time.
        checkpoint_write_share: the most of the time (0 < x <= 1) a background write is
            busy while the loop does not wait for it; not given: 1 when training runs on a
            device, 0.25 on the CPU (where the write and the step share the cores).
        export: also write the model's weights in these formats (``"safetensors"``).
        deadline: an ISO time or a duration from the start (``"23 h"``); the earlier of
            it and SLURM's ``SLURM_JOB_END_TIME`` is the run's deadline.
        preempt_signals: the signals that checkpoint and stop the run (exit code 75).
        preempt_notice: poll a cloud's metadata server for a spot/preemption notice,
            which then acts as a signal with a deadline: ``"aws"``, ``"gce"``, or
            ``"aws+http://HOST:PORT"``/``"gce+http://HOST:PORT"`` (another server).
        overwrite: start afresh in a run directory that holds a run (Python, ``--overwrite``).
        keep_firings: firings kept in memory for ``trainer.firings`` (``None``: all).
        handle_signals: install the preemption signal handlers.
        log_events: write ``RUN_DIR/events.jsonl`` (``sinks`` holds ``"jsonl"`` in a spec).
        schedule_change: resuming a checkpoint saved with another schedule: ``"refuse"``
            or ``"apply"`` the new one (``--schedule-change``).
        mtbf: the mean time between failures (``"6 h"``): what ``every = "auto"`` picks a
            saver's interval from (docs/checkpoints.md).
        failure_rate: instead of ``mtbf``, failures per hour.
        max_checkpoint_overhead: with ``every = "auto"``, the most of the time saves may
            take (``"2%"``, or the share ``0.02``): the interval is raised to keep to it.

    Raises:
        ArgumentError: a value the rules refuse (``ValueError``), naming the keyword, what
            was expected and what was found (the first problem; the others in its notes).
    """

    def __attrs_post_init__(self) -> None:
        problems = Problems()
        check_run(self, problems, in_process=True)
        if problems.items:
            raise argument_error(problems)

    @property
    def run_path(self) -> Path | None:
        """``run_dir`` as a path (``None``: the run writes nothing)."""
        return Path(self.run_dir) if self.run_dir is not None else None

    @property
    def checkpoint_options(self) -> CheckpointOptions:
        """The section ``Checkpoints`` reads (``checkpoints.manager``)."""
        return CheckpointOptions(
            run_dir=self.run_path, checkpoint_dir=self.checkpoint_dir,
            storage_options=self.storage_options, checkpoint_mode=self.checkpoint_mode,
            checkpoint_busy=self.checkpoint_busy, checkpoint_staging=self.checkpoint_staging,
            checkpoint_write_share=self.checkpoint_write_share, export=self.export)

    def ended(self, step: int, epoch: int) -> bool:
        """Whether a clock at ``step``, ``epoch`` has reached ``max_epochs`` or ``max_steps``."""
        return ((self.max_epochs is not None and epoch >= self.max_epochs)
                or (self.max_steps is not None and step >= self.max_steps))


def from_checked(fields: RunFields) -> RunConfig:
    """The ``RunConfig`` of ``fields`` that ``check_run`` found no problem in: the loaders'
    constructor (they check with every problem at its key path, then build), which does
    not check again."""
    config = object.__new__(RunConfig)
    for a in attrs.fields(RunFields):  # what attrs' frozen __init__ does, less the check
        object.__setattr__(config, a.name, getattr(fields, a.name))
    return config

def toml_fields(config: RunConfig) -> dict[str, Any]:
    """The fields a ``[run]`` table writes (``PYTHON_ONLY`` ones left out)."""
    return {k: v for k, v in attrs.asdict(config, recurse=False).items()
            if k not in PYTHON_ONLY}
