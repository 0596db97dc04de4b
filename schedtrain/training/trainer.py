"""``Trainer``: a PyTorch training run whose callbacks fire on a compiled trigger table.

The trainer wires the run's parts and is what callbacks see (a ``TrainingContext``):
the loop (``training.loop``) with its step strategy (``training.steps``), the one event
dispatcher (``training.dispatch``), the checkpoint owner (``schedtrain.checkpoints``) with
what it saves of the run (``training.run_state``), the run directory
(``training.run_dir``) and preemption (``training.preempt``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from schedtrain.checkpoints import Checkpoints, checkpoint_name
from schedtrain.clock import LoopClock
from schedtrain.distributed.comm import check_reduce, reraise_on_all
from schedtrain.distributed.setup import prepare
from schedtrain.errors import Preempted, RunDirError
from schedtrain.monitors.jsonl import JsonlWriter
from schedtrain.monitors.store import MetricStore, Sink
from schedtrain.schedule.firings import Firing, FiringLog
from schedtrain.schedule.schedule import Schedule
from schedtrain.spec.metrics import TRAINER_METRICS
from schedtrain.training.batches import to_device
from schedtrain.training.binding import bind, check_order
from schedtrain.training.data_position import DataPosition, seed_everything
from schedtrain.training.dispatch import DEFAULT_KEEP_FIRINGS, Dispatcher
from schedtrain.training.fit import fit_run
from schedtrain.training.loop import Loop
from schedtrain.training.losses import LossKeeper
from schedtrain.training.options import Options, StepFn
from schedtrain.training.parts import make_agreement
from schedtrain.training.preempt import Guard
from schedtrain.training.run_dir import RunDirectory
from schedtrain.training.run_state import RunState
from schedtrain.training.steps import Step
from schedtrain.triggers.protocol import Predicate

__all__ = ["Trainer"]


class Trainer:
    """Train ``model`` with callbacks whose *when* is a trigger.

    Args:
        model: the module to train (moved to ``device``).
        optimizer: its optimizer.
        train_data: an iterable of batches (a ``DataLoader``, a ``StatefulDataLoader``;
            an ``IterableDataset`` works: the epoch ends when the data does).
        loss_fn: ``loss_fn(model(inputs), targets)`` for batches ``(inputs, targets)``.
        step_fn: instead of ``loss_fn``: ``step_fn(model, batch)`` returning the loss or a
            mapping with a ``"loss"`` entry (and any other outputs).
        callbacks: ``Callback`` objects (run by their ``default_trigger``) and
            ``Scheduled`` values (``PeriodicTrigger(cb, ...)``, ``Scheduled(trigger, cb)``).
        schedule: a ``Schedule`` (from Python or a TOML spec); entries without a callback
            object are bound by name from ``bindings``.
        bindings: name to callback for ``schedule``.
        val_data: validation batches, used by ``InferenceRunner``.
        max_epochs, max_steps: when training ends (at least one is required).
        device: ``"auto"`` (CUDA when present), ``"cpu"``, ``"cuda"``, ``"cuda:N"``.
        precision: ``"fp32"``, ``"bf16"`` (autocast) or ``"fp16"`` (autocast + GradScaler).
        grad_accum: micro-batches per optimizer step.
        grad_clip: clip the gradient norm to this value (``None``: no clipping).
        seed: seeds Python, torch and NumPy at construction.
        run_dir: where ``events.jsonl``, ``run.json`` and checkpoints go (``None``: nothing
            written). A directory holding a run is refused unless resuming or ``overwrite``.
        overwrite: start afresh in a ``run_dir`` that holds a run (its files are removed).
        sinks: extra metric writers (``TensorBoardWriter``, ``ConsolePrinter``).
        predicates: named predicates for ``when("name")`` conditions.
        clock: the loop's clock (default: a new ``LoopClock``); give one with a fake
            ``time_source`` to make wall-time triggers exact in tests.
        keep_firings: how many recent firings ``firings`` keeps in memory (``None``: all);
            ``events.jsonl`` has them all.
        handle_signals: SIGTERM/SIGINT checkpoint and stop the run (``Preempted``).
        strategy: on several processes (``torchrun``): ``"ddp"`` (``"auto"``) or
            ``"fsdp"`` (FSDP2); ignored on one process. See docs/distributed.md.
        shard_data: on several processes, give a plain ``DataLoader`` (training and
            validation) a ``DistributedSampler``.
        reduce: metric name -> ``"mean"`` (default), ``"sum"``, ``"max"`` or ``"min"``:
            how values put on several processes are combined.
        log_events: write ``RUN_DIR/events.jsonl`` (every scalar and firing).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        train_data: Iterable[Any],
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
        step_fn: StepFn | None = None,
        *,
        callbacks: Iterable[Any] | Schedule | None = None,
        schedule: Schedule | None = None,
        bindings: Mapping[str, Any] | None = None,
        val_data: Iterable[Any] | None = None,
        max_epochs: int | None = None,
        max_steps: int | None = None,
        device: str | torch.device = "auto",
        precision: str = "fp32",
        grad_accum: int = 1,
        grad_clip: float | None = None,
        seed: int = 0,
        run_dir: str | Path | None = None,
        overwrite: bool = False,
        sinks: Iterable[Sink] = (),
        predicates: Mapping[str, Predicate] | None = None,
        clock: LoopClock | None = None,
        keep_firings: int | None = DEFAULT_KEEP_FIRINGS,
        handle_signals: bool = True,
        strategy: str = "auto",
        shard_data: bool = True,
        reduce: Mapping[str, str] | None = None,
        log_events: bool = True,
    ) -> None:
        self.options = Options.check(loss_fn=loss_fn, step_fn=step_fn, max_epochs=max_epochs,
                                     max_steps=max_steps, precision=precision,
                                     grad_accum=grad_accum, grad_clip=grad_clip)
        seed_everything(seed)
        check_reduce(reduce or {})
        ready = prepare(model=model, optimizer=optimizer, train_data=train_data,
                        val_data=val_data, device=self.options.resolve_device(device),
                        strategy=strategy, shard_data=shard_data, seed=seed)
        self.comm, self.device, self.model = ready.comm, ready.device, ready.model
        #: the module steps run through (DDP's wrapper on several processes)
        self.train_model, optimizer = ready.train_model, ready.optimizer
        train_data, val_data = ready.train_data, ready.val_data
        self.strategy = strategy
        self.optimizer, self.train_data, self.val_data = optimizer, train_data, val_data
        self.loss_fn, self.step_fn = loss_fn, step_fn
        self.max_epochs, self.max_steps, self.seed = max_epochs, max_steps, seed
        self.precision, self.grad_accum, self.grad_clip = precision, grad_accum, grad_clip
        self.overwrite, self.handle_signals = overwrite, handle_signals
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.directory = RunDirectory(self.run_dir) if self.run_dir is not None else None
        # An empty mapping, not None: at run time conditions are decided, never "unknown".
        self.predicates: dict[str, Predicate] = dict(predicates or {})
        self.clock = clock if clock is not None else LoopClock()
        self.scaler: Any = (torch.amp.GradScaler(self.device.type)
                            if precision == "fp16" else None)
        self.schedule, self.callbacks = bind(callbacks, schedule, bindings)
        check_order(self.schedule, self.callbacks)
        produced = set(TRAINER_METRICS).union(*(cb.produces for cb in self.callbacks))
        self.table = self.schedule.compile(predicates=self.predicates,
                                           produced_metrics=produced)
        by_name = dict(zip(self.schedule.names, self.callbacks, strict=True))
        chief = self.comm is None or self.comm.is_chief
        if not chief:  # the chief alone writes the run directory and the logs
            self.directory = None
        self._events = (JsonlWriter(self.directory.events)
                        if self.directory and log_events else None)
        self.metrics = MetricStore(self.clock.now, [w for w in (self._events,) if w]
                                   + (list(sinks) if chief else []))
        self._losses = LossKeeper()
        self._position = DataPosition(train_data)
        #: the run's checkpoints: written, read, queued during events, pruned
        self.checkpoints = Checkpoints(RunState(
            model=self.model, optimizer=optimizer, scaler=self.scaler, clock=self.clock,
            table=self.table, callbacks=by_name, metrics=self.metrics, losses=self._losses,
            data=self._position, epoch_open=lambda: self._loop.epoch_open,
            events=self._events), run_dir=self.run_dir, comm=self.comm)
        self._guard = Guard()
        self.agreement = make_agreement(
            self.comm, callbacks=by_name, reduce=reduce or {}, clock=self.clock,
            guard=self._guard, on_preempt=self._preempt, table=self.table,
            losses=self._losses, max_steps=self.max_steps)
        self.dispatch = Dispatcher(
            self.table, callbacks=by_name, agreement=self.agreement,
            gates={e.default_name(): e.gate for e in self.schedule.entries},
            metrics=self.metrics, before_firing=self._publish_loss,
            saves=self.checkpoints, keep_firings=keep_firings)
        if self.comm is not None:
            self._losses.reduce = self.comm.mean_tensor
            self._losses.reduce_number = self.comm.mean_number
        self.steps_in_epoch: int | None = self._epoch_len()
        self._loop = self._make_loop()
        self._setup_done = self._resumed = self._owns_dir = self._loop_running = False
        self._start_over = False
        self._resume_phase: str | None = None
        self.stopped_early = False
        self.stop_reason: str | None = None
        #: where a callback raised ``StopTraining`` itself (``None``: ``request_stop``)
        self.stop_place: str | None = None

    # -- wiring --------------------------------------------------------------------------------
    def _epoch_len(self) -> int | None:
        try:
            n = len(self.train_data)  # type: ignore[arg-type]
        except TypeError:
            return None
        return -(-n // self.grad_accum)

    def _make_loop(self) -> Loop:
        return Loop.build(
            model=self.train_model, optimizer=self.optimizer, loss_fn=self.loss_fn,
            step_fn=self.step_fn, grad_accum=self.grad_accum, grad_clip=self.grad_clip,
            device=self.device, scaler=self.scaler,
            autocast=self.autocast if self.precision != "fp32" else None,
            clock=self.clock, table=self.table, dispatch=self.dispatch, losses=self._losses,
            position=self._position, guard=self._guard, max_epochs=self.max_epochs,
            max_steps=self.max_steps, steps_in_epoch=self.steps_in_epoch,
            publish_loss=self._publish_loss, agreement=self.agreement,
            variable_accum=any(getattr(cb, "sets_grad_accum", False) for cb in self.callbacks))

    def set_grad_accum(self, n: int) -> None:
        """Micro-batches per optimizer step from the next epoch on (called before it starts,
        as ``GradientAccumulationScheduler`` does: within an epoch it must stay constant)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"grad_accum must be a whole number >= 1, got {n!r}")
        step = self._loop.step
        if not isinstance(step, Step):
            raise RuntimeError("this trainer's step keeps one micro-batch per step: give the "
                               "callback that changes it a class attribute sets_grad_accum = "
                               "True")
        self.grad_accum = step.accum = n
        self.steps_in_epoch = self._loop.steps_in_epoch = self._epoch_len()

    # -- what callbacks see ------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank in ``torch.distributed`` (0 when not distributed)."""
        if self.comm is not None:
            return self.comm.rank
        dist = torch.distributed
        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0

    @property
    def world_size(self) -> int:
        """How many processes train together (1 without ``torchrun``)."""
        return self.comm.size if self.comm is not None else 1

    def close(self) -> None:
        """Destroy the process group schedtrain created (several processes; at exit)."""
        if self.comm is not None:
            self.comm.close()

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The autocast context of the configured precision (a no-op for fp32)."""
        if self.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def to_device(self, batch: Any) -> Any:
        """``batch`` with every tensor moved to the training device."""
        return to_device(batch, self.device) if self.device.type != "cpu" else batch

    @property
    def last_loss(self) -> torch.Tensor | None:
        """The last optimizer step's loss, detached and on the device (``None`` before one)."""
        return self._losses.last

    @property
    def firings(self) -> list[Firing]:
        """The most recent firings (``keep_firings`` of them), oldest first."""
        return list(self.dispatch.firings)

    @property
    def firing_log(self) -> FiringLog:
        """The most recent firings, as ``simulate()`` reports them."""
        return FiringLog(self.dispatch.firings)

    def fire(self, event: str, **payload: Any) -> tuple[str, ...]:
        """Fire a declared custom event, or an ``eval_*`` event, now; the names that ran."""
        if event not in self.schedule.events and not event.startswith("eval_"):
            raise ValueError(f"event {event!r} is not declared on the schedule "
                             f"(declared: {list(self.schedule.events) or 'none'})")
        return self.dispatch.fire(event, payload)

    @property
    def payload(self) -> dict[str, Any]:
        """The keyword arguments of the event being fired (``fire(event, value=...)``)."""
        return self.dispatch.payload

    def request_stop(self, reason: str) -> None:
        """End training once the current event is over, as ``StopTraining`` does."""
        self.dispatch.request_stop(reason)

    def _publish_loss(self) -> None:
        if self.clock.step > self._losses.since:
            self._losses.publish(self.metrics, self.clock.step)

    # -- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self, path: str | Path,
                        on_saved: Callable[[Path], None] | None = None) -> None:
        """Write a resumable checkpoint to ``path`` (atomically, with a checksum).

        During ``fit`` (from a callback) the write happens once every callback firing at
        the current event has run, so a resumed run continues exactly after that event.
        ``on_saved(path)`` is called with the path written (``-nonfinite`` added when the
        weights or loss are not finite).
        """
        path = Path(path)
        if self._setup_done and self._loop_running:
            self.checkpoints.request(path, on_saved)
            return
        written = self.checkpoints.write(path, "manual")
        if on_saved is not None:
            on_saved(written)

    def written_checkpoints(self) -> list[Path]:
        """Checkpoints this run wrote (across resumes), oldest first; pruning keeps to these."""
        return self.checkpoints.paths()

    def delete_checkpoint(self, path: str | Path) -> bool:
        """Delete a checkpoint this run wrote (a saver's pruning); another path is left
        alone. Returns whether it was one of this run's."""
        return self.checkpoints.delete(Path(path))

    def resume(self, path: str | Path) -> None:
        """Restore a checkpoint (checked against its checksum); ``fit`` then continues it."""
        state = self.checkpoints.read(Path(path))
        run = state["run"]
        self._resumed = True
        self._resume_phase = state["phase"]
        self._loop.resume_inside_epoch = bool(run["epoch_open"])
        self._loop.epoch_open = bool(run["epoch_open"])

    def start_over(self) -> None:
        """Fit from the start in a run directory that holds a run with nothing valid to
        resume (``--resume auto`` without a good checkpoint): its files stay, its
        ``events.jsonl`` starts anew."""
        self._start_over = True

    def _preempt(self, signal_name: str) -> None:
        self.dispatch.fire("preempt")
        written = None
        if self.run_dir is not None:
            written = self.checkpoints.write(self.run_dir / "checkpoints"
                                             / checkpoint_name(self.clock.step), "preempt")
        raise Preempted(signal_name, self.clock.step, written)

    # -- the run -------------------------------------------------------------------------------
    def _open_directory(self) -> None:
        failed: RunDirError | None = None
        try:
            self._open_own_directory()
        except RunDirError as exc:
            failed = exc
        if self.comm is not None:  # the chief's answer is every rank's
            failed = reraise_on_all(self.comm, failed)
        if failed is not None:
            raise failed

    def _open_own_directory(self) -> None:
        if self.directory is None:
            return
        if not self._owns_dir:  # a second fit() of this trainer continues its own run
            fresh = not self._resumed
            self.directory.open_for_run(
                fresh=fresh and not self._start_over, overwrite=self.overwrite,
                ends_at=(self.max_epochs, self.max_steps) if self._resumed else None)
            if fresh and self._events is not None:
                self._events.truncate(0)
            self._owns_dir = True
        self.directory.acquire()

    def _at_end(self) -> bool:
        """Whether the clock has reached ``max_epochs`` or ``max_steps``."""
        return ((self.max_epochs is not None and self.clock.epoch >= self.max_epochs)
                or (self.max_steps is not None and self.clock.step >= self.max_steps))

    def _record(self, status: str) -> None:
        if self.directory is not None and self._owns_dir:
            ts = self.clock.now()
            self.directory.record(status, step=ts.step, epoch=ts.epoch)

    def fit(self) -> None:
        """Train until ``max_epochs``/``max_steps``, a stop, a signal or an exception.

        Raises:
            RunDirError: ``run_dir`` is in use, holds another run, or its run finished.
            Preempted: SIGTERM or SIGINT arrived; a checkpoint was written first.
        """
        fit_run(self)

    def __repr__(self) -> str:
        return (f"<Trainer {len(self.callbacks)} callbacks, step {self.clock.step}, "
                f"epoch {self.clock.epoch}>")
