"""The values a TOML spec loads into: ``Spec``, ``ClockSpec``, ``CallbackSpec`` (and
``RunConfig``, from ``spec.run``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from schedtrain.errors import Problem, SpecError
from schedtrain.schedule.analysis import Analysis, Located
from schedtrain.schedule.schedule import Schedule, Scheduled
from schedtrain.simulation.simclock import RunShape
from schedtrain.spec.run import RunConfig
from schedtrain.triggers import Trigger

__all__ = ["CPU_WRITE_SHARE", "CallbackSpec", "ClockSpec", "Spec"]

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
        samples_per_batch: samples each micro-batch adds to the ``sample`` counter, or a
            list of one epoch's batches (``[4, 4, 2]``: an uneven last batch).
        tokens_per_batch: tokens each micro-batch adds to the ``token`` counter (or a list).
        batches_per_epoch: micro-batches per epoch, for an epoch that ends on a partial
            accumulation step (steps per epoch: this over ``batches_per_step``, rounded up).
        seconds_per_step: training wall time per optimizer step, for time triggers.
        max_steps: the run ends right after this step, as ``[run] max_steps`` does.
        sanity_eval: ``sanity_eval`` fires once before ``train_start``, as with
            ``[run] sanity_eval_batches`` > 0 (taken from there when not given).
    """

    epochs: int | None = None
    steps_per_epoch: int | None = None
    epoch_lengths: tuple[int, ...] | None = None
    batches_per_step: int | None = None
    samples_per_batch: int | tuple[int, ...] | None = None
    tokens_per_batch: int | tuple[int, ...] | None = None
    seconds_per_step: float | None = None
    max_steps: int | None = None
    sanity_eval: bool | None = None
    batches_per_epoch: int | None = None

    @property
    def per_batch(self) -> bool:
        """Epochs counted in batches: ``batches_per_epoch`` or a per-batch list given."""
        return self.batches_per_epoch is not None or isinstance(
            self.samples_per_batch, tuple) or isinstance(self.tokens_per_batch, tuple)

    def per_batch_problem(self) -> str | None:
        """Why ``batches_per_epoch`` and the per-batch lists do not fit the rest of the
        table (a list's length, ``steps_per_epoch``, ``epoch_lengths``); ``None``: they do."""
        if not self.per_batch:
            return None
        try:
            RunShape.build(epochs=1, steps_per_epoch=self.steps_per_epoch,
                           epoch_lengths=self.epoch_lengths,
                           batches_per_step=self.batches_per_step or 1,
                           samples_per_batch=self.samples_per_batch or 0,
                           tokens_per_batch=self.tokens_per_batch or 0,
                           batches_per_epoch=self.batches_per_epoch)
        except (TypeError, ValueError) as exc:
            return str(exc)
        return None

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
            if spe is None and not self.per_batch:
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
            seconds_per_step=self.seconds_per_step or 0.0, max_steps=self.max_steps,
            batches_per_epoch=self.batches_per_epoch)


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
    run: RunConfig | None = None
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


def __getattr__(name: str) -> Any:
    if name == "RunSpec":  # the [run] table's old record, kept for one minor version
        import warnings

        from schedtrain.compat import REMOVED_IN

        warnings.warn("schedtrain.spec.RunSpec is now schedtrain.spec.RunConfig (the options "
                      f"of a run from [run] or Trainer(...)); RunSpec stops working in "
                      f"{REMOVED_IN}", DeprecationWarning, stacklevel=2)
        return RunConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
