"""``LearningRateMonitor`` (log each param group's lr), ``LRScheduler`` (step a torch one) and
``GradientAccumulationScheduler`` (micro-batches per step by epoch).

``LRScheduler`` takes any ``torch.optim.lr_scheduler`` object, a function of the
optimizer returning one, or, from TOML, a class name and its arguments: the name is
looked up in ``torch.optim.lr_scheduler`` (or written ``"package.module:Class"``) and the
arguments are checked against the class's signature before anything is called.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch

from schedtrain.callbacks.base import Callback
from schedtrain.imports import IMPORT_PATH_RE, import_class
from schedtrain.triggers import Trigger, every

__all__ = ["GradientAccumulationScheduler", "LRScheduler", "LearningRateMonitor"]


class LearningRateMonitor(Callback):
    """Log every param group's learning rate when fired (default: every step).

    Metrics: ``lr/group0``, ``lr/group1``... and, when a group has one, its momentum
    (``momentum``, or ``betas[0]`` for Adam-like optimizers) as ``momentum/group0``...
    With a single param group, ``lr`` (and ``momentum``) are logged as well, so a
    condition can read ``lr < 1e-4``.

    The values are those the last completed step used: read at the event, before any
    callback firing there (an ``LRScheduler``, a ``ScheduledHyperParamSetter``) changes
    them, so the log is the same wherever it is declared. Nothing is logged before the
    first step (no step has used a rate yet).

    Args:
        momentum: also log the momentum.
    """

    may_stop_alone: ClassVar[bool] = False

    default_trigger: ClassVar[Trigger] = every("1 step")

    def __init__(self, momentum: bool = True) -> None:
        self.log_momentum = momentum
        # the names a single param group gives; made exact at setup
        self.produces = ("lr", "lr/group0") + (("momentum", "momentum/group0")
                                               if momentum else ())
        #: (step, the values that step used, by metric name), read before the firings of
        #: the first event at that step where anything fired
        self._used: tuple[int, dict[str, float]] | None = None

    def _setup(self) -> None:
        groups = self.optimizer.param_groups
        names = [f"lr/group{i}" for i in range(len(groups))]
        if self.log_momentum:
            names += [f"momentum/group{i}" for i, g in enumerate(groups) if _momentum(g)]
        if len(groups) == 1:
            names += [n.split("/")[0] for n in names]
        self.produces = tuple(names)

    def _read(self) -> dict[str, float]:
        groups = self.optimizer.param_groups
        values: dict[str, float] = {}
        for i, group in enumerate(groups):
            values[f"lr/group{i}"] = float(group["lr"])
            m = _momentum(group) if self.log_momentum else None
            if m is not None:
                values[f"momentum/group{i}"] = m
        if len(groups) == 1:
            values.update({n.split("/")[0]: v for n, v in list(values.items())})
        return values

    def _before_firings(self) -> None:
        # The first event at a step where anything fires sees what that step used: only
        # callbacks firing at events change the optimizer between steps.
        step = self.now.step
        if self._used is None or self._used[0] != step:
            self._used = (step, self._read())

    def _trigger(self) -> None:
        step = self.now.step
        if step == 0:
            return
        used = self._used[1] if self._used is not None and self._used[0] == step else None
        for name, value in (used if used is not None else self._read()).items():
            self.metrics.put(name, value)

    def state_dict(self) -> dict[str, Any]:
        return {"used": None if self._used is None else [self._used[0], dict(self._used[1])]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        used = state.get("used")  # absent from checkpoints of 0.2
        self._used = None if used is None else (int(used[0]), {str(k): float(v) for k, v
                                                               in used[1].items()})


def _momentum(group: Mapping[str, Any]) -> float | None:
    if "momentum" in group:
        return float(group["momentum"])
    betas = group.get("betas")
    return float(betas[0]) if betas else None


SchedulerLike = Any
"""A ``torch.optim.lr_scheduler`` object (or anything with ``step`` and ``state_dict``)."""


class LRScheduler(Callback):
    """Step a learning-rate scheduler when fired (default: every step).

    Its state is saved in checkpoints, so a resumed run continues the schedule exactly.

    Args:
        scheduler: a scheduler object; a function ``optimizer -> scheduler``; or a class
            name in ``torch.optim.lr_scheduler`` (``"CosineAnnealingLR"``) or
            ``"package.module:Class"``, built at setup with ``args``.
        args: keyword arguments of the class named by ``scheduler`` (not the optimizer).
        monitor: a metric passed to ``step`` (``ReduceLROnPlateau``); the default trigger
            becomes every epoch.
    """

    may_stop_alone: ClassVar[bool] = False

    default_trigger: ClassVar[Trigger] = every("1 step")

    def __init__(self, scheduler: SchedulerLike | Callable[[torch.optim.Optimizer], Any] | str,
                 args: Mapping[str, Any] | None = None, monitor: str | None = None) -> None:
        self._factory: Callable[[torch.optim.Optimizer], Any] | None = None
        self.scheduler: Any = None
        if isinstance(scheduler, str):
            cls = _scheduler_class(scheduler)
            kwargs = dict(args or {})
            _check_args(cls, kwargs)
            self._factory = lambda opt: cls(opt, **kwargs)
        elif args is not None:
            raise ValueError("`args` is for a scheduler given by name; got a scheduler "
                             f"object {scheduler!r}")
        elif callable(getattr(scheduler, "step", None)):
            self.scheduler = scheduler
        elif callable(scheduler):
            self._factory = scheduler
        else:
            raise TypeError("`scheduler` must be a torch.optim.lr_scheduler object, a function "
                            f"of the optimizer, or a class name, got {scheduler!r}")
        self.monitor = monitor
        if monitor is not None:
            self.needs = (monitor,)
            self.default_trigger = every("1 epoch")  # type: ignore[misc]
        self._pending: dict[str, Any] | None = None

    def _setup(self) -> None:
        if self.scheduler is None:
            assert self._factory is not None
            # Building a scheduler resets the lr to its start; a resumed optimizer's is kept.
            lrs = [g["lr"] for g in self.optimizer.param_groups]
            self.scheduler = self._factory(self.optimizer)
            if self._pending is not None:
                self.scheduler.load_state_dict(self._pending)
                for g, lr in zip(self.optimizer.param_groups, lrs, strict=True):
                    g["lr"] = lr
                self._pending = None

    def _trigger(self) -> None:
        if self.monitor is None:
            self.scheduler.step()
            return
        got = self.metrics.latest(self.monitor)
        if got is not None:
            self.scheduler.step(got.value)

    def state_dict(self) -> dict[str, Any]:
        if self.scheduler is None:
            return {"scheduler": self._pending}
        return {"scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state["scheduler"]
        if saved is None:
            return
        if self.scheduler is None:  # built at setup, which comes after a resume
            self._pending = saved
        else:
            self.scheduler.load_state_dict(saved)

    def __repr__(self) -> str:
        return f"<LRScheduler {type(self.scheduler).__name__ if self.scheduler else 'unbuilt'}>"


#: Schedulers whose arguments are functions or other schedulers: Python only.
_NEED_OBJECTS = frozenset({"LambdaLR", "MultiplicativeLR", "SequentialLR", "ChainedScheduler"})


def _scheduler_class(name: str) -> type:
    from torch.optim import lr_scheduler

    if IMPORT_PATH_RE.fullmatch(name):
        try:
            return import_class(name, lr_scheduler.LRScheduler, "a scheduler class")
        except ImportError as exc:
            raise ValueError(f"`scheduler`: {exc}") from None

    known = sorted(n for n, c in vars(lr_scheduler).items()
                   if isinstance(c, type) and issubclass(c, lr_scheduler.LRScheduler)
                   and n not in _NEED_OBJECTS and n != "LRScheduler" and n[0] != "_")
    if name in _NEED_OBJECTS:
        raise ValueError(f"`scheduler` {name!r} takes functions or schedulers: build it in "
                         "Python and pass the object (LRScheduler(scheduler=...))")
    if name not in known:
        raise ValueError(f"`scheduler` {name!r} is not a class of torch.optim.lr_scheduler; "
                         f"expected one of {', '.join(known)}, or 'package.module:Class'")
    cls: type = getattr(lr_scheduler, name)
    return cls


def _check_args(cls: type, kwargs: dict[str, Any]) -> None:
    """Refuse arguments the class does not take, or a missing one, before calling it."""
    params = dict(inspect.signature(cls).parameters)
    params.pop(next(iter(params)), None)  # the optimizer, supplied at setup
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for key in kwargs:
        if key not in named and not takes_any:
            raise ValueError(f"`args.{key}`: {cls.__name__} takes no argument {key!r}; it takes "
                             f"{', '.join(named)}")
    missing = [n for n in named if params[n].default is inspect.Parameter.empty
               and n not in kwargs]
    if missing:
        raise ValueError(f"`args`: {cls.__name__} needs {', '.join(repr(m) for m in missing)}")


class GradientAccumulationScheduler(Callback):
    """Change the micro-batches per optimizer step by epoch (Lightning's callback).

    ``schedule={0: 1, 4: 2}``: one micro-batch per step for epochs 0 to 3 (0-based, as
    Lightning counts), two from epoch 4 on; epochs before the first key use 1. It is set
    before each epoch starts, so within an epoch it is constant and every counter
    (``step``, ``step_in_epoch``, ``batch``, ``sample``, ``token``) stays exact; a
    resumed run sets it again before the epoch it resumes. The last step of an epoch may
    hold fewer micro-batches (its gradients are scaled to a mean all the same).

    Its trigger does nothing: it acts before each epoch, whatever the trigger says.

    Args:
        schedule: epoch -> micro-batches per step (TOML: ``schedule = {0 = 1, 4 = 2}``).
    """

    may_stop_alone: ClassVar[bool] = False

    default_trigger: ClassVar[Trigger] = every("1 epoch")
    #: the trainer keeps a step strategy that can change its accumulation
    sets_grad_accum: ClassVar[bool] = True

    def __init__(self, schedule: Mapping[int | str, int]) -> None:
        if not isinstance(schedule, Mapping) or not schedule:
            raise ValueError(f"`schedule` must be a non-empty mapping of epoch to "
                             f"micro-batches per step, got {schedule!r}")
        points: dict[int, int] = {}
        for key, factor in schedule.items():
            epoch = int(key) if isinstance(key, str) and key.isdigit() else key
            if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
                raise ValueError(f"`schedule` keys must be epochs >= 0, got {key!r}")
            if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
                raise ValueError(f"`schedule[{key!r}]` must be a whole number >= 1, "
                                 f"got {factor!r}")
            points[epoch] = factor
        self.schedule = dict(sorted(points.items()))

    def factor(self, epoch: int) -> int:
        """Micro-batches per step during epoch ``epoch`` (0-based)."""
        current = 1
        for start, factor in self.schedule.items():
            if start > epoch:
                break
            current = factor
        return current

    def _before_epoch(self) -> None:
        self.trainer.set_grad_accum(self.factor(self.now.epoch))
