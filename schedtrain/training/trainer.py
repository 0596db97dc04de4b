"""``Trainer``: a PyTorch training run whose callbacks fire on a compiled trigger table.

The trainer is the run's public face and what callbacks see (a ``TrainingContext``). Its
options are one ``RunConfig`` checked once (``spec.config``), its parts one record
(``training.parts``: the loop, the dispatcher, checkpoints...), its lifecycle ``training.fit``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from schedtrain.checkpoints import Checkpoints
from schedtrain.clock import LoopClock
from schedtrain.errors import ArgumentError
from schedtrain.monitors.store import Sink
from schedtrain.schedule.firings import Firing
from schedtrain.schedule.schedule import Schedule
from schedtrain.spec.config import run_config
from schedtrain.spec.deadlines import DEFAULT_SIGNALS
from schedtrain.spec.run import DEFAULT_KEEP_FIRINGS, RunConfig
from schedtrain.training.batches import to_device
from schedtrain.training.binding import Bound, bind_checked
from schedtrain.training.data_position import seed_everything
from schedtrain.training.device import autocast, resolve_device
from schedtrain.training.dispatch import Dispatcher
from schedtrain.training.fit import Lifecycle
from schedtrain.training.parts import StepFn, build_parts, epoch_length
from schedtrain.training.renamed import RenamedNames
from schedtrain.training.stage import Stopped
from schedtrain.training.steps import Step
from schedtrain.triggers.protocol import Predicate

__all__ = ["Trainer"]


class Trainer(RenamedNames):
    """Train ``model`` with callbacks whose *when* is a trigger.

    Args:
        model: the module to train (moved to ``device``).
        optimizer: its optimizer.
        train_data: an iterable of batches (a ``DataLoader``, an ``IterableDataset``...).
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
        deadline: an ISO time or a duration from the start of training (``"23 h"``);
            the earlier of it and ``SLURM_JOB_END_TIME`` is what ``time_left`` and
            ``before_deadline`` count down to.
        preempt_signals: the signals that do so (default SIGTERM and SIGINT).
        preempt_notice: ``"aws"``, ``"gce"``, ``"aws+http://HOST:PORT"``: a spot notice
            from that metadata server preempts, with its deadline (docs/checkpoints.md).
        strategy: on several processes (``torchrun``): ``"ddp"`` (``"auto"``) or
            ``"fsdp"`` (FSDP2); ignored on one process. See docs/distributed.md.
        shard_data: on several processes, give a plain ``DataLoader`` (training and
            validation) a ``DistributedSampler``.
        reduce: metric name -> ``"mean"`` (default), ``"sum"``, ``"max"`` or ``"min"``:
            how values put on several processes are combined.
        log_events: write ``RUN_DIR/events.jsonl`` (every scalar and firing).
        sanity_eval_batches: with N > 0, fire ``sanity_eval`` once before ``train_start``
            (a fresh run only, not on resume): an ``InferenceRunner`` whose trigger names
            it evaluates at most N batches and puts no metric (Lightning's
            ``num_sanity_val_steps``). 0: no sanity evaluation.
        checkpoint_dir: where ``RUN_DIR/checkpoints`` really is: another folder or an
            fsspec URL (``s3://bucket/run/checkpoints``); needs ``run_dir``. Paths
            callbacks give under ``RUN_DIR/checkpoints`` stand for its files (see
            docs/checkpoints.md, "Object storage").
        storage_options: the URL's filesystem options (credentials, ``client_kwargs``).
        checkpoint_mode: ``"async"`` (default): a save blocks the loop only to copy the
            state to host memory; one background thread writes and commits it. ``"sync"``:
            the loop waits for the file. Both write the same bytes (docs/checkpoints.md).
        checkpoint_busy: a save asked for while another is in flight: ``"wait"``
            (default) for it, or ``"skip"`` the new one; either is logged.
        checkpoint_staging: ``"reuse"`` (default) an async save's host buffers for the
            next snapshot (held between saves), or ``"fresh"`` ones each time.
        checkpoint_write_share: the most of the time (0 < x <= 1) a background write is
            busy while the loop does not wait for it; ``None``: 1 on a device, 0.25 on
            the CPU, where the write and the step share cores (docs/checkpoints.md).
        export: also write the model's weights in these formats (``["safetensors"]``):
            ``RUN_DIR/export/final.safetensors`` when training ends, and beside each
            ``MinSaver``/``MaxSaver`` best checkpoint (docs/checkpoints.md).
        schedule_change: resuming a checkpoint saved with another schedule: ``"refuse"``
            (default; ``ScheduleChanged`` shows the diff of the next firings) or
            ``"apply"`` the new one by the rules of docs/checkpoints.md.
        mtbf, failure_rate, max_checkpoint_overhead: ``every("auto")``'s (checkpoints.md).
        config: the options above as one ``RunConfig`` (then give none of them).
        prepared: instead of ``callbacks``/``schedule``/``bindings``, a schedule already
            bound and order-checked (``schedtrain.training.binding.bind_checked``, or
            ``prepare_run``'s ``bound``); when its ``seeded`` is ``config.seed`` the
            random streams were seeded before the model was built and are not seeded
            again (``schedtrain train`` seeds once).
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
        strategy: str = "auto", shard_data: bool = True,
        reduce: Mapping[str, str] | None = None,
        log_events: bool = True,
        sanity_eval_batches: int = 0,
        checkpoint_dir: str | Path | None = None,
        storage_options: Mapping[str, Any] | None = None,
        checkpoint_mode: str = "async",
        checkpoint_busy: str = "wait",
        checkpoint_staging: str = "reuse",
        checkpoint_write_share: float | None = None,
        export: Iterable[str] = (),
        deadline: str | None = None,
        preempt_signals: Sequence[str] = DEFAULT_SIGNALS,
        preempt_notice: str | None = None,
        schedule_change: str = "refuse", mtbf: str | None = None,
        failure_rate: float | None = None, max_checkpoint_overhead: str | float | None = None,
        config: RunConfig | None = None,
        prepared: Bound | None = None,
    ) -> None:
        options = {k: v for k, v in locals().items() if k in _OPTION_KEYWORDS}
        if (loss_fn is None) == (step_fn is None):
            raise TypeError("give exactly one of `loss_fn` and `step_fn`")
        if config is None:
            if isinstance(device, torch.device):
                options["device"] = str(device)
            config = run_config(**options)
        else:
            changed = sorted(k for k, v in options.items() if v != _OPTION_DEFAULTS[k])
            if changed:
                raise TypeError(f"give the run's options in `config` or as keywords, not "
                                f"both: {', '.join(changed)} given beside config=")
        _check_python_rules(config)
        #: the run's options, checked (``[run]``'s keys, or the keywords of the same names)
        self.config: RunConfig = config
        resolved = resolve_device(device if isinstance(device, torch.device)
                                  else config.device)
        if prepared is None or prepared.seeded != config.seed:
            seed_everything(config.seed)
        if prepared is None:
            prepared = bind_checked(callbacks, schedule, bindings)
        elif callbacks is not None or schedule is not None or bindings is not None:
            raise TypeError("give the schedule as `prepared` or as `callbacks`/`schedule`/"
                            "`bindings`, not both")
        parts = build_parts(config, resolved, model=model, optimizer=optimizer,
                            train_data=train_data, val_data=val_data, loss_fn=loss_fn,
                            step_fn=step_fn, bound=prepared, sinks=sinks,
                            predicates=predicates, clock=clock)
        self._parts = parts
        self._run = Lifecycle(parts, config, self)
        self.loss_fn, self.step_fn = loss_fn, step_fn
        self.comm, self.device, self.model = parts.comm, parts.device, parts.model
        #: the module steps run through (DDP's wrapper on several processes)
        self.train_model, self.optimizer = parts.train_model, parts.optimizer
        self.train_data, self.val_data = parts.train_data, parts.val_data
        self.clock, self.schedule, self.callbacks = parts.clock, parts.schedule, parts.callbacks
        self.table, self.metrics = parts.table, parts.metrics
        self.dispatch: Dispatcher = parts.dispatch
        #: the run's checkpoints: written, read, queued during events, pruned
        self.checkpoints: Checkpoints = parts.checkpoints
        self.steps_in_epoch: int | None = parts.loop.steps_in_epoch
        self.retimer = parts.control.retimer  # .retime(schedule): live retime

    # -- options (the rest: ``trainer.config``) ------------------------------------------------
    @property
    def precision(self) -> str:
        """``config.precision``."""
        return self.config.precision

    @property
    def run_dir(self) -> Path | None:
        """Where ``events.jsonl``, ``run.json`` and checkpoints go (``None``: nowhere)."""
        return self.config.run_path

    def set_grad_accum(self, n: int) -> None:
        """Micro-batches per optimizer step from the next epoch on (called before it starts,
        as ``GradientAccumulationScheduler`` does: within an epoch it must stay constant)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"grad_accum must be a whole number >= 1, got {n!r}")
        loop = self._parts.loop
        if not isinstance(loop.step, Step):
            raise RuntimeError("this trainer's step keeps one micro-batch per step: give the "
                               "callback that changes it a class attribute sets_grad_accum = "
                               "True")
        self.config = self._run.config = attrs.evolve(self.config, grad_accum=n)
        loop.step.accum = n
        self.steps_in_epoch = loop.steps_in_epoch = epoch_length(self.train_data, n)

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

    def autocast(self) -> Any:
        """The autocast context of the configured precision (a no-op for fp32)."""
        return autocast(self.config.precision, self.device)

    def to_device(self, batch: Any) -> Any:
        """``batch`` with every tensor moved to the training device."""
        return to_device(batch, self.device) if self.device.type != "cpu" else batch

    @property
    def last_loss(self) -> torch.Tensor | None:
        """The last optimizer step's loss, detached and on the device (``None`` before one)."""
        return self._parts.losses.last

    def nonfinite_loss_step(self) -> int | None:
        """The first step whose training loss was NaN or infinite (``None``: none); kept
        only when a callback's class sets ``watches_loss`` (``TerminateOnNaN``). Reading it
        synchronises with the device. On several processes it is the first over the
        ranks, the same on all: every rank must ask at the same point (one collective)."""
        first = self._parts.losses.first_nonfinite(self.clock.step)
        if self.comm is None:
            return first
        (agreed,), _ = self.comm.reduce_floats([None if first is None else float(first)],
                                               ["min"])
        return None if agreed is None else int(agreed)

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (on several processes one collective:
        every rank must ask at the same point); ``flag`` itself on one process."""
        return flag if self.comm is None else self.comm.any(flag)

    @property
    def firings(self) -> list[Firing]:
        """The recent firings (``keep_firings``), oldest first: ``FiringLog(trainer.firings)``."""
        return list(self.dispatch.firings)

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

    # -- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self, path: str | Path,
                        on_saved: Callable[[Path], None] | None = None) -> None:
        """Write a resumable checkpoint to ``path`` (atomically, with a checksum).

        During ``fit`` (from a callback) the write happens once every callback firing at
        the current event has run, so a resumed run continues exactly after that event.
        ``on_saved(path)`` is called with the path written (``-nonfinite`` added when the
        weights or loss are not finite).
        """
        self._run.save(Path(path), on_saved)

    def written_checkpoints(self) -> list[Path]:
        """Checkpoints this run wrote (across resumes), oldest first; pruning keeps to these."""
        return self.checkpoints.paths()

    def delete_checkpoint(self, path: str | Path) -> bool:
        """Delete a checkpoint this run wrote (a saver's pruning); another path is left
        alone. Returns whether it was one of this run's."""
        return self.checkpoints.delete(Path(path))

    def load_weights(self, path: str | Path) -> None:
        """Load the model and optimizer states of checkpoint ``path`` (checked against its
        checksum), nothing else: the clock, metrics and callbacks stay as they are."""
        self.checkpoints.load_weights(Path(path))

    def export_checkpoint(self, checkpoint: str | Path, path: str | Path) -> Path | None:
        """With ``export``: the weights of the written ``checkpoint`` also as safetensors
        at ``path`` (on the chief; ``None`` when nothing is written here)."""
        return self.checkpoints.write_export(Path(path), Path(checkpoint))

    def resume(self, path: str | Path) -> Path | str | None:
        """Restore a checkpoint (checked against its checksum); ``fit`` then continues it:
        a file, or the URL of one in this run's object-store ``checkpoint_dir`` (another
        URL, or one not there, is refused before anything changes: ``UnresumableCheckpoint``).
        ``"auto"`` picks as ``--resume auto`` does: the newest checkpoint of
        ``RUN_DIR/checkpoints`` (or of ``checkpoint_dir``) that loads, matches its checksum
        and is finite, each one passed over logged; with none, the run starts over. Returns
        the checkpoint restored, as a path or URL (``None``: started over)."""
        if path == "auto":
            return self._run.resume_newest()
        found, shown = self.checkpoints.mount.given(path)
        self._run.resume(found)
        return shown

    def start_over(self) -> None:
        """Fit from the start in a run directory that holds a run with nothing valid to
        resume (``--resume auto`` without a good checkpoint): its files stay, its
        ``events.jsonl`` starts anew."""
        self._run.start_over()

    # -- the run -------------------------------------------------------------------------------
    def fit(self) -> None:
        """Train until ``max_epochs``/``max_steps``, a stop, a signal or an exception.

        Raises:
            RunDirError: ``run_dir`` is in use, holds another run, or its run finished.
            Preempted: SIGTERM or SIGINT arrived; a checkpoint was written first.
        """
        self._run.fit()

    @property
    def stopped(self) -> Stopped | None:
        """How the last ``fit`` stopped early (``StopTraining``, ``request_stop``): its
        ``reason``, and the ``place`` a callback raised ``StopTraining`` (``None``: it
        did not stop early)."""
        return self._run.stopped

    @property
    def outcome(self) -> str | None:
        """How the last ``fit`` ended (or is ending, in ``after_train`` hooks):
        ``"finished"``, ``"stopped"``, ``"failed"``, ``"preempted"``; ``None`` while it runs."""
        return self._run.outcome

    def __repr__(self) -> str:
        return (f"<Trainer {len(self.callbacks)} callbacks, step {self.clock.step}, "
                f"epoch {self.clock.epoch}>")


#: ``Trainer``'s keywords that are options (``RunConfig``'s fields), and their defaults.
#: ``sinks`` is not: ``Trainer`` takes sink objects, ``[run] sinks`` names them.
_OPTION_DEFAULTS: dict[str, Any] = {
    name: p.default for name, p in inspect.signature(Trainer.__init__).parameters.items()
    if name in {a.name for a in attrs.fields(RunConfig)} and name != "sinks"}
_OPTION_KEYWORDS = frozenset(_OPTION_DEFAULTS)


def _check_python_rules(config: RunConfig) -> None:
    """What Python's keywords need beyond ``[run]``'s rules (a spec always has a run
    directory, and ``train`` checks it ends)."""
    if config.max_epochs is None and config.max_steps is None:
        raise ArgumentError("max_epochs", "give `max_epochs` or `max_steps` (or both): "
                            "training must end")
    if config.checkpoint_dir is not None and config.run_dir is None:
        raise ArgumentError("checkpoint_dir", "`checkpoint_dir` needs a `run_dir` (which "
                            "holds run.json and the log); give Trainer(run_dir=...)")
