"""What a checkpoint file is: its format tag, plain data only, and its checksum.

A checkpoint is one ``torch.save`` file holding only plain values and tensors, so it
loads with ``torch.load(path, weights_only=True)`` and in plain PyTorch (docs/
checkpoints.md lists its keys). It carries a checksum of its content, checked on load:
a file with flipped bytes is reported by name, never loaded silently.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import torch

from schedtrain import nesting
from schedtrain.checkpoints.pacing import pause, update_in_pieces
from schedtrain.errors import Error, RunDirError
from schedtrain.files import UnsafeFile, open_regular
from schedtrain.urls import is_url, redact_text

__all__ = ["ALGORITHM", "FORMAT", "STATE_FILE", "CheckpointError", "DamagedCheckpoint",
           "UnfitCheckpoint", "UnresumableCheckpoint", "check_plain", "check_shape", "digest",
           "file_digests", "is_finite"]

FORMAT: Final = "schedtrain-checkpoint-2"
#: The checksum's algorithm (``checksum = {"algorithm": ALGORITHM, "digest": hex}``).
ALGORITHM: Final = "blake2b-256"
#: The run's state inside a sharded checkpoint directory.
STATE_FILE: Final = "run.pt"
_PLAIN: Final = (*nesting.PLAIN, torch.dtype, torch.device, torch.Tensor, torch.Size)


class CheckpointError(Error):
    """A checkpoint that cannot be written or used; ``path`` and ``reason`` say which and why."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(redact_text(f"checkpoint {str(path)!r}: {reason}"))
        #: the file, or its URL as given (``Path`` would fold ``s3://b/k`` into ``s3:/b/k``)
        self.path: Path | str = path if is_url(str(path)) else Path(path)
        self.reason = reason


class DamagedCheckpoint(CheckpointError, RunDirError, ValueError):
    """A checkpoint that loads (its checksum may be valid: a crafted file can carry one)
    but whose run state a resume cannot trust: a key missing, or a field of the wrong
    type or out of bounds. ``--resume auto`` passes it over; ``--resume PATH`` ends with
    it in one line (exit 2, as any run directory that cannot be used). A ``ValueError``
    too, as such a refusal was before."""


class UnfitCheckpoint(CheckpointError, RunDirError, ValueError):
    """A checkpoint this run cannot continue: saved with other callbacks, or inside an
    epoch on another number of processes with data that cannot be re-divided. One line,
    exit 2 (a ``ValueError`` too, as it was)."""


class UnresumableCheckpoint(CheckpointError, RunDirError, ValueError):
    """A checkpoint ``--resume`` names that is not there, or a URL that is not one of this
    run's own ``checkpoint_dir``: refused before the run directory or the folder is
    touched, in one line (exit 2: bad input, not a failure of the run)."""


#: The keys a checkpoint's readers index, with what each holds: a file with a valid
#: checksum may still lack one (crafted, or written by hand), and is refused by name.
_TOP: Final[dict[str, tuple[type, ...]]] = {
    "phase": (str,), "step": (int,), "epoch": (int,), "run": (dict,)}
_RUN: Final[dict[str, tuple[type, ...]]] = {
    "clock": (dict,), "table": (dict,), "callbacks": (dict,), "metrics": (dict,),
    "losses": (dict,), "epoch_open": (bool,), "written": (list,)}


def check_shape(state: Mapping[str, Any], shown: str | Path) -> None:
    """Refuse a checkpoint without a key its readers need, naming the key path."""
    for where, table, part in (("", _TOP, state), ("run.", _RUN, state.get("run"))):
        if not isinstance(part, Mapping):
            return  # the top-level table already named ``run``
        for key, types in table.items():
            value = part.get(key)
            if not isinstance(value, types) or (types == (int,) and isinstance(value, bool)):
                found = "it is missing" if key not in part else (
                    f"found {type(value).__name__}")
                raise CheckpointError(
                    shown, f"key {where}{key} should be a {types[0].__name__} ({found}): "
                           "it is damaged or not written by schedtrain")


def check_plain(value: Any, where: str) -> None:
    """Refuse what ``torch.load(weights_only=True)`` could not read back, saying where."""
    nesting.check_plain(value, where, plain=_PLAIN, holds="a state_dict holds numbers, "
                        "strings, lists, dicts and tensors")


def _feed(h: Any, value: Any) -> None:
    """Hash a state tree deterministically: structure, keys, values and tensor bytes."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            # The tensor's own memory, without a copy (hashlib reads any buffer), in pieces
            # a paced background write pauses between.
            update_in_pieces(h, t.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(value, dict):
        h.update(b"{")
        for k, v in value.items():
            _feed(h, k)
            _feed(h, v)
        h.update(b"}")
    elif isinstance(value, list | tuple):
        h.update(b"[" if isinstance(value, list) else b"(")
        for v in value:
            _feed(h, v)
        h.update(b"]")
    elif isinstance(value, set):
        h.update(b"<")
        for item in sorted(repr(v) for v in value):
            h.update(item.encode())
        h.update(b">")
    else:
        h.update(f"{type(value).__name__}:{value!r};".encode())


def digest(state: Mapping[str, Any]) -> str:
    """The checksum of a checkpoint's content (every key but ``checksum``)."""
    h = hashlib.blake2b(digest_size=32)
    _feed(h, {k: v for k, v in state.items() if k != "checksum"})
    return h.hexdigest()


def is_finite(model_state: Mapping[str, Any], loss: torch.Tensor | None) -> bool:
    """Whether every floating tensor of the weights, and the loss, is finite (of a
    sharded tensor, this rank's shard)."""
    tensors = [t.to_local() if hasattr(t, "to_local") else t for t in model_state.values()
               if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if loss is not None:
        tensors.append(loss)
    for t in tensors:
        if not bool(torch.isfinite(t).all()):
            return False
        pause()
    return True


def file_digests(folder: Path, names: list[str] | None = None) -> dict[str, str]:
    """blake2b-256 of each file in ``folder`` (``names``, or every file but ``run.pt``);
    a missing one is left out."""
    if names is None:
        names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != STATE_FILE)
    out = {}
    for name in names:
        h = hashlib.blake2b(digest_size=32)
        try:
            with open_regular(folder / name) as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
        except (FileNotFoundError, UnsafeFile):
            continue
        out[name] = h.hexdigest()
    return out
