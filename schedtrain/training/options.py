"""A run's options, checked once: each bad one is refused with its name and what was wrong.

``Options`` is built from ``Trainer(...)``'s arguments (which ``[run]`` in a TOML spec
fills) and carried whole to the parts that need it; nothing re-checks it later.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import attrs
import torch

from schedtrain.checkpoints.background import BUSY_RULES, MODES
from schedtrain.checkpoints.staging import STAGING
from schedtrain.distributed.comm import check_reduce
from schedtrain.spec.deadlines import DEFAULT_SIGNALS, check_deadline, check_signals
from schedtrain.urls import is_url, url_problem

__all__ = ["PRECISIONS", "Options", "StepFn"]

PRECISIONS: Final = ("fp32", "bf16", "fp16")

StepFn = Callable[[torch.nn.Module, Any], "torch.Tensor | Mapping[str, Any]"]


def _positive(name: str, value: int | None, *, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a whole number >= 1"
                         f"{' or None' if allow_none else ''}, got {value!r}")


def _export(export: object, strategy: object) -> tuple[str, ...]:
    """The checked ``export`` formats."""
    from schedtrain.checkpoints.export import EXPORT_FORMATS

    if isinstance(export, str) or not isinstance(export, Iterable):
        raise ValueError(f"`export` must be a list of formats ({list(EXPORT_FORMATS)}), got "
                         f"{export!r}")
    formats = tuple(export)
    for fmt in formats:
        if fmt not in EXPORT_FORMATS:
            raise ValueError(f"`export` holds {fmt!r}; expected formats from "
                             f"{list(EXPORT_FORMATS)}")
    if formats and strategy == "fsdp":
        raise ValueError("`export` is not available with strategy='fsdp' (FSDP2): the "
                         "weights are sharded; convert a checkpoint after training")
    return tuple(dict.fromkeys(formats))


@attrs.frozen
class Options:
    """The checked options of a run (``Trainer``'s arguments of the same names)."""

    max_epochs: int | None
    max_steps: int | None
    precision: str
    grad_accum: int
    grad_clip: float | None
    device: torch.device
    seed: int = 0
    run_dir: Path | None = None
    overwrite: bool = False
    strategy: str = "auto"
    shard_data: bool = True
    reduce: Mapping[str, str] = attrs.field(factory=dict)
    keep_firings: int | None = None
    handle_signals: bool = True
    log_events: bool = True
    sanity_eval_batches: int = 0
    checkpoint_dir: str | Path | None = None
    storage_options: Mapping[str, Any] = attrs.field(factory=dict)
    checkpoint_mode: str = "async"
    checkpoint_busy: str = "wait"
    checkpoint_staging: str = "reuse"
    checkpoint_write_share: float | None = None
    export: tuple[str, ...] = ()
    deadline: str | None = None
    preempt_signals: tuple[str, ...] = DEFAULT_SIGNALS
    schedule_change: str = "refuse"

    @classmethod
    def check(cls, *, loss_fn: object, step_fn: object, max_epochs: int | None,
              max_steps: int | None, precision: str, grad_accum: int,
              grad_clip: float | None, device: str | torch.device = "cpu",
              reduce: Mapping[str, str] | None = None, run_dir: str | Path | None = None,
              **rest: Any) -> Options:
        """Refuse a bad combination with the argument's name (``TypeError``/``ValueError``);
        ``rest`` are the other fields, taken as given."""
        if (loss_fn is None) == (step_fn is None):
            raise TypeError("give exactly one of `loss_fn` and `step_fn`")
        if max_epochs is None and max_steps is None:
            raise ValueError("give `max_epochs` or `max_steps` (or both): training must end")
        _positive("max_epochs", max_epochs, allow_none=True)
        _positive("max_steps", max_steps, allow_none=True)
        _positive("grad_accum", grad_accum, allow_none=False)
        if precision not in PRECISIONS:
            raise ValueError(f"`precision` must be one of {PRECISIONS}, got {precision!r}")
        if grad_clip is not None and not grad_clip > 0:
            raise ValueError(f"`grad_clip` must be > 0 or None, got {grad_clip!r}")
        check_reduce(reduce or {})
        for key, why in (("deadline", rest.get("deadline") is not None
                          and check_deadline(rest["deadline"])),
                         ("preempt_signals", check_signals(list(rest.get(
                             "preempt_signals", DEFAULT_SIGNALS))))):
            if why:
                raise ValueError(f"`{key}`: {why}")
        rest["export"] = _export(rest.get("export", ()), rest.get("strategy", "auto"))
        sanity = rest.get("sanity_eval_batches", 0)
        if isinstance(sanity, bool) or not isinstance(sanity, int) or sanity < 0:
            raise ValueError(f"`sanity_eval_batches` must be a whole number >= 0, got "
                             f"{sanity!r}")
        _check_storage(rest.get("checkpoint_dir"), rest.get("storage_options"), run_dir)
        share = rest.get("checkpoint_write_share")
        if share is not None and (isinstance(share, bool) or not isinstance(share, int | float)
                                  or not 0 < share <= 1):
            raise ValueError(f"`checkpoint_write_share` must be a number > 0 and <= 1 (or "
                             f"None: decided by the device), got {share!r}")
        for name, allowed in (("checkpoint_mode", MODES), ("checkpoint_busy", BUSY_RULES),
                              ("checkpoint_staging", STAGING),
                              ("schedule_change", ("refuse", "apply"))):
            if name in rest and rest[name] not in allowed:
                raise ValueError(f"`{name}` must be one of {allowed}, got {rest[name]!r}")
        return cls(max_epochs, max_steps, precision, grad_accum, grad_clip,
                   cls.resolve_device(device), reduce=dict(reduce or {}),
                   run_dir=Path(run_dir) if run_dir is not None else None, **rest)

    def ended(self, step: int, epoch: int) -> bool:
        """Whether a clock at ``step``, ``epoch`` has reached ``max_epochs`` or ``max_steps``."""
        return ((self.max_epochs is not None and epoch >= self.max_epochs)
                or (self.max_steps is not None and step >= self.max_steps))

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The autocast context of the precision (a no-op for fp32)."""
        if self.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    @staticmethod
    def resolve_device(device: str | torch.device) -> torch.device:
        """``"auto"`` is CUDA when present, else the CPU."""
        if isinstance(device, torch.device):
            return device
        if device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            return torch.device(device)
        except RuntimeError:
            raise ValueError(f"`device` must be 'auto', 'cpu', 'cuda' or 'cuda:N', got "
                             f"{device!r}") from None


def _check_storage(checkpoint_dir: object, options: object, run_dir: object) -> None:
    """``checkpoint_dir`` (a path or a URL) stands for ``RUN_DIR/checkpoints``: it needs
    a run directory; ``storage_options`` go with a URL only."""
    if checkpoint_dir is None:
        if options:
            raise ValueError("`storage_options` apply to a URL `checkpoint_dir`; none given")
        return
    if not isinstance(checkpoint_dir, str | Path) or not str(checkpoint_dir):
        raise ValueError(f"`checkpoint_dir` must be a path or a URL, got {checkpoint_dir!r}")
    if run_dir is None:
        raise ValueError("`checkpoint_dir` needs a `run_dir` (which holds run.json and the "
                         "log); give Trainer(run_dir=...)")
    problem = url_problem(checkpoint_dir) if isinstance(checkpoint_dir, str) else None
    # memory:// serves a Python process that resumes itself (a test); a spec refuses it.
    if problem is not None and not str(checkpoint_dir).lower().startswith("memory://"):
        raise ValueError(f"`checkpoint_dir`: {problem}")
    if options and not is_url(checkpoint_dir):
        raise ValueError(f"`storage_options` apply to a URL `checkpoint_dir`, not the path "
                         f"{str(checkpoint_dir)!r}")
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise ValueError(f"`storage_options` must be a table of named options, got "
                         f"{options!r:.80}")
