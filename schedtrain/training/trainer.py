"""``Trainer``: a PyTorch loop that drives a ``LoopClock`` and a compiled ``TriggerTable``.

The hot path of a step on which nothing fires is the work itself plus keeping the
step's loss (on the device), counting the step in local variables and one integer
comparison against the next step at which anything can happen: no host-device sync,
no per-callback Python calls (per-event hooks are called only on callbacks that
override them). Losses stay on the device until something that fires needs them.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import structlog
import torch

from schedtrain.callbacks.base import PER_EVENT_HOOKS, Callback, StepOutputs, overrides
from schedtrain.clock import LoopClock
from schedtrain.errors import StopTraining
from schedtrain.monitors.jsonl import JsonlWriter
from schedtrain.monitors.store import MetricStore, Sink
from schedtrain.schedule import HookGate, Schedule
from schedtrain.simulation import Firing, FiringLog
from schedtrain.time import Timestamp
from schedtrain.training.batches import count_batch, to_device
from schedtrain.training.binding import bind, check_order
from schedtrain.training.checkpoint import atomic_save
from schedtrain.triggers.protocol import Predicate

__all__ = ["Trainer"]

_log = structlog.get_logger("schedtrain.training")
_END = object()
_PRECISIONS = ("fp32", "bf16", "fp16")
#: Metrics the trainer itself produces.
TRAINER_METRICS = ("train/loss",)
_PLAIN_SEQ = (tuple, list)
#: Sum the kept step losses into one tensor every this many steps: holding fewer small
#: tensors keeps the allocator's work per step down (measured in benchmarks/bench_loop.py).
_FOLD = 64

StepFn = Callable[[torch.nn.Module, Any], "torch.Tensor | Mapping[str, Any]"]


def _resolve_device(device: str | torch.device) -> torch.device:
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError:
        raise ValueError(
            f"`device` must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None


def _check_positive(name: str, value: int | None, *, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a whole number >= 1"
                         f"{' or None' if allow_none else ''}, got {value!r}")


def seed_everything(seed: int) -> None:
    """Seed Python's, torch's (and NumPy's, when installed) random generators."""
    random.seed(seed)
    torch.manual_seed(seed)
    with contextlib.suppress(ImportError):
        import numpy as np

        np.random.seed(seed % 2**32)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    with contextlib.suppress(ImportError):
        import numpy as np

        state["numpy"] = np.random.get_state()
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])


class Trainer:
    """Train ``model`` with callbacks whose *when* is a trigger.

    Args:
        model: the module to train (moved to ``device``).
        optimizer: its optimizer.
        train_data: an iterable of batches (a ``DataLoader``; an ``IterableDataset``
            works: the epoch ends when the data does).
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
        run_dir: where ``events.jsonl`` and checkpoints go (``None``: nothing written).
        sinks: extra metric writers (``TensorBoardWriter``, ``ConsolePrinter``).
        predicates: named predicates for ``when("name")`` conditions.
        clock: the loop's clock (default: a new ``LoopClock``); give one with a fake
            ``time_source`` to make wall-time triggers exact in tests.
    """

    def __init__(  # noqa: PLR0915 - validation and wiring, read top to bottom
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
        sinks: Iterable[Sink] = (),
        predicates: Mapping[str, Predicate] | None = None,
        clock: LoopClock | None = None,
    ) -> None:
        if (loss_fn is None) == (step_fn is None):
            raise TypeError("give exactly one of `loss_fn` and `step_fn`")
        if max_epochs is None and max_steps is None:
            raise ValueError("give `max_epochs` or `max_steps` (or both): training must end")
        _check_positive("max_epochs", max_epochs, allow_none=True)
        _check_positive("max_steps", max_steps, allow_none=True)
        _check_positive("grad_accum", grad_accum, allow_none=False)
        if precision not in _PRECISIONS:
            raise ValueError(f"`precision` must be one of {_PRECISIONS}, got {precision!r}")
        if grad_clip is not None and not grad_clip > 0:
            raise ValueError(f"`grad_clip` must be > 0 or None, got {grad_clip!r}")
        seed_everything(seed)
        self.device = _resolve_device(device)
        self.model = model.to(self.device)
        self.optimizer = optimizer
        self.train_data = train_data
        self.val_data = val_data
        self.loss_fn = loss_fn
        self.step_fn: StepFn = step_fn or self._default_step
        self.max_epochs = max_epochs
        self.max_steps = max_steps
        self.precision = precision
        self.grad_accum = grad_accum
        self.grad_clip = grad_clip
        self.seed = seed
        self.run_dir = Path(run_dir) if run_dir is not None else None
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
        self._by_name: dict[str, Callback] = dict(zip(self.schedule.names, self.callbacks,
                                                      strict=True))
        self._gates: dict[str, HookGate | None] = {e.default_name(): e.gate
                                                   for e in self.schedule.entries}
        self._hooks = {h: [(cb, self._gates[cb.name or ""]) for cb in self.callbacks
                           if overrides(cb, h)] for h in PER_EVENT_HOOKS}
        sink_list = list(sinks)
        if self.run_dir is not None:
            sink_list.insert(0, JsonlWriter(self.run_dir / "events.jsonl"))
        self.metrics = MetricStore(self.clock.now, sink_list)
        self.firings: list[Firing] = []
        # The losses of the steps since train/loss was last published (at step
        # _loss_from_step), on the device: the latest steps' own, the older ones summed.
        self._losses: list[torch.Tensor] = []
        self._loss_acc: torch.Tensor | None = None
        self._loss_from_step = 0
        self._last_loss: torch.Tensor | None = None
        # event -> the run(name) closure handed to the table
        self._runners: dict[str, Callable[[str, Timestamp], None]] = {}
        self._depth = 0
        self._log_firings = False
        self._pending_saves: list[tuple[Path, Callable[[Path], None] | None]] = []
        self._in_fit = False
        self._resumed = False  # fit() continues a checkpoint: train_start does not fire again
        self._resume_mid_epoch = False
        self._epoch_open = False  # between an epoch's start and its end
        self._epoch_rng: dict[str, Any] | None = None
        self._setup_done = False
        self.stopped_early = False
        self.steps_in_epoch: int | None = self._epoch_len()

    # -- helpers ---------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank in ``torch.distributed`` (0 when not distributed)."""
        dist = torch.distributed
        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0

    def _epoch_len(self) -> int | None:
        try:
            n = len(self.train_data)  # type: ignore[arg-type]
        except TypeError:
            return None
        return -(-n // self.grad_accum)

    def _default_step(self, model: torch.nn.Module, batch: Any) -> dict[str, Any]:
        try:
            inputs, targets = batch
        except (TypeError, ValueError):
            raise TypeError("with `loss_fn`, batches must be (inputs, targets) pairs; "
                            "give `step_fn` for other batch shapes") from None
        out = model(inputs)
        assert self.loss_fn is not None
        return {"loss": self.loss_fn(out, targets), "outputs": out}

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The autocast context of the configured precision (a no-op for fp32)."""
        if self.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    @property
    def last_loss(self) -> torch.Tensor | None:
        """The last optimizer step's loss, detached and on the device (``None`` before one)."""
        return self._losses[-1] if self._losses else self._last_loss

    @property
    def firing_log(self) -> FiringLog:
        """Every firing so far, as ``simulate()`` reports them."""
        return FiringLog(self.firings)

    # -- firing ----------------------------------------------------------------------------
    def _runner(self, event: str) -> Callable[[str, Timestamp], None]:
        run = self._runners.get(event)
        if run is None:
            def run(name: str, now: Timestamp) -> None:
                self._run_callback(name, event, now)
            self._runners[event] = run
        return run

    def _run_callback(self, name: str, event: str, ts: Timestamp) -> None:
        if self.clock.step > self._loss_from_step:
            self._publish_loss()
        self.firings.append(Firing(name, event, ts))
        if self.metrics.sinks:
            self.metrics.firing(name, event, ts)
        if self._log_firings:
            _log.debug("firing", callback=name, trigger_event=event, step=ts.step,
                       epoch=ts.epoch)
        self._depth += 1
        try:
            self._by_name[name].trigger()
        finally:
            self._depth -= 1

    def fire(self, event: str) -> tuple[str, ...]:
        """Fire a custom event (declared on the schedule) now; the names that ran."""
        if event not in self.schedule.events:
            raise ValueError(f"event {event!r} is not declared on the schedule "
                             f"(declared: {list(self.schedule.events) or 'none'})")
        names = self.table.fire(event, self._runner(event))
        self._after_event(event)
        return names

    def _dispatch(self, event: str) -> tuple[str, ...]:
        names = self.table.fire(event, self._runner(event))
        self._after_event(event)
        return names

    def _after_event(self, event: str) -> None:
        if self._depth == 0 and self._pending_saves:
            self._write_saves(event)

    def _run_hooks(self, hook: str, *args: Any) -> None:
        pairs = self._hooks[hook]
        if not pairs:
            return
        now = self.clock.now()
        for cb, gate in pairs:
            if gate is None or gate(now):
                getattr(cb, hook.lstrip("_"))(*args)

    def _fold_losses(self) -> None:
        """Add the kept step losses into the running sum (on the device; no sync)."""
        losses = self._losses
        if not losses:
            return
        self._last_loss = losses[-1]
        dtype = torch.promote_types(losses[-1].dtype, torch.float32)  # no half-precision sums
        total = torch.stack(losses).sum(dtype=dtype)
        self._loss_acc = total if self._loss_acc is None else self._loss_acc + total
        losses.clear()  # in place: the step loop holds this list

    def _publish_loss(self) -> None:
        """Put the mean loss since the last publication (lazily; no sync) as ``train/loss``."""
        self._fold_losses()
        n = self.clock.step - self._loss_from_step
        if n > 0 and self._loss_acc is not None:
            self.metrics.put("train/loss", self._loss_acc / n)
        self._loss_acc = None
        self._loss_from_step = self.clock.step

    def _saved_losses(self) -> tuple[torch.Tensor | None, int, torch.Tensor | None]:
        self._fold_losses()
        return self._loss_acc, self._loss_from_step, self._last_loss

    # -- checkpoints ---------------------------------------------------------------------
    def save_checkpoint(self, path: str | Path,
                        on_saved: Callable[[Path], None] | None = None) -> None:
        """Write a resumable checkpoint to ``path`` (atomically).

        Called during ``fit`` (from a callback), the write happens once every callback
        firing at the current event has run, so a resumed run continues exactly after
        that event. ``on_saved(path)`` is called after the write.
        """
        path = Path(path)
        if self._in_fit:
            self._pending_saves.append((path, on_saved))
            return
        self._write(path, "manual")
        if on_saved is not None:
            on_saved(path)

    def _write_saves(self, phase: str) -> None:
        saves, self._pending_saves = self._pending_saves, []
        for path, on_saved in saves:
            self._write(path, phase)
            if on_saved is not None:
                on_saved(path)

    def _write(self, path: Path, phase: str) -> None:
        state = {
            "format": "schedtrain-checkpoint-1",
            "phase": phase,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "clock": self.clock.state_dict(),
            "table": self.table.state_dict(),
            "callbacks": {n: cb.state_dict() for n, cb in self._by_name.items()},
            "metrics": self.metrics.state_dict(),
            "rng": _rng_state(),
            "epoch_rng": self._epoch_rng,
            "epoch_open": self._epoch_open,
            "losses": self._saved_losses(),
        }
        atomic_save(state, path)
        if structlog.is_configured():
            _log.debug("checkpoint", path=str(path), step=self.clock.step, phase=phase)

    def resume(self, path: str | Path) -> None:
        """Restore a checkpoint written by ``save_checkpoint``; ``fit`` then continues it."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
        state = torch.load(path, map_location=self.device, weights_only=False)
        if not isinstance(state, dict) or state.get("format") != "schedtrain-checkpoint-1":
            raise ValueError(f"{str(path)!r} is not a schedtrain checkpoint")
        saved = set(state["callbacks"])
        if saved != set(self._by_name):
            raise ValueError(
                f"checkpoint {str(path)!r} was saved with callbacks {sorted(saved)}, "
                f"this trainer has {sorted(self._by_name)}")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.clock.load_state_dict(state["clock"])
        self.metrics.load_state_dict(state["metrics"])
        self.table.load_state_dict(state["table"])
        for name, cb_state in state["callbacks"].items():
            self._by_name[name].load_state_dict(cb_state)
        _set_rng_state(state["rng"])
        self._epoch_rng = state["epoch_rng"]
        self._losses.clear()
        self._loss_acc, self._loss_from_step, self._last_loss = state["losses"]
        self._resumed = True
        self._resume_mid_epoch = bool(state["epoch_open"])

    # -- the loop ----------------------------------------------------------------------------
    def fit(self) -> None:
        """Train until ``max_epochs``/``max_steps``, ``StopTraining`` or an exception."""
        clock, table = self.clock, self.table
        if not self._setup_done:
            for cb in self.callbacks:
                cb.setup(self)
            self._setup_done = True
        table.attach(clock, self.metrics, self.predicates)
        self.model.train()
        self._in_fit = True
        # Unconfigured structlog prints every debug line: log firings only when an
        # application (the CLI) has configured it.
        self._log_firings = structlog.is_configured()
        failed: BaseException | None = None
        try:
            for cb in self.callbacks:
                cb.before_train()
            clock.start_train()
            if not self._resumed:
                self._dispatch("train_start")
            self._epochs()
        except StopTraining:
            self.stopped_early = True
            _log.info("stop_training", step=clock.step, epoch=clock.epoch)
            self._write_saves("stopped")
        except BaseException as exc:
            failed = exc
            self._pending_saves = []  # never write a checkpoint of a half-done event
            for cb in self.callbacks:
                with contextlib.suppress(Exception):
                    cb.on_exception(exc)
            raise
        finally:
            try:
                if failed is None:
                    clock.stop_train()
                    with contextlib.suppress(StopTraining):
                        self._dispatch("train_end")
            finally:
                self._in_fit = False
                for cb in self.callbacks:
                    try:
                        cb.after_train()
                    except Exception:
                        if failed is None:
                            raise
                self.metrics.close()

    def _epochs(self) -> None:
        clock = self.clock
        max_epochs = self.max_epochs if self.max_epochs is not None else math.inf
        max_steps = self.max_steps if self.max_steps is not None else math.inf
        while clock.epoch < max_epochs and clock.step < max_steps:
            mid_epoch, self._resume_mid_epoch = self._resume_mid_epoch, False
            self._resumed = False
            if not mid_epoch:
                clock.start_epoch()  # before the hooks: they see step_in_epoch == 0
            self._run_hooks("_before_epoch")
            if mid_epoch:
                assert self._epoch_rng is not None
                now_rng = _rng_state()
                _set_rng_state(self._epoch_rng)
                it = iter(self.train_data)
                skip = clock.step_in_epoch * self.grad_accum
                if skip:
                    next(itertools.islice(it, skip - 1, skip), None)
                _set_rng_state(now_rng)
            else:
                self._epoch_open = True
                self._dispatch("epoch_start")
                self._epoch_rng = _rng_state()
                it = iter(self.train_data)
            finished = (self._plain_steps(it, max_steps) if self._is_plain()
                        else self._steps(it, max_steps))
            if not finished:
                return  # max_steps reached mid-epoch: no epoch_end for a partial epoch
            clock.end_epoch()
            self._epoch_open = False
            self._run_hooks("_after_epoch")
            self._run_hooks("_trigger_epoch")
            self._publish_loss()
            self.table.epoch_end(self._runner("epoch_end"))
            self._after_event("epoch_end")
            self.metrics.flush()

    def _is_plain(self) -> bool:
        """Whether the common case's shorter loop applies (it does the same, minus options)."""
        hooks = self._hooks
        return (self.grad_accum == 1 and self.scaler is None and self.precision == "fp32"
                and self.device.type == "cpu" and self.grad_clip is None
                and not self.table.needs_batch_end and not hooks["_before_step"]
                and not hooks["_after_step"] and not hooks["_trigger_step"])

    def _plain_steps(self, it: Iterator[Any], max_steps: float) -> bool:
        """``_steps`` for one micro-batch per step on the CPU in fp32 with no per-step hooks.

        Every line of Python here costs on each step, so the options the common case
        does not use are left out rather than tested; ``_steps`` is the reference.

        With ``loss_fn`` nothing but the model and the loss runs inside a step, so the
        clock's counters are kept in local variables and the clock is caught up only at
        ``limit`` (the first step at which a callback may fire, training ends or the kept
        losses are summed) and when the loop ends: a quiet step costs one comparison.
        A ``step_fn`` is user code that may read the clock, so it is caught up every step.
        """
        clock, table, model, opt, step_fn = (self.clock, self.table, self.model,
                                             self.optimizer, self.step_fn)
        run_step_end = self._runner("step_end")
        losses = self._losses
        tensor = torch.Tensor
        # With `loss_fn`, call it inline: the default step's frame and dict cost per step.
        loss_fn = self.loss_fn if step_fn == self._default_step else None
        every_step = loss_fn is None
        loss: Any  # torch.Tensor; its backward() is untyped in torch's stubs
        inputs: Any = None
        step, sample, token = clock.step, clock.sample, clock.token
        prev_sample, prev_token = sample, token
        time: int | None = None
        prev_time: int | None = None
        catch_up, perf_counter = clock.catch_up, clock.time_source
        limit = 0 if every_step else min(table.step_due, max_steps, step + _FOLD - len(losses))
        try:
            for batch in it:
                if loss_fn is not None and type(batch) in _PLAIN_SEQ and len(batch) == 2:
                    inputs = batch[0]
                    loss = loss_fn(model(inputs), batch[1])
                else:
                    inputs = None
                    out = step_fn(model, batch)
                    # type() first: isinstance() on torch.Tensor goes through a slow metaclass
                    loss = out if type(out) is tensor or isinstance(out, tensor) else out["loss"]
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                # `.data`: the value without autograd, as detach() gives it but cheaper
                losses.append(loss.data)
                prev_sample, prev_token = sample, token
                if type(inputs) is tensor and (shape := inputs.shape):
                    sample += shape[0]
                else:
                    n, n_tokens = count_batch(batch)
                    sample += n
                    token += n_tokens
                step += 1
                prev_time, time = time, perf_counter()
                if step >= limit:
                    catch_up(step, sample=sample, token=token, prev_sample=prev_sample,
                             prev_token=prev_token, prev_time=prev_time, time=time)
                    if len(losses) >= _FOLD:
                        self._fold_losses()
                    if (step >= table.step_due and table.step_end(run_step_end)) \
                            or self._pending_saves:
                        self._after_event("step_end")
                    if step >= max_steps:
                        return self._epoch_exhausted(it)
                    if not every_step:
                        limit = min(table.step_due, max_steps, step + _FOLD - len(losses))
        finally:  # the clock holds every completed step, however the loop ends
            catch_up(step, sample=sample, token=token, prev_sample=prev_sample,
                     prev_token=prev_token, prev_time=prev_time, time=time)
        return True

    def _epoch_exhausted(self, it: Iterator[Any]) -> bool:
        """At ``max_steps``: whether the epoch's data is used up (then it ends normally).

        For data of unknown length, look one batch ahead; training ends either way.
        """
        n = self.steps_in_epoch
        if n is not None:
            return self.clock.step_in_epoch >= n
        return next(it, _END) is _END

    def _steps(self, it: Iterator[Any], max_steps: float) -> bool:  # noqa: PLR0915 - one hot loop, locals stay fast
        """Run the steps of one epoch; ``False`` when ``max_steps`` ended it early."""
        clock, table, model, opt = self.clock, self.table, self.model, self.optimizer
        accum, scaler, step_fn = self.grad_accum, self.scaler, self.step_fn
        on_device = self.device.type != "cpu"
        device = self.device
        batch_end = table.needs_batch_end
        run_step_end = self._runner("step_end")
        losses = self._losses
        before, after, trig = (self._hooks["_before_step"], self._hooks["_after_step"],
                               self._hooks["_trigger_step"])
        autocast = self.precision != "fp32"
        while True:
            batch = next(it, _END)
            if batch is _END:
                return True
            if before:  # only once the step is known to happen
                self._run_hooks("_before_step", clock.step + 1)
            k = 0
            loss_sum: torch.Tensor | None = None
            out: Any = None
            while True:
                if on_device:
                    batch = to_device(batch, device)
                if autocast:
                    with self.autocast():
                        out = step_fn(model, batch)
                else:
                    out = step_fn(model, batch)
                loss = out if isinstance(out, torch.Tensor) else out["loss"]
                back = loss / accum if accum > 1 else loss
                if scaler is not None:
                    scaler.scale(back).backward()
                else:
                    back.backward()
                k += 1
                detached = loss.detach()
                loss_sum = detached if loss_sum is None else loss_sum + detached
                if (type(batch) in _PLAIN_SEQ and isinstance(b0 := batch[0], torch.Tensor)  # type: ignore[index]
                        and b0.dim()):
                    # fast path of count_batch for (inputs, targets); shape[0] is far
                    # cheaper than len() on a tensor
                    clock.end_batch(b0.shape[0])
                else:
                    clock.end_batch(*count_batch(batch))
                if batch_end:
                    table.batch_end(self._runner("batch_end"))
                    self._after_event("batch_end")
                if k == accum:
                    break
                batch = next(it, _END)
                if batch is _END:
                    break
            if k < accum:  # a partial accumulation at the epoch's end still steps
                for p in model.parameters():
                    if p.grad is not None:
                        p.grad.mul_(accum / k)
            if self.grad_clip is not None:
                if scaler is not None:
                    scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), self.grad_clip)
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)
            assert loss_sum is not None
            step_loss = loss_sum / k if k > 1 else loss_sum
            losses.append(step_loss)
            if len(losses) >= _FOLD:
                self._fold_losses()
            clock.end_step()
            if after:
                detached_out = ({k2: v.detach() if isinstance(v, torch.Tensor) else v
                                 for k2, v in out.items()} if isinstance(out, Mapping) else {})
                self._run_hooks("_after_step", clock.step, StepOutputs(step_loss, detached_out))
            if trig:
                self._run_hooks("_trigger_step")
            # Inline due check: on a step where nothing can fire this is the whole cost.
            if (clock.step >= table.step_due and table.step_end(run_step_end)) \
                    or self._pending_saves:
                self._after_event("step_end")
            if clock.step >= max_steps:
                return self._epoch_exhausted(it)
