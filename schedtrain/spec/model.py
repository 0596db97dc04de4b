"""The values a TOML spec loads into: ``Spec``, ``ClockSpec``, ``RunSpec``, ``CallbackSpec``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from schedtrain.errors import Problem, SpecError
from schedtrain.schedule.analysis import Analysis, Located
from schedtrain.schedule.schedule import Schedule, Scheduled
from schedtrain.simulation.simclock import RunShape
from schedtrain.spec.deadlines import DEFAULT_SIGNALS
from schedtrain.triggers import Trigger

__all__ = ["CPU_WRITE_SHARE", "CallbackSpec", "ClockSpec", "RunSpec", "Spec"]

#: ``[run] checkpoint_write_share`` not given, where training runs on the CPU: the
#: background write and the step share the cores and memory bandwidth there.
CPU_WRITE_SHARE: Final = 0.25


@attrs.frozen
class ClockSpec:
    """The ``[clock]`` table: the run's shape, for ``plan`` and simulation.

    Args:
        epochs: number of epochs (or ``epoch_lengths``).
        steps_per_epoch: optimizer steps per epoch.
        epoch_lengths: optimizer steps in each epoch, for epochs of uneven length.
        batches_per_step: micro-batches per optimizer step (gradient accumulation).
        samples_per_batch: samples each micro-batch adds to the ``sample`` counter.
        tokens_per_batch: tokens each micro-batch adds to the ``token`` counter.
        seconds_per_step: training wall time per optimizer step, for time triggers.
        max_steps: the run ends right after this step, as ``[run] max_steps`` does.
        sanity_eval: ``sanity_eval`` fires once before ``train_start``, as with
            ``[run] sanity_eval_batches`` > 0 (taken from there when not given).
    """

    epochs: int | None = None
    steps_per_epoch: int | None = None
    epoch_lengths: tuple[int, ...] | None = None
    batches_per_step: int | None = None
    samples_per_batch: int | None = None
    tokens_per_batch: int | None = None
    seconds_per_step: float | None = None
    max_steps: int | None = None
    sanity_eval: bool | None = None

    def shape(self, *, epochs: int | None = None,
              steps_per_epoch: int | None = None) -> RunShape | None:
        """The run's shape, ``None`` without a length.

        ``steps_per_epoch`` makes every epoch that long (``epoch_lengths`` aside);
        ``epochs`` takes that many epochs (of ``epoch_lengths``, the first ones).

        Raises:
            ValueError: ``epochs`` asks for more epochs than ``epoch_lengths`` lists.
        """
        n = epochs if epochs is not None else self.epochs
        lengths: tuple[int, ...] | None = None
        if steps_per_epoch is None and self.steps_per_epoch is None and self.epoch_lengths:
            lengths = self.epoch_lengths[:n] if n is not None else self.epoch_lengths
            if n is not None and n > len(self.epoch_lengths):
                raise ValueError(f"[clock] epoch_lengths lists {len(self.epoch_lengths)} "
                                 f"epochs, and {n} were asked for; give --steps-per-epoch "
                                 "for epochs of one length")
        spe = steps_per_epoch if steps_per_epoch is not None else self.steps_per_epoch
        if lengths is None:
            if spe is None:
                return None
            if n is None:
                n = len(self.epoch_lengths) if self.epoch_lengths else None
            if n is None:
                return None
        return RunShape.build(
            epochs=None if lengths is not None else n,
            steps_per_epoch=None if lengths is not None else spe,
            epoch_lengths=lengths, batches_per_step=self.batches_per_step or 1,
            samples_per_batch=self.samples_per_batch or 0,
            tokens_per_batch=self.tokens_per_batch or 0,
            seconds_per_step=self.seconds_per_step or 0.0, max_steps=self.max_steps)


@attrs.frozen
class RunSpec:
    """The ``[run]`` table: what ``schedtrain train`` needs besides the schedule.

    Args:
        task: ``"module:function"`` building the model, data and optimizer.
        max_epochs: stop after this many epochs.
        max_steps: stop after this many optimizer steps.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``.
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        grad_accum: micro-batches per optimizer step.
        grad_clip: clip the gradient norm to this value.
        seed: random seed, 0 to 2**63 - 1.
        run_dir: where checkpoints and logs go; default ``runs/<spec file stem>``.
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
    """

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


@attrs.frozen
class CallbackSpec:
    """One ``[callbacks.NAME]`` table.

    Args:
        type: a built-in name or ``"package.module:Class"``; ``None`` when the
            callback object is bound from Python by its name.
        args: the callback's own arguments (every other key of the table).
        trigger: when the callback runs.
    """

    type: str | None
    args: Mapping[str, Any]
    trigger: Trigger


@attrs.frozen
class Spec:
    """A loaded, checked TOML schedule.

    Args:
        callbacks: name -> callback, in declared order.
        triggers: the named ``[triggers.NAME]`` triggers.
        clock: the run's shape for planning.
        run: the ``[run]`` table, if any.
        events: declared custom events.
        path: the file it was loaded from, if any.
        warnings: ``ScheduleWarning`` texts from the static checks.
        analysis: the static checks' result, reused when the schedule is compiled.
    """

    callbacks: Mapping[str, CallbackSpec]
    triggers: Mapping[str, Trigger] = attrs.field(factory=dict)
    clock: ClockSpec = attrs.Factory(ClockSpec)
    run: RunSpec | None = None
    events: tuple[str, ...] = ()
    path: str | None = None
    warnings: tuple[str, ...] = attrs.field(default=(), eq=False)
    analysis: Analysis | None = attrs.field(default=None, eq=False, repr=False)
    located: Mapping[str, Located] = attrs.field(factory=dict, eq=False, repr=False)

    def schedule(self) -> Schedule:
        """The core ``Schedule``: each callback by name, unbound (``callback=None``)."""
        return Schedule([Scheduled(cb.trigger, None, n) for n, cb in self.callbacks.items()],
                        events=self.events, checked=self.analysis)

    @property
    def unimported(self) -> tuple[str, ...]:
        """Custom trigger classes named but not imported (load with imports to plan)."""
        from schedtrain.spec.custom import CustomTrigger

        found = []
        for loc in self.located.values():
            for node in loc.walk():
                t = node.trigger
                if isinstance(t, CustomTrigger) and not t.loaded:
                    found.append(t.target)
        return tuple(dict.fromkeys(found))

    def callback_classes(self) -> dict[str, type]:
        """Import every typed callback's class and check its arguments; nothing is called.

        Raises:
            SpecError: a class cannot be imported, is not a ``Callback`` subclass, or
                its arguments do not fit its signature.
        """
        from schedtrain.spec import registry

        problems: list[Problem] = []
        classes: dict[str, type] = {}
        for name, cb in self.callbacks.items():
            if cb.type is None:
                continue
            try:
                cls = registry.resolve(cb.type)
            except (ImportError, ValueError, TypeError) as exc:
                problems.append(Problem(f"callbacks.{name}.type", str(exc), self.path,
                                        expected="a Callback subclass", found=cb.type))
                continue
            classes[name] = cls
            for key, message in registry.check_arguments(cls, cb.args):
                path = f"callbacks.{name}" + (f".{key}" if key else "")
                problems.append(Problem(path, message, self.path))
        if problems:
            raise SpecError(problems)
        return classes
